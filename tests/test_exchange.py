"""kvlib/app/exchange.py as one account sees it (tests/test_hub.py runs it between real accounts): what
`nbgrader submit` with the students' config puts in inbound/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

NB = "01-attention"


@pytest.mark.slow  # nbgrader's start-up: seconds
def test_a_submission_leaves_out_what_autograde_puts_back(tmp_path):
    """Check that a submission made with the students' config (PrivateSubmit) holds the notebook, the learner's
    kvlib files and a helper module of theirs, but not assets/ nor kvlib's subpackages (autograde copies those from
    the source), with its folders mode 0770."""
    from kvlib.app.course_folder import student_config_text

    exchange, course_id = tmp_path / "exchange", "kvt-unit"
    nb = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    files = {
        "attention.ipynb": nb,
        "kvlib/attention.py": "# mine\n",
        "kvlib/my_helpers.py": "# mine too\n",
        "kvlib/core/model.py": "# the course's\n",
        "kvlib/course/figures/x.py": "# the course's\n",
        "assets/tiny/weights.bin": "0" * 1000,
        "YOUR_FILES.md": "# Your files\n",
    }
    for top in (exchange / course_id / "outbound" / NB, tmp_path / "home" / NB):
        for rel, text in files.items():
            (top / rel).parent.mkdir(parents=True, exist_ok=True)
            (top / rel).write_text(text)
    (exchange / course_id / "inbound").mkdir(mode=0o3733)
    (tmp_path / "home" / ".jupyter").mkdir()
    (tmp_path / "home" / ".jupyter" / "nbgrader_config.py").write_text(student_config_text(str(exchange), course_id))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("JUPYTER_CONFIG_DIR", None)  # the students' config in ~/.jupyter, as the guide puts it
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "submit", NB, "--student=alice"],
        cwd=tmp_path / "home", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sub,) = (exchange / course_id / "inbound").iterdir()
    got = sorted(p.relative_to(sub).as_posix() for p in sub.rglob("*") if p.is_file())
    mine = ["YOUR_FILES.md", "attention.ipynb", "kvlib/attention.py", "kvlib/my_helpers.py"]
    assert got == sorted(mine + ["submission_secret.txt", "timestamp.txt"])  # the last two: nbgrader's own
    assert all(p.stat().st_mode & 0o7777 == 0o770 for p in [sub, *sub.rglob("*")] if p.is_dir())


def test_a_submission_is_timed_by_its_last_change_not_by_its_timestamp(tmp_path):
    """Check that a submission folder is taken as submitted at the latest change time (ctime) of anything in it, which
    `touch` cannot set: an honest one as of its last write, without a warning; one whose timestamp.txt was forged and
    whose files were touched to an hour earlier still as of its last change, with a warning naming both times; and one
    renamed later, as of the rename."""
    from kvlib.app.exchange import last_change, submission_time, utc

    sub = tmp_path / "alice+01-attention+2027-03-01 16:00:00.000000 UTC+abc"
    (sub / "kvlib").mkdir(parents=True)
    (sub / "kvlib" / "attention.py").write_text("# mine\n")
    (sub / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    honest, warning = submission_time(str(sub))
    assert warning == "" and honest == utc(last_change(str(sub)))
    forged = time.time() - 3600
    (sub / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(forged)))
    for p in [sub, *sub.rglob("*")]:
        os.utime(p, (forged, forged))  # touch -d
    assert all(p.stat().st_mtime == forged for p in [sub, *sub.rglob("*")])
    when, warning = submission_time(str(sub))
    assert when >= honest and (when - utc(forged)).total_seconds() > 3000
    assert "claims" in warning and "no student can set" in warning and str(when) in warning, warning
    time.sleep(0.01)
    moved = sub.rename(tmp_path / "alice+01-attention+2027-03-01 15:00:00.000000 UTC+abc")
    assert submission_time(str(moved))[0] > when  # a rename changes the folder: it counts


def test_collect_takes_no_folder_another_account_owns_part_of_or_not_made_by_submit(tmp_path):
    """Check not_collectable: a folder whose files are all its student's, with nbgrader's submission_secret.txt, is
    collected; one with a file of another account's, or without submission_secret.txt (made by hand), is not, with the
    reason."""
    from kvlib.app.exchange import not_collectable

    sub = tmp_path / "sub"
    (sub / "kvlib").mkdir(parents=True)
    (sub / "submission_secret.txt").write_text("x" * 128)
    uid = os.getuid()
    assert not_collectable(str(sub), "alice", uid) == ""
    assert "it was not made by `nbgrader submit`" in not_collectable(str(sub / "kvlib"), "alice", uid)
    assert "in it belong to" in not_collectable(str(sub), "alice", uid + 1)
