"""kvlib/core/progress.py: progress bars on stderr, shown on a terminal only, and never inside quiet()."""

import io
import sys

from conftest import on_a_terminal, shown_progress

from kvlib.core import progress


def test_bar_shows_what_runs_and_how_far_on_a_terminal_only(monkeypatch):
    """Check that a bar names what runs and counts to its total on a terminal, and writes nothing where stderr is
    not one (a pipe, a log, a notebook's stream)."""
    with on_a_terminal() as err:
        assert list(progress.bar(range(3), desc="training", unit="step")) == [0, 1, 2]
    assert shown_progress(err.getvalue(), "training") and "0/3" in err.getvalue()
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with progress.bar(desc="training", total=3) as bar:
        bar.update(3)
    assert sys.stderr.getvalue() == ""


def test_quiet_turns_every_bar_off_and_comes_back():
    """Check that inside quiet() no bar shows, even on a terminal, and that the setting before it comes back."""
    with on_a_terminal() as err:
        with progress.quiet():
            assert list(progress.bar(range(3), desc="hidden")) == [0, 1, 2]
            with progress.quiet(False):
                list(progress.bar(range(2), desc="shown"))
        list(progress.bar(range(2), desc="after"))
    text = err.getvalue()
    assert "hidden" not in text and shown_progress(text, "shown") and shown_progress(text, "after")


def test_write_keeps_a_line_whole_beside_a_bar():
    """Check that progress.write prints the line to its file while a bar shows on stderr."""
    out = io.StringIO()
    with on_a_terminal() as err, progress.bar(desc="kvlib present --check", total=2) as bar:
        progress.write("solutions/01-attention/attention.ipynb  12.0 s  ok", file=out)
        bar.update()
    assert out.getvalue() == "solutions/01-attention/attention.ipynb  12.0 s  ok\n"
    assert shown_progress(err.getvalue(), "kvlib present --check")
