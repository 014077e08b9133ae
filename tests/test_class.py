"""`kvlib course autograde` on a synthetic class of notebook 01 (kvlib/app/class_bench.py makes it):
every score the expected one, the same after SIGKILLs at several points of plain and --force runs and a
rerun (which finishes exactly what was left), a second run at once on SQLite refused, a hostile
submission stopped at its time budget, the course moved onto PostgreSQL and graded there by two runs at
once, each submission once; and the clear errors of bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, on_a_terminal, shown_progress

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


def _course(path: Path) -> Path:
    """A course folder with notebook 01 released and the class handed in (tight kernel limits: scores never wait on it)."""
    from kvlib.app.class_bench import hand_in, make_class  # noqa: PLC0415
    from kvlib.app.course_folder import init_course  # noqa: PLC0415

    init_course(path, course_id="kvlib-test")
    with open(path / "nbgrader_config.py", "a") as f:
        f.write("\nc.Execute.timeout = 10\nc.SandboxExecute.notebook_timeout = 30\n")
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


def _records(course: Path, db_url: str | None = None):
    from kvlib.app.grading_record import read_records  # noqa: PLC0415

    return read_records(db_url or f"sqlite:///{course / 'gradebook.db'}", "kvlib-test", NB)


def _autograde(course: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "kvlib", "course", "autograde", NB, "--quiet", *args],
        cwd=course, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _kill_when(proc: subprocess.Popen, course: Path, ready) -> list[int]:
    """SIGKILL the autograde proc once ready(its record's rows) holds; returns its workers' pids, checked dead."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None and not ready(_records(course)):
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before it could be killed where the test wants"
    workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for pid in workers:  # the workers die with their parent (and take their kernels and checkers along)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                break
            time.sleep(0.2)
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"worker {pid} outlived the killed autograde"
    return workers


def _graded(rows) -> int:
    return sum(r.status == "graded" for r in rows.values())


@pytest.mark.slow
def test_killed_runs_resume_exactly_what_is_left(fresh, tmp_path):
    """Check autograde killed with SIGKILL at several points: a run after two students (a second run meanwhile is
    refused: SQLite takes one grader at a time), a --force run once it has marked everyone in flight and before any
    result, another after one result while its other worker grades, a resumed run after two more; then one more run
    grades exactly the students left in flight, every score is the one an uninterrupted run gives
    (class_bench.expected), every autograded notebook is whole (the checks' verdict in every graded cell), the run's log has
    each notebook's line of isolated checks and no SQLAlchemy warning, and no temporary folder of a killed worker is
    left."""
    import tempfile  # noqa: PLC0415

    from kvlib.grading import scratch  # noqa: PLC0415

    course = tmp_path / "killed"
    shutil.copytree(fresh, course, symlinks=True)
    first = _autograde(course, "--jobs", "1")
    deadline = time.monotonic() + 600
    while _graded(_records(course)) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    second = kvlib("course", "autograde", NB, "--quiet", cwd=course, check=False)
    assert second.returncode == 2 and "SQLite is not safe for two graders at once" in second.stderr, second.stderr
    killed = _kill_when(first, course, lambda rows: _graded(rows) >= 2)
    killed += _kill_when(
        _autograde(course, "--force", "--jobs", "2"),
        course,
        lambda rows: len(rows) == CLASS and all(r.status == "in-flight" for r in rows.values()),
    )
    assert len(_records(course)) == CLASS and _graded(_records(course)) == 0  # a forced regrade is in flight at once
    before = {s: r.holder for s, r in _records(course).items()}
    mid = _kill_when(_autograde(course, "--force", "--jobs", "2"), course, lambda rows: _graded(rows) >= 1)
    killed += mid
    tmp = Path(tempfile.gettempdir())
    left_folders = [
        p for p in tmp.glob(f"{scratch.PREFIX}*") if any(p.name.startswith(f"{scratch.PREFIX}{w}-") for w in mid)
    ]
    assert left_folders, "the killed workers left no temporary folder: nothing for the next run to remove"
    assert {s: r.holder for s, r in _records(course).items()} != before
    killed += _kill_when(_autograde(course, "--jobs", "2"), course, lambda rows: _graded(rows) >= 3)
    left = sorted(s for s, r in _records(course).items() if r.status == "in-flight")
    assert 0 < len(left) < CLASS, left
    again = kvlib("course", "autograde", NB, "--jobs", "2", "--quiet", cwd=course)
    assert "isolation: " in again.stderr.splitlines()[0]
    assert f"{CLASS - len(left)} of {CLASS} already graded" in again.stderr, again.stderr[-2000:]
    assert f"{len(left)} left in flight by a run that ended before finishing them" in again.stderr
    summary = f"{CLASS} graded, 0 refused, 0 failed ({len(left)} graded in this run of {len(left)} taken"
    assert summary in again.stderr, again.stderr[-2000:]
    assert "graded without refused files: s006: kvlib/attention.py" in again.stderr  # the link to the reference
    assert scores(course) == expected()
    for student in expected():
        nb = json.loads((course / "autograded" / student / NB / "attention.ipynb").read_text())
        graded = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
        verdicts = [json.dumps(c.get("outputs", [])) for c in graded]  # the isolated checks' (preprocessor._outputs)
        assert graded and all("passed: " in v or "(isolated checks of " in v for v in verdicts), (student, verdicts)
    log = (course / ".kvlib-autograde" / f"{NB}.log").read_text()
    for student in left:
        assert re.search(rf"isolated checks of {student}/{NB}/attention: \d+ of \d+ passed in", log), student
    assert "SAWarning" not in log
    assert not [
        p for p in tmp.glob(f"{scratch.PREFIX}*") if any(p.name.startswith(f"{scratch.PREFIX}{w}-") for w in killed)
    ]


@pytest.mark.slow
def test_refused_failed_and_over_budget_submissions_are_summarised_and_the_bar_names_the_slowest(fresh, tmp_path):
    """Check a run with its progress bar (done/total, failures, the time left, the submission in flight longest) on a
    student whose timestamp.txt is a link (not graded: refused), one whose notebook is not a notebook (grading breaks:
    failed) and one whose notebook stalls (stopped at --budget: failed), the summary saying why for each."""
    course = tmp_path / "course"
    shutil.copytree(fresh, course, symlinks=True)
    stamp = course / "submitted" / "s001" / NB / "timestamp.txt"
    stamp.unlink()
    stamp.symlink_to(course / "grading_secret")
    (course / "submitted" / "s002" / NB / "attention.ipynb").write_text("{ not json", encoding="utf-8")
    stalling = course / "submitted" / "s003" / NB / "attention.ipynb"
    nb = json.loads(stalling.read_text(encoding="utf-8"))
    nb["cells"].append({"cell_type": "code", "metadata": {}, "source": "import time\ntime.sleep(600)\n", "outputs": [],
                        "execution_count": None})  # fmt: skip
    stalling.write_text(json.dumps(nb), encoding="utf-8")
    budget = 8  # the stalling cell alone runs to the cell timeout, 10 s; the other two take a second or two
    out = kvlib("course", "autograde", NB, "--student", "s00[123]", "--budget", str(budget), cwd=course, check=False)
    assert out.returncode == 1, f"a run with a failed submission should exit 1: {out.returncode}\n{out.stderr[-3000:]}"
    assert "0 graded, 1 refused, 2 failed" in out.stderr, out.stderr[-3000:]
    assert "refused: s001: s001/01-attention: timestamp.txt in the submission is a symbolic link" in out.stderr
    assert "failed: s002: nbformat.reader.NotJSONError: Notebook does not appear to be JSON" in out.stderr, out.stderr
    assert f"failed: s003: grading took longer than the budget of {budget} s (--budget)" in out.stderr, out.stderr
    assert "(0 graded in this run of 3 taken" in out.stderr
    bar = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if ln.startswith(f"{NB}:") and "|" in ln]
    assert bar and "3/3" in bar[-1] and "failed=3" in bar[-1] and "<" in bar[-1], bar  # tqdm: [elapsed<left]
    assert any(re.search(r"slowest=s003 [5-9]s", ln) for ln in bar), bar


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
def test_a_course_moved_to_postgres_is_graded_by_two_runs_at_once_each_submission_once(fresh, tmp_path):
    """Check a course graded in part on SQLite, moved onto a throwaway PostgreSQL server (`kvlib course
    move-gradebook`), one submission then taken out of the gradebook (the record says graded, the gradebook does
    not: it is graded again), and two `kvlib course autograde` runs at once on every student, one in the course folder
    and one in a copy of it (two hosts): each submission still to grade is graded by exactly one of them, none lost,
    none doubled, every score the expected one."""
    import importlib.util  # noqa: PLC0415

    from nbgrader.api import Gradebook  # noqa: PLC0415

    from kvlib.app.class_bench import _pg_bin, throwaway_postgres  # noqa: PLC0415

    _need(shutil.which("runuser") is not None or os.geteuid() != 0, "needs runuser to start PostgreSQL as root")
    _need(importlib.util.find_spec("psycopg2") is not None, "needs psycopg2 (pip install -e '.[dev]')")
    try:
        _pg_bin()
    except FileNotFoundError as err:
        _need(False, str(err))
    course = tmp_path / "course"
    shutil.copytree(fresh, course, symlinks=True)
    kvlib("course", "autograde", NB, "--student", "s00[01]", "--quiet", cwd=course)
    on_sqlite = {s: r.holder for s, r in _records(course).items()}
    with throwaway_postgres() as url:
        moved = kvlib("course", "move-gradebook", url, cwd=course)
        assert "moved " in moved.stderr and "2 submissions" in moved.stderr, moved.stderr
        assert f"c.CourseDirectory.db_url = {url!r}" in (course / "nbgrader_config.py").read_text()
        assert scores(course, url) == {s: v for s, v in expected().items() if s in ("s000", "s001")}
        with Gradebook(url, "kvlib-test") as gb:
            gb.remove_submission(NB, "s001")  # graded in kvlib's record, gone from the gradebook
        copy = tmp_path / "host1" / "course"
        shutil.copytree(course, copy, symlinks=True)
        env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
        runs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kvlib",
                    "course",
                    "autograde",
                    NB,
                    "--jobs",
                    "1",
                    "--course",
                    str(folder),
                    "--quiet",
                ],
                cwd=folder.parent,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
            for folder in (course, copy)
        ]
        logs = [r.communicate(timeout=1500)[0] for r in runs]
        assert [r.returncode for r in runs] == [0, 0], logs
        got = scores(course, url)
        with Gradebook(url, "kvlib-test") as gb:
            grades = [(g.notebook.assignment.student.id, g.name) for g in gb.db.query(_grade_class()).all()]
            cells = len([c for c in gb.find_notebook("attention", NB).grade_cells])
        records = _records(course, url)
    assert got == expected()
    assert len(grades) == len(set(grades)) == CLASS * cells  # one grade per student and cell: none lost, none doubled
    assert records["s000"].holder == on_sqlite["s000"]  # graded before the move: kept
    assert records["s001"].holder != on_sqlite["s001"]  # graded in the record alone: graded again
    now = [int(re.search(r"\((\d+) graded in this run", log).group(1)) for log in logs]
    assert sum(now) == CLASS - 1 and all(now), (now, logs)  # each graded once, by one run or the other; both worked
    assert {r.status for r in records.values()} == {"graded"} and len(records) == CLASS


@pytest.mark.slow  # a PostgreSQL server and a process killed: seconds
def test_a_killed_runs_students_are_taken_over_and_a_live_runs_are_left(tmp_path):
    """Check kvlib's grading record on PostgreSQL without grading anything: a run (another process) that claimed
    students is alive while its lease is held, so a second run takes none of them; killed with SIGKILL, its lease is
    gone with its connection and the second run takes them over; and on SQLite a second run is refused while the
    first holds the gradebook."""
    import importlib.util  # noqa: PLC0415

    from kvlib.app.class_bench import _pg_bin, throwaway_postgres  # noqa: PLC0415
    from kvlib.app.grading_record import GradebookBusy, GradingRecord  # noqa: PLC0415

    _need(importlib.util.find_spec("psycopg2") is not None, "needs psycopg2 (pip install -e '.[dev]')")
    try:
        _pg_bin()
    except FileNotFoundError as err:
        _need(False, str(err))
    holder = (
        "import sys, time\nfrom kvlib.app.grading_record import GradingRecord\n"
        "r = GradingRecord(sys.argv[1], 'c', NB).__enter__()\n"
        "print(r.claim({'s1': 't1', 's2': 't1'}, current=None)[0], flush=True)\ntime.sleep(600)\n"
    ).replace("NB", repr(NB))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with throwaway_postgres() as url:
        proc = subprocess.Popen([sys.executable, "-c", holder, url], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout.readline().strip() == "['s1', 's2']"
            with GradingRecord(url, "c", NB) as second:
                assert second.claim({"s1": "t1", "s3": "t1"}, current=None)[0] == ["s3"]  # s1 is the live run's
                proc.kill()
                proc.wait()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and second.alive(second.rows()["s1"]):
                    time.sleep(0.2)  # the server notices the dropped connection
                assert second.claim({"s1": "t1", "s2": "t1"}, current=None)[0] == ["s1", "s2"]
        finally:
            proc.kill()
            proc.wait()
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with GradingRecord(db, "c", NB):
        with pytest.raises(GradebookBusy, match="SQLite is not safe for two graders at once"):
            GradingRecord(db, "c", NB).__enter__()


def _grade_class():
    from nbgrader.api import Grade  # noqa: PLC0415

    return Grade


@pytest.mark.slow  # each run loads nbgrader: seconds apiece
def test_bad_input_gets_a_clear_error(tmp_path):
    """Check the errors: not a course folder, a budget of no time, no kvlib grader, an assignment never released (with
    the warning of a course folder open to others first), a gradebook that does not connect."""
    from kvlib.app.course_folder import init_course  # noqa: PLC0415

    bare = tmp_path / "bare"
    bare.mkdir()
    out = kvlib("course", "autograde", NB, cwd=bare, check=False)
    assert out.returncode == 2 and "is not a course folder" in out.stderr
    out = kvlib("course", "autograde", NB, "--budget", "0", cwd=bare, check=False)
    assert out.returncode == 2 and "--budget must be a positive number of seconds, not 0" in out.stderr
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
    test cells restored; every score as expected, nobody lost; the record's fields; and on a terminal, each round's
    progress bar counting its submissions."""
    from kvlib.app import class_bench

    monkeypatch.setattr(class_bench, "_MIX", ["correct", "resubmit", "link-to-reference", "partial", "edited-tests"])
    with on_a_terminal() as term:
        r = class_bench.bench_class(students=5, assignment=NB, jobs=2)
    assert shown_progress(term.getvalue(), NB), term.getvalue()[-500:]
    assert r["all_scores_expected"] and r["wrong"] == {} and r["handed_in"] == "through nbgrader's exchange"
    assert [(x["round"], x["graded"]) for x in r["rounds"]] == [(1, 5), (2, 1)]
    assert len(r["rounds"][0]["worker_startup_s"]) == 2 and r["rounds"][0]["per_minute"] > 0
    assert "handed in through nbgrader's exchange" in class_bench.format_class(r)
    with pytest.raises(ValueError, match="--via"):
        class_bench.bench_class(students=1, via="zip")
