"""Grading a whole class: `kvlib course autograde`, `kvlib course export-canvas`, `kvlib bench class`.

  autograde(course, assignment, jobs=N)  N worker processes, each one nbgrader start-up (nbgrader's
                                         NbGraderAPI) grading one student at a time through the course's
                                         own nbgrader_config.py (so the isolated grader, screening, jail);
                                         a progress bar naming the submission in flight longest; a time
                                         budget per submission; what is graded, and who grades what, in the
                                         gradebook's own database (grading_record.py): a run killed even by
                                         SIGKILL, a --force regrade too, resumes with exactly what is left,
                                         and runs at once never grade one submission twice
  canvas_csv(course)                     the gradebook as a CSV for Canvas's gradebook import, scores after
                                         nbgrader's late penalty (final_score), as nbgrader's own export
Not here: how one submission is graded (kvlib.grading), the course folder (course_folder.py), the
synthetic class of the benchmark (class_bench.py).
"""

from __future__ import annotations

import csv
import ctypes
import fnmatch
import io
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps.api import NbGraderAPI
from nbgrader.apps.baseapp import NbGrader
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SAWarning
from tqdm import tqdm

from kvlib.app.course_folder import permission_problems
from kvlib.app.grading_record import (
    FAILED,
    GRADED,
    IN_FLIGHT,
    REFUSED,
    GradebookBusy,
    GradingRecord,
    Row,
    move_gradebook,
    parse_time,
)
from kvlib.grading import scratch
from kvlib.grading.execute import GradingJail

STATE_DIR = ".kvlib-autograde"  # in the course folder (private with it): <assignment>.log, the workers' log


class CourseError(Exception):
    """A course folder, assignment, gradebook or student selection that autograde cannot work with."""


@dataclass
class Result:
    student: str
    status: str  # graded, refused (not graded: why) or failed (grading broke: why)
    timestamp: str = ""  # of the submission graded (submitted/<student>/<assignment>/timestamp.txt)
    score: float | None = None
    max_score: float | None = None
    reason: str = ""
    refused_files: list[str] = field(default_factory=list)
    seconds: float = 0.0  # grading this student, in the worker (no start-up)
    checks_s: float = 0.0  # of which the isolated checks (the rest: mostly the kernel's run of the notebook)
    raw_score: float | None = None  # the cells' points before nbgrader's late penalty; score is after it
    late_penalty: float = 0.0
    seconds_late: float = 0.0


def final_score(submission) -> float:
    """A submission's score after its late penalty, as nbgrader's own `nbgrader export` computes it."""
    return max(0.0, float(submission.score) - float(submission.late_submission_penalty or 0.0))


# ---------------------------------------------------------------------------------------------
# The course as nbgrader sees it


@dataclass
class Course:
    root: Path
    course_id: str
    db_url: str
    isolation: str  # the jail's mode for this grader (kvlib.grading.jail.detect_mode)
    owner: tuple[int, int]  # uid, gid of the course folder


def _nbgrader_app(root: Path):
    """nbgrader's own application, configured as `nbgrader` run in the course folder would be."""
    app = NbGrader()
    app.initialize([], root=str(root))
    return app


def open_course(root: Path | str) -> Course:
    """The course folder's settings, checked: raises CourseError naming what is wrong."""
    root = Path(root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise CourseError(
            f"{root} is not a course folder: it has no nbgrader_config.py (make one: kvlib course init {root})"
        )
    cwd = os.getcwd()
    os.chdir(root)  # nbgrader also reads the nbgrader_config.py of the working folder
    try:
        app = _nbgrader_app(root)
    finally:
        os.chdir(cwd)
    steps = [getattr(s, "__name__", str(s)) for s in app.config.Autograde.get("autograde_preprocessors", [])]
    if "IsolatedGrading" not in steps:
        raise CourseError(
            f"{root}/nbgrader_config.py does not configure kvlib's grader (IsolatedGrading in "
            "c.Autograde.autograde_preprocessors): grading there would let a submission fool its own score; "
            f"`kvlib course init {root} --force` writes it (keeping yours as nbgrader_config.py.bak)"
        )
    st = root.stat()
    return Course(
        root=root,
        course_id=app.coursedir.course_id,
        db_url=app.coursedir.db_url,
        isolation=GradingJail(config=app.config).mode,
        owner=(st.st_uid, st.st_gid),
    )


def safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL at all: say so as given
        return url


def check_gradebook(course: Course, assignment: str) -> None:
    """The gradebook connects and knows the assignment, which was released (generate_assignment)."""
    try:
        with Gradebook(course.db_url, course.course_id) as gb:
            known = [a.name for a in gb.assignments]
            try:
                gb.find_assignment(assignment)
            except MissingEntry:
                known_text = ", ".join(sorted(known)) or "none yet"
                raise CourseError(
                    f"assignment {assignment!r} was never released in {course.root}: the gradebook does not know it "
                    f"(released: {known_text}); `nbgrader generate_assignment {assignment}` first"
                ) from None
    except CourseError:
        raise
    except Exception as err:  # sqlalchemy's OperationalError and friends, or a bad URL
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CourseError(
            f"the gradebook {safe_url(course.db_url)} (c.CourseDirectory.db_url) does not connect: {first}"
        ) from err
    if not (course.root / "release" / assignment).is_dir():
        raise CourseError(
            f"assignment {assignment!r} is not in {course.root}/release/: run `nbgrader generate_assignment {assignment}`"
        )


def submitted(course: Course, assignment: str) -> dict[str, str]:
    """{student: timestamp of their collected submission} for every folder in submitted/."""
    out = {}
    top = course.root / "submitted"
    for folder in sorted(top.glob(f"*/{assignment}")) if top.is_dir() else []:
        stamp = folder / "timestamp.txt"
        try:
            out[folder.parent.name] = stamp.read_text().strip() if stamp.is_file() and not stamp.is_symlink() else ""
        except OSError:
            out[folder.parent.name] = ""
    return out


def select(students: dict[str, str], pattern: str, assignment: str) -> dict[str, str]:
    if not students:
        raise CourseError(
            f"nobody has submitted {assignment!r} yet: submitted/*/{assignment} is empty (`nbgrader collect {assignment}`)"
        )
    chosen = {s: t for s, t in students.items() if fnmatch.fnmatchcase(s, pattern)}
    if not chosen:
        some = ", ".join(list(students)[:8]) + (", ..." if len(students) > 8 else "")
        raise CourseError(
            f"--student {pattern!r} matches none of the {len(students)} students who submitted {assignment} ({some})"
        )
    return chosen


# ---------------------------------------------------------------------------------------------
# The workers: one nbgrader start-up each, one student at a time over a pipe


def _kill_descendants(pid: int) -> None:
    """SIGKILL every process below pid (the jailed kernels and checkers start sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    stack, found = [pid], []
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    for child in found:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


_CAUSE = re.compile(
    r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): .+)$", re.MULTILINE
)  # a traceback's last line
_NBGRADER_WRAPPER = (
    "nbgrader.converters.base.NbGraderException"  # "Please see the above traceback": no cause of its own
)


def _grade(api, course: Course, assignment: str, student: str, timestamp: str) -> Result:
    start = time.monotonic()
    out = api.autograde(assignment, student, force=True, create=True)
    log = out.get("log", "") + out.get("error", "")
    refused_files = re.findall(r"Refused [^/\s]+/[^/\s]+/(\S+): ", log)
    result = Result(student=student, status="graded", timestamp=timestamp, refused_files=refused_files)
    if not out.get("success"):
        # refused by the screening (kvlib.grading.autograde: "<student>/<assignment>: ..."); any other PermissionError
        # (an autograded/ folder a root run left, say) is a failure, tried again by the next run
        reason = re.search(rf"PermissionError: ({re.escape(student)}/{re.escape(assignment)}: .+)", log)
        if reason:
            result.status, result.reason = "refused", reason.group(1).strip()
        else:  # the error under nbgrader's "see the above traceback", or else its last line that is not chatter
            causes = [m.group(1) for m in _CAUSE.finditer(log) if not m.group(1).startswith(_NBGRADER_WRAPPER)]
            errors = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith(("[INFO]", "[DEBUG]", " "))]
            result.status = "failed"
            result.reason = (causes[-1] if causes else errors[-1] if errors else "nbgrader failed without a message")[
                :500
            ]
    else:
        with Gradebook(course.db_url, course.course_id) as gb:
            sub = gb.find_submission(assignment, student)
            result.score, result.max_score, result.raw_score = final_score(sub), float(sub.max_score), float(sub.score)
            result.late_penalty = float(sub.late_submission_penalty or 0.0)
            result.seconds_late = float(sub.total_seconds_late or 0.0)
    result.seconds = round(time.monotonic() - start, 2)
    result.checks_s = round(sum(float(x) for x in re.findall(r"isolated checks of .* passed in ([\d.]+) s", log)), 2)
    for line in log.splitlines():  # what the guide promises in the run's log, per notebook, and what went wrong
        if _LOGGED.search(line):
            print(line.strip(), file=sys.stderr)
    return result


# the lines of nbgrader's log a run's log keeps: the isolated checks' sum per notebook, refused files, lateness,
# warnings and errors (not nbgrader's line per copied file)
_LOGGED = re.compile(
    r"isolated checks of |Refused |seconds late|late submission penalty|\[(WARNING|ERROR|CRITICAL)\]", re.I
)


def worker_main(root: str, assignment: str) -> int:
    """A grading worker: reads {"student", "timestamp"} lines on stdin, writes a Result line for each on
    its own copy of stdout (everything else goes to stderr); exits at the end of stdin."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what nbgrader, kernels or learners' code print never reaches the protocol
    signal.signal(signal.SIGTERM, lambda *_: (_kill_descendants(os.getpid()), os._exit(143)))
    scratch.use_own_tempdir()  # the jails' and checkers' folders: the parent removes them if this worker is killed
    _quiet_sqlalchemy()
    os.chdir(root)
    course = open_course(root)
    app = _nbgrader_app(Path(root))
    api = NbGraderAPI(coursedir=app.coursedir, parent=app)
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        job = json.loads(line)
        print(
            f"grading {job['student']}/{assignment} (submitted {job['timestamp'] or 'at no recorded time'})",
            file=sys.stderr,
        )
        try:
            result = _grade(api, course, assignment, job["student"], job["timestamp"])
        except Exception as err:  # one submission's failure is not the worker's
            result = Result(job["student"], "failed", job["timestamp"], reason=f"{type(err).__name__}: {err}"[:500])
        print(f"{result.student}/{assignment}: {_outcome(result)} in {result.seconds:.1f} s", file=sys.stderr)
        out.write(json.dumps(asdict(result)) + "\n")
    return 0


def _quiet_sqlalchemy() -> None:
    """nbgrader 0.9.6's models make SQLAlchemy 2 warn (SAWarning) at every start-up: not the grader's news."""
    warnings.filterwarnings("ignore", category=SAWarning)


def _outcome(r: Result) -> str:
    if r.status != GRADED:
        return f"{r.status}: {r.reason}"
    late = (
        f" ({r.seconds_late:.1f} s late: {r.raw_score:g} before a penalty of {r.late_penalty:g})"
        if r.late_penalty
        else ""
    )
    return f"graded {r.score:g} of {r.max_score:g}{late}"


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this worker when the autograde process dies, however it dies (SIGKILL too)."""
    os.setpgrp()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Worker:
    def __init__(self, course: Course, assignment: str, log):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvlib.app.class_grading", "--worker", str(course.root), assignment],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=course.root,
            preexec_fn=_die_with_parent,
        )
        self.scratch = scratch.folder_of(self.proc.pid)  # the worker's temporary folder, removed once it ends
        self.job: dict | None = None
        self.started = time.monotonic()
        self.job_started = 0.0
        self.stopped = 0.0  # when it was told to stop (over the time budget)

    def send(self, job: dict) -> None:
        self.job = job
        self.job_started = time.monotonic()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def reap(self) -> int:
        code = self.proc.wait()
        if self.scratch:
            scratch.remove_tree(Path(scratch.system_tempdir()) / self.scratch)
        return code


def autograde(
    root: Path | str,
    assignment: str,
    *,
    jobs: int = 1,
    student: str = "*",
    force: bool = False,
    budget: float | None = None,
    progress: bool = True,
    out=sys.stderr,
    stats: dict | None = None,
    bar_file=None,
) -> dict[str, Result]:
    """Grade every collected submission of `assignment` matching `student` (a glob) in `jobs` workers; a
    submission the gradebook holds graded (or refused) at its current timestamp is skipped unless force, and one
    another live run holds is left to it. `budget`: seconds one submission may take (its worker is then stopped,
    and the submission failed). Returns {student: Result} for the students selected; `stats` gets each worker's
    start-up seconds; the progress bar goes to `bar_file` (default: `out`)."""
    if jobs < 1:
        raise CourseError(f"--jobs must be at least 1, not {jobs}")
    if budget is not None and budget <= 0:
        raise CourseError(f"--budget must be a positive number of seconds, not {budget:g}")
    course = open_course(root)
    print(isolation_line(course.isolation), file=out)  # first, in every run: a refused one says it too
    for problem in permission_problems(course.root):
        print(f"warning: {problem}", file=out)
    check_gradebook(course, assignment)
    chosen = select(submitted(course, assignment), student, assignment)
    swept = scratch.sweep()
    if swept:
        print(f"removed {len(swept)} temporary folder(s) of grading runs that were killed: {swept[0]} ...", file=out)
    try:
        record = GradingRecord(course.db_url, course.course_id, assignment).__enter__()
    except GradebookBusy as err:
        raise CourseError(str(err)) from None
    try:
        return _autograde(
            course, assignment, chosen, record, jobs, force, budget, progress, out, stats, bar_file or out
        )
    finally:
        record.__exit__(None, None, None)


def _gradebook_times(course: Course, assignment: str) -> dict:
    """{student: the timestamp of their submission in the gradebook (None if it has none)}, for every submission."""
    with Gradebook(course.db_url, course.course_id) as gb:
        return {s.student.id: s.timestamp for s in gb.assignment_submissions(assignment)}


def _autograde(course, assignment, chosen, record: GradingRecord, jobs, force, budget, progress, out, stats, bar_file):
    in_gradebook = {"times": _gradebook_times(course, assignment), "read": time.monotonic()}

    def current(row: Row | None, stamp: str) -> bool:
        """Graded (or refused) at this submission, and the gradebook holds it at that time (the gradebook is the
        truth: a moved or restored one, without the submission, is graded again)."""
        if row is None or row.timestamp != stamp or row.status not in (GRADED, REFUSED):
            return False
        if row.status == REFUSED:
            return True
        want = parse_time(stamp)
        if in_gradebook["times"].get(row.student, ...) != want and time.monotonic() - in_gradebook["read"] > 1:
            in_gradebook.update(times=_gradebook_times(course, assignment), read=time.monotonic())  # another run's
        return in_gradebook["times"].get(row.student, ...) == want

    rows = record.rows()
    elsewhere = {s: r for s, r in rows.items() if s in chosen and r.status == IN_FLIGHT and record.alive(r)}
    left_over = [s for s, r in rows.items() if s in chosen and r.status == IN_FLIGHT and s not in elsewhere]
    todo = [s for s in chosen if s not in elsewhere and (force or not current(rows.get(s), chosen[s]))]
    done = {s: Result(**rows[s].result) for s in chosen if s not in todo and s not in elsewhere}
    if done:
        print(
            f"{len(done)} of {len(chosen)} already graded at their current submission (--force regrades them)", file=out
        )
    if left_over:
        print(
            f"{len(left_over)} left in flight by a run that ended before finishing them (killed?): grading them "
            f"again: {', '.join(sorted(left_over)[:8])}{' ...' if len(left_over) > 8 else ''}",
            file=out,
        )
    if elsewhere:
        print(f"{len(elsewhere)} being graded by another run ({_holders(elsewhere.values())}): left to it", file=out)
    if force and todo:  # in flight before anything starts: a kill at any point leaves them for the next run
        todo, more = record.claim({s: chosen[s] for s in todo}, current=None)
        elsewhere.update(more)
    start = time.monotonic()
    (course.root / STATE_DIR).mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() == 0:  # a run as root killed before handing back what it wrote: hand it back now
        _hand_back(course, None, assignment)
    total = len(chosen) - len(elsewhere)
    bar = tqdm(total=total, initial=len(done), desc=assignment, unit="sub", file=bar_file, disable=not progress)
    failures = sum(r.status != GRADED for r in done.values())
    bar.set_postfix(failed=failures)
    taken: list[str] = []
    with open(course.root / STATE_DIR / f"{assignment}.log", "a") as log:
        queue = [{"student": s, "timestamp": chosen[s]} for s in todo]
        workers = [_Worker(course, assignment, log) for _ in range(min(jobs, len(queue)))]
        sel = selectors.DefaultSelector()
        for w in workers:
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)

        def record_result(result: Result) -> None:
            nonlocal failures
            record.finish(result.student, result.timestamp, result.status, asdict(result))
            done[result.student] = result
            failures += result.status != GRADED
            bar.update(1)
            bar.set_postfix(failed=failures)

        def next_job(w: _Worker) -> None:
            while queue:
                job = queue.pop(0)
                if not force:  # taken only now, so that runs at once share the class
                    got, other = record.claim({job["student"]: job["timestamp"]}, current=current)
                    if not got:
                        row = other[job["student"]]
                        if row.status == IN_FLIGHT:
                            elsewhere[job["student"]] = row
                            bar.total -= 1
                        else:  # graded meanwhile by another run
                            done[job["student"]] = Result(**row.result)
                            bar.update(1)
                        continue
                taken.append(job["student"])
                w.send(job)
                return
            w.close()

        for w in workers:
            next_job(w)
        try:
            while sel.get_map():
                for key, _ in sel.select(timeout=1.0):
                    w: _Worker = key.data
                    line = w.proc.stdout.readline()
                    if not line:  # the worker ended: after its last job, or by crashing in one
                        sel.unregister(w.proc.stdout)
                        code = w.reap()
                        if w.job is not None:
                            why = (
                                f"grading took longer than the budget of {budget:g} s (--budget): its worker was stopped"
                                if w.stopped
                                else f"the grading worker died (exit code {code})"
                            )
                            record_result(Result(w.job["student"], FAILED, w.job["timestamp"], reason=why))
                            if queue:  # a fresh worker for the rest
                                nw = _Worker(course, assignment, log)
                                workers.append(nw)
                                sel.register(nw.proc.stdout, selectors.EVENT_READ, nw)
                                next_job(nw)
                        continue
                    msg = json.loads(line)
                    if "ready" in msg:
                        if stats is not None:
                            stats.setdefault("worker_startup_s", []).append(round(time.monotonic() - w.started, 2))
                        continue
                    result = Result(**msg)
                    record_result(result)
                    _hand_back(course, result.student, assignment)
                    w.job = None
                    next_job(w)
                _watch(workers, budget, bar, failures)
        finally:
            for w in workers:
                w.close()
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGTERM)
                    try:
                        w.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        w.proc.kill()
                w.reap()
            bar.close()
            _hand_back(course, None, assignment)
    results = {s: done[s] for s in chosen if s in done}
    print(summary(results, assignment, time.monotonic() - start, taken, elsewhere), file=out)
    return results


def _watch(workers: list[_Worker], budget: float | None, bar, failures: int) -> None:
    """Once a second: name the submission in flight longest on the bar; stop a worker over the budget."""
    now = time.monotonic()
    busy = [w for w in workers if w.job is not None and w.proc.poll() is None]
    if busy:
        slowest = max(busy, key=lambda w: now - w.job_started)
        bar.set_postfix(failed=failures, slowest=f"{slowest.job['student']} {now - slowest.job_started:.0f}s")
    for w in busy:
        if budget is not None and not w.stopped and now - w.job_started > budget:
            w.stopped = now
            w.proc.send_signal(signal.SIGTERM)  # it kills what it started, then exits; its submission fails
        elif w.stopped and now - w.stopped > 10:  # a worker that does not stop: killed, with what it started
            _kill_descendants(w.proc.pid)
            w.proc.kill()


def _holders(rows) -> str:
    return ", ".join(sorted({r.holder for r in rows}))


def _hand_back(course: Course, student: str | None, assignment: str) -> None:
    """Root grading an instructor's course: what it wrote goes back to the instructor, so that a later
    run without root can write it (nbgrader would fail on root-owned autograded/). Without a student: the
    whole of autograded/, the log and the SQLite gradebook with its lock."""
    uid, gid = course.owner
    if os.geteuid() != 0 or uid == 0:
        return
    top = course.root / "autograded"
    paths = [top / student] if student else [top, course.root / STATE_DIR]
    if top.exists() and top.stat().st_uid != uid:  # made by this run: the instructor's too (its folders are)
        os.lchown(top, uid, gid)
    if student is None and course.db_url.startswith("sqlite:///"):
        db = Path(course.db_url[len("sqlite:///") :])
        paths += [db, db.with_name(db.name + "-journal"), db.with_name(db.name + ".kvlib-lock")]
    for top in paths:
        if not top.exists():
            continue
        for p in [top, *(top.rglob("*") if top.is_dir() else [])]:
            if p.lstat().st_uid != uid or p.lstat().st_gid != gid:
                os.lchown(p, uid, gid)


def isolation_line(mode: str) -> str:
    """What the jail gives in this mode, printed at the start of every run (docs/instructors.md, Isolation)."""
    what = {
        "namespaces": "kernel and checks jailed as fresh uids, no network, no course folder in sight (grading as root)",
        "userns": "kernel and checks jailed in user namespaces as your uid, no network, no course folder in sight",
        "plain": "NO JAIL: the submissions' code runs as you, sees your files and the network "
        "(grade in plain mode only inside a throwaway container or VM)",
    }[mode]
    return f"isolation: {mode}: {what}"


def summary(
    results: dict[str, Result], assignment: str, seconds: float, taken: list[str], elsewhere: dict | None = None
) -> str:
    """The end of a run: every selected submission's status, and of those this run took (graded or not), how many
    it graded and how fast it went through them; scores after nbgrader's late penalty, each late one named."""
    counts = {k: sum(r.status == k for r in results.values()) for k in (GRADED, REFUSED, FAILED)}
    graded_now = sum(results[s].status == GRADED for s in taken if s in results)
    rate = f", {len(taken) / seconds * 60:.1f} submissions/min" if taken and seconds > 0 else ""
    lines = [
        f"{assignment}: {len(results)} submissions: {counts[GRADED]} graded, {counts[REFUSED]} refused, "
        f"{counts[FAILED]} failed ({graded_now} graded in this run of {len(taken)} taken, {seconds:.0f} s{rate})"
    ]
    if elsewhere:
        lines.append(f"  {len(elsewhere)} left to another run that is grading them: {_holders(elsewhere.values())}")
    scores = [r.score for r in results.values() if r.status == GRADED and r.score is not None]
    if scores:
        top = max(r.max_score or 0 for r in results.values() if r.status == GRADED)
        lines.append(
            f"  scores (after late penalties, as nbgrader exports them): mean {sum(scores) / len(scores):.1f}, "
            f"lowest {min(scores):g}, highest {max(scores):g} of {top:g}"
        )
    for r in results.values():
        if r.status != GRADED:
            lines.append(f"  {r.status}: {r.student}: {r.reason}")
        else:
            if r.late_penalty or r.seconds_late:
                lines.append(f"  late: {r.student}: {_outcome(r)}")
            if r.refused_files:
                lines.append(f"  graded without refused files: {r.student}: {', '.join(r.refused_files)}")
    return "\n".join(lines)


def move_course_gradebook(root: Path | str, dest_url: str, *, out=sys.stderr) -> dict[str, int]:
    """Copy the course's gradebook (every row of nbgrader's tables and of kvlib's record) into the empty database at
    dest_url, then point the course's nbgrader_config.py at it (a line appended: c.CourseDirectory.db_url); the
    old gradebook is left as it was. Refuses while a grading run holds the old gradebook."""
    course = open_course(root)
    try:
        with GradingRecord(course.db_url, course.course_id, ""):  # no grading run while the rows move
            copied = move_gradebook(course.db_url, dest_url)
    except GradebookBusy as err:
        raise CourseError(str(err)) from None
    except ValueError as err:
        raise CourseError(str(err)) from None
    except Exception as err:  # sqlalchemy's OperationalError and friends: a server that does not connect
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CourseError(f"the gradebook {safe_url(dest_url)} does not connect: {first}") from err
    with open(course.root / "nbgrader_config.py", "a") as f:
        f.write(
            f"\n# The gradebook, moved from {safe_url(course.db_url)} by `kvlib course move-gradebook` on "
            f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\nc.CourseDirectory.db_url = {dest_url!r}\n"
        )
    rows = sum(copied.values())
    print(
        f"moved {rows} rows ({copied.get('submitted_assignment', 0)} submissions, {copied.get('grade', 0)} grades) "
        f"from {safe_url(course.db_url)} to {safe_url(dest_url)}; {course.root / 'nbgrader_config.py'} now uses it",
        file=out,
    )
    return copied


# ---------------------------------------------------------------------------------------------
# Grades out: Canvas's gradebook import

# Canvas's gradebook export and import: these columns first, then one per assignment; a second row
# "Points Possible" gives each assignment's maximum; an empty cell leaves that grade unchanged.
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def canvas_csv(root: Path | str, assignments: list[str] | None = None, roster: Path | str | None = None) -> str:
    """One row per student of the gradebook (and of the roster), one column per assignment with the
    score; a missing submission is blank. `roster`: a CSV exported from the Canvas gradebook, whose
    Student, ID, SIS User ID and Section fill the rows whose SIS Login ID is the nbgrader student id."""
    course = open_course(root)
    people: dict[str, dict[str, str]] = {}
    if roster is not None:
        with open(roster, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
        missing = [c for c in CANVAS_COLUMNS if rows and c not in rows[0]]
        if not rows or missing:
            raise CourseError(
                f"{roster} is not a Canvas gradebook export: no {', '.join(missing or CANVAS_COLUMNS)} column"
            )
        for row in rows:
            login = row["SIS Login ID"].strip()
            if login and row["Student"].strip() != "Points Possible":
                people[login] = {c: row[c] for c in CANVAS_COLUMNS}
    with Gradebook(course.db_url, course.course_id) as gb:
        names = assignments or [
            a.name for a in sorted(gb.assignments, key=lambda a: (a.duedate is None, a.duedate, a.name))
        ]
        maxima = {}
        for name in names:
            try:
                maxima[name] = gb.find_assignment(name).max_score
            except MissingEntry:
                raise CourseError(f"assignment {name!r} is not in the gradebook of {course.root}") from None
        scores: dict[str, dict[str, float]] = {}
        for s in gb.students:
            full = " ".join(p for p in (s.first_name, s.last_name) if p) or s.id
            people.setdefault(s.id, {"Student": full, "ID": "", "SIS User ID": "", "SIS Login ID": s.id, "Section": ""})
            scores[s.id] = {}
        for name in names:
            for sub in gb.assignment_submissions(name):
                scores.setdefault(sub.student.id, {})[name] = final_score(sub)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CANVAS_COLUMNS + names)
    w.writerow(["Points Possible", "", "", "", ""] + [_num(maxima[n]) for n in names])
    for login in sorted(people):
        got = scores.get(login, {})
        w.writerow([people[login][c] for c in CANVAS_COLUMNS] + [_num(got[n]) if n in got else "" for n in names])
    return buf.getvalue()


def _num(x: float) -> str:
    return f"{x:g}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2], sys.argv[3]))
    sys.exit(f"usage: {sys.argv[0]} --worker COURSE ASSIGNMENT (started by kvlib course autograde)")
