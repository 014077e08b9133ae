"""`kvlib course autograde` on a synthetic class of notebook 01 (kvlib/app/class_bench.py makes it):
every score the expected one, the same after a SIGKILL halfway and a rerun, the same with a
PostgreSQL gradebook written by two runs at once; and the clear errors of bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

NB = "01-attention"
CLASS = 8  # correct (twice), partial, blank and four cheats: class_bench._MIX
pytestmark = pytest.mark.timeout(1800)
# CI (.ci/run) sets KVLIB_CLASS_TEST=required: a PostgreSQL server or psycopg2 missing fails the test, never skips it
REQUIRED = os.environ.get("KVLIB_CLASS_TEST") == "required"


def _need(ok: bool, reason: str) -> None:
    if not ok:
        (pytest.fail if REQUIRED else pytest.skip)(reason)


def kvlib(*args, cwd, check=True, timeout=1200):
    env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "kvlib", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _course(path: Path, db_url: str | None = None) -> Path:
    """A course folder with notebook 01 released and the class handed in (tight kernel limits: scores never wait on it)."""
    from kvlib.app.class_bench import hand_in, make_class  # noqa: PLC0415
    from kvlib.app.course_folder import init_course  # noqa: PLC0415

    init_course(path, course_id="kvlib-test")
    with open(path / "nbgrader_config.py", "a") as f:
        f.write("\nc.Execute.timeout = 10\nc.SandboxExecute.notebook_timeout = 30\n")
        if db_url:
            f.write(f"c.CourseDirectory.db_url = {db_url!r}\n")
    env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_assignment", NB, "--log-level=WARN"],
        cwd=path, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for student, variant in make_class(CLASS).items():
        hand_in(path, NB, student, variant, time.time() - 600)
    return path


def scores(course: Path, db_url: str | None = None) -> dict[str, float]:
    from nbgrader.api import Gradebook  # noqa: PLC0415

    with Gradebook(db_url or f"sqlite:///{course / 'gradebook.db'}", "kvlib-test") as gb:
        return {s.student.id: s.score for s in gb.assignment_submissions(NB)}


def expected() -> dict[str, float]:
    from kvlib.app import class_bench  # noqa: PLC0415

    per = class_bench.expected(NB)
    return {s: per[v] for s, v in class_bench.make_class(CLASS).items()}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The class handed in, not yet graded (copy it before grading)."""
    return _course(tmp_path_factory.mktemp("class") / "course")


@pytest.mark.slow
def test_every_score_survives_a_sigkill_halfway(fresh, tmp_path):
    """Check that an autograde killed with SIGKILL after two students, then run again, grades only what
    is left, leaves no worker behind, and gives every student the score an uninterrupted run gives
    (class_bench.expected; whole runs give it in the PostgreSQL test below and in tests/test_hub.py)."""
    killed = tmp_path / "killed"
    shutil.copytree(fresh, killed, symlinks=True)
    env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvlib", "course", "autograde", NB, "--jobs", "1", "--quiet"],
        cwd=killed, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    state = killed / ".kvlib-autograde" / f"{NB}.json"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and len(json.loads(state.read_text())["students"]) >= 2:
            break
        time.sleep(0.5)
    workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    graded_before = len(json.loads(state.read_text())["students"])
    assert 2 <= graded_before < CLASS
    for pid in workers:  # the worker dies with its parent (and takes its kernel and checker along)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                break
            time.sleep(0.2)
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"worker {pid} outlived the killed autograde"
    again = kvlib("course", "autograde", NB, "--jobs", "2", "--quiet", cwd=killed)
    assert "isolation: " in again.stderr.splitlines()[0]
    assert f"{graded_before} of {CLASS} already graded" in again.stderr
    assert f"{CLASS} graded, 0 refused, 0 failed ({CLASS - graded_before} graded in this run" in again.stderr, (
        again.stderr[-2000:]
    )
    assert "graded without refused files: s006: kvlib/attention.py" in again.stderr  # the link to the reference
    assert scores(killed) == expected()

    one = kvlib("course", "autograde", NB, "--student", "s002", "--quiet", cwd=killed)  # already graded: nothing to do
    assert "1 of 1 already graded" in one.stderr
    forced = kvlib("course", "autograde", NB, "--student", "s002", "--force", "--quiet", cwd=killed)
    assert "1 graded in this run" in forced.stderr and scores(killed) == expected()


@pytest.mark.slow
def test_refused_and_failed_submissions_are_summarised_with_their_reasons_and_the_bar_counts_them(fresh, tmp_path):
    """Check a run with its progress bar (done/total, failures, the time left) on a student whose timestamp.txt is a
    link (not graded: refused) and one whose notebook is not a notebook (grading breaks: failed), the summary saying
    why for each."""
    course = tmp_path / "course"
    shutil.copytree(fresh, course, symlinks=True)
    stamp = course / "submitted" / "s001" / NB / "timestamp.txt"
    stamp.unlink()
    stamp.symlink_to(course / "grading_secret")
    (course / "submitted" / "s002" / NB / "attention.ipynb").write_text("{ not json", encoding="utf-8")
    out = kvlib("course", "autograde", NB, "--student", "s00[12]", cwd=course, check=False)
    assert out.returncode == 1, f"a run with a failed submission should exit 1: {out.returncode}\n{out.stderr[-3000:]}"
    assert "0 graded, 1 refused, 1 failed" in out.stderr, out.stderr[-3000:]
    assert "refused: s001: s001/01-attention: timestamp.txt in the submission is a symbolic link" in out.stderr
    assert "failed: s002: nbformat.reader.NotJSONError: Notebook does not appear to be JSON" in out.stderr, out.stderr
    assert "(0 graded in this run of 2 taken" in out.stderr
    bar = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if ln.startswith(f"{NB}:") and "|" in ln]
    assert bar and "2/2" in bar[-1] and "failed=2" in bar[-1] and "<" in bar[-1], bar  # tqdm: [elapsed<left]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return -1


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_two_graders_at_once_on_one_postgres_gradebook(tmp_path):
    """Check that two `kvlib course autograde` runs on disjoint student globs, at once, from separate
    working folders, on one PostgreSQL gradebook, lose no grade and double none."""
    import importlib.util  # noqa: PLC0415

    from kvlib.app.class_bench import _pg_bin, throwaway_postgres  # noqa: PLC0415

    _need(shutil.which("runuser") is not None or os.geteuid() != 0, "needs runuser to start PostgreSQL as root")
    _need(importlib.util.find_spec("psycopg2") is not None, "needs psycopg2 (pip install -e '.[dev]')")
    try:
        _pg_bin()
    except FileNotFoundError as err:
        _need(False, str(err))
    with throwaway_postgres() as url:
        course = _course(tmp_path / "course", url)
        env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
        runs = []
        for i, glob in enumerate(("s00[0-3]", "s00[4-9]")):  # two hosts: their own working folders
            host = tmp_path / f"host{i}"
            host.mkdir()
            runs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "kvlib",
                        "course",
                        "autograde",
                        NB,
                        "--student",
                        glob,
                        "--course",
                        str(course),
                        "--quiet",
                    ],
                    cwd=host,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )  # fmt: skip
            )
        logs = [r.communicate(timeout=1500)[0] for r in runs]
        assert [r.returncode for r in runs] == [0, 0], logs
        got = scores(course, url)
        from nbgrader.api import Gradebook  # noqa: PLC0415

        with Gradebook(url, "kvlib-test") as gb:
            grades = [(g.notebook.assignment.student.id, g.name) for g in gb.db.query(_grade_class()).all()]
            cells = len([c for c in gb.find_notebook("attention", NB).grade_cells])
    assert got == expected()
    assert len(grades) == len(set(grades)) == CLASS * cells  # one grade per student and cell: none lost, none doubled


def _grade_class():
    from nbgrader.api import Grade  # noqa: PLC0415

    return Grade


@pytest.mark.slow  # each run loads nbgrader: seconds apiece
def test_bad_input_gets_a_clear_error(tmp_path):
    """Check the errors: not a course folder, no kvlib grader, an assignment never released (with the warning of a
    course folder open to others first), a gradebook that does not connect."""
    from kvlib.app.course_folder import init_course  # noqa: PLC0415

    bare = tmp_path / "bare"
    bare.mkdir()
    out = kvlib("course", "autograde", NB, cwd=bare, check=False)
    assert out.returncode == 2 and "is not a course folder" in out.stderr
    (bare / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'x'\n")
    out = kvlib("course", "autograde", NB, cwd=bare, check=False)
    assert out.returncode == 2 and "does not configure kvlib's grader" in out.stderr
    course = tmp_path / "course"
    init_course(course, course_id="kvlib-test")
    course.chmod(0o755)  # as a careless chmod leaves it: every run warns first
    out = kvlib("course", "autograde", NB, cwd=course, check=False)
    assert out.returncode == 2 and "was never released" in out.stderr
    assert out.stderr.startswith("isolation: ") and f"warning: {course} is open to other accounts" in out.stderr
    with open(course / "nbgrader_config.py", "a") as f:
        f.write(f"\nc.CourseDirectory.db_url = 'postgresql+psycopg2://nobody@/nowhere?host={tmp_path}/no-socket'\n")
    out = kvlib("course", "autograde", NB, cwd=course, check=False)
    assert out.returncode == 2 and "does not connect" in out.stderr, out.stderr


@pytest.mark.slow
def test_a_glob_that_matches_nobody_and_an_assignment_never_released(fresh):
    """Check the errors in a course with submissions: a glob matching no student, another assignment never released."""
    out = kvlib("course", "autograde", NB, "--student", "zz*", cwd=fresh, check=False)
    assert out.returncode == 2 and "matches none of the 8 students" in out.stderr
    out = kvlib("course", "autograde", "02-generation", cwd=fresh, check=False)
    assert out.returncode == 2 and "never released" in out.stderr


def test_the_guides_grading_figure_is_drawn_from_its_records(tmp_path):
    """Check that docs/class-grading.json holds record_sweep's runs (every class size for jobs 1 and 2, every score as
    expected), that docs/instructors.md shows the figure drawn from them and quotes their rates, time a student,
    speed-up and where the time goes as the records give them, the class of 100 with --jobs 2 in SQLite and in
    PostgreSQL (docs/class-100-postgres.json) among them, and that plot_sweep draws it again from the records and
    refuses records with a wrong score."""
    import re

    from kvlib.app import class_bench

    records = json.loads((ROOT / class_bench.SWEEP).read_text(encoding="utf-8"))
    sizes = {j: sorted(r["students"] for r in records if r["jobs"] == j) for j in (1, 2)}
    assert sizes[1] == sizes[2] and len(sizes[1]) >= 3, sizes
    assert all(r["all_scores_expected"] and r["assignment"] == "04-kv-cache" for r in records)
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    assert "](class-grading.png)" in guide and (ROOT / "docs" / "class-grading.png").is_file()
    for r in records:
        rate = r["rounds"][0]["per_minute"]
        assert re.search(rf"{r['students']} students, --jobs {r['jobs']}: [\d.]+ s, {rate:.1f} a minute", guide), (
            f"docs/instructors.md does not quote the run of {r['students']} students with --jobs {r['jobs']} ({rate}/min)"
        )
    flat = " ".join(guide.split())
    per_student = {j: [r["rounds"][0]["wall_s"] / r["students"] for r in records if r["jobs"] == j] for j in (1, 2)}
    span = {j: f"{min(v):.1f}-{max(v):.1f}" for j, v in per_student.items()}
    assert f"(--jobs 1: {span[1]} s a student; --jobs 2: {span[2]})" in flat, span
    top = max(sizes[1])
    wall = {r["jobs"]: r["rounds"][0]["wall_s"] for r in records if r["students"] == top}
    assert f"{wall[1] / wall[2]:.1f} times as fast as one at {top} students" in flat
    first = [r["rounds"][0] for r in records]  # where the time goes, in the class's round
    for phrase, values in (
        ("nbgrader start-up, {}", [s for x in first for s in x["worker_startup_s"]]),
        ("each submission takes {} in its worker", [x["mean_s_per_submission"] for x in first]),
        ("of which the isolated checks {} (notebook 04", [x["mean_checks_s"] for x in first]),
    ):
        quoted = phrase.format(f"{min(values):.1f}-{max(values):.1f} s")
        assert quoted in flat, f"docs/instructors.md does not say what the records say: {quoted!r}"
    assert 100 in sizes[2], "the goal's class of 100 (with --jobs 2) must be in the kept records"
    pg = json.loads((ROOT / "docs" / "class-100-postgres.json").read_text(encoding="utf-8"))
    assert (pg["students"], pg["jobs"], pg["db"], pg["all_scores_expected"]) == (100, 2, "postgres", True), pg["db"]
    for r in (next(r for r in records if (r["students"], r["jobs"]) == (100, 2)), pg):
        x = r["rounds"][0]
        assert f"{x['wall_s']} s, **{x['per_minute']:.1f} a minute**" in flat, (
            f"the guide does not quote {r['db']}'s 100"
        )
    class_bench.plot_sweep(records, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="every score was as expected"):
        class_bench.plot_sweep([{**records[0], "all_scores_expected": False}], tmp_path / "bad.png")


@pytest.mark.slow
def test_bench_class_hands_in_through_the_exchange(monkeypatch):
    """Check `kvlib bench class`'s synthetic class through nbgrader's exchange (each student's submit, collect
    --update): a resubmission regraded in a second round, a link put into a submission in inbound/ refused (0), edited
    test cells restored; every score as expected, nobody lost; and the record's fields."""
    from kvlib.app import class_bench

    monkeypatch.setattr(class_bench, "_MIX", ["correct", "resubmit", "link-to-reference", "partial", "edited-tests"])
    r = class_bench.bench_class(students=5, assignment=NB, jobs=2)
    assert r["all_scores_expected"] and r["wrong"] == {} and r["handed_in"] == "through nbgrader's exchange"
    assert [(x["round"], x["graded"]) for x in r["rounds"]] == [(1, 5), (2, 1)]
    assert len(r["rounds"][0]["worker_startup_s"]) == 2 and r["rounds"][0]["per_minute"] > 0
    assert "handed in through nbgrader's exchange" in class_bench.format_class(r)
    with pytest.raises(ValueError, match="--via"):
        class_bench.bench_class(students=1, via="zip")
