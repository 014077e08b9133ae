"""`kvlib bench class`: a synthetic class graded by `kvlib course autograde`, every score checked.

A course folder from `kvlib course init --earlier given` in a temporary folder, one assignment
released, N students handed in through nbgrader's exchange (each one's submit, then collect; one
account stands for them all: Exchange) or, with via="submitted", straight into submitted/ (as
`nbgrader zip_collect` would leave them):
correct, partial (the first exercise only), blank (the release untouched) and a few cheats the
grading tests use (numpy patched at import, an exit at import, the module a link to the reference,
the test cells edited), some of them submitting twice (partial, then correct after the first round).
It checks that every score is the one that submission must get, and prints submissions per
minute, CPU seconds per submission and the peak memory of the grading processes.
Not here: grading itself (class_grading.autograde), a real exchange between accounts (tests/test_hub.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from nbgrader.apps.api import NbGraderAPI
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory

from kvlib import checks
from kvlib.app.class_grading import Result, _nbgrader_app, autograde
from kvlib.app.course_folder import COURSE_MODES, EXCHANGE_ROOT_MODE, init_course
from kvlib.app.exchange import PrivateSubmit
from kvlib.app.release import BEGIN, END, ROOT
from kvlib.course.exercises import EXERCISES

VARIANTS = ("correct", "partial", "blank", "patched-numpy", "exit-at-import", "link-to-reference", "edited-tests")
# one class of 20: mostly honest work, a few cheats; resubmitters hand in partial, then correct
_MIX = [
    *("correct", "partial", "blank", "patched-numpy", "correct", "exit-at-import", "link-to-reference", "edited-tests"),
    *("correct", "partial", "resubmit", "blank", "correct", "partial", "correct", "blank", "correct", "partial"),
    *("correct", "correct"),
]
_EXERCISE = re.compile(r'^\s*@exercise\("(\d+\.\d+)"')


def module_of(notebook: str) -> str:
    mods = [ex.module for ex in EXERCISES if ex.notebook == notebook]
    if not mods:
        raise ValueError(f"no exercises in {notebook!r}")
    return mods[0]


def module_source(notebook: str, done: tuple[str, ...] | str = "all", prelude: str = "") -> str:
    """The notebook's learner module with the exercises in `done` solved (the reference) and the
    rest stubs; `prelude` runs at import."""
    text = (ROOT / "solutions" / "kvlib" / f"{module_of(notebook)}.py").read_text(encoding="utf-8")
    out, current, skipping = [], None, False
    for line in text.splitlines(keepends=True):
        if m := _EXERCISE.match(line):
            current = m.group(1)
        if line.strip() == BEGIN:
            if done != "all" and current not in done:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f'{indent}raise NotImplementedError("Exercise {current}: not done")\n')
                skipping = True
            continue
        if line.strip() == END:
            skipping = False
            continue
        if not skipping:
            out.append(line)
    source = "".join(out)
    anchor = "from kvlib.course.exercises import exercise\n"
    return source.replace(anchor, anchor + prelude + "\n", 1) if prelude else source


def points(notebook: str) -> tuple[dict[str, float], float]:
    """Points of the notebook's graded cells per exercise, and the total."""
    checks._load_all()
    per: dict[str, float] = {}
    for nb in (ROOT / "solutions" / notebook).glob("*.ipynb"):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("grade"):
                (ex,) = {c.exercise.id for c in checks.checks_of_cell(meta["grade_id"])}
                per[ex] = per.get(ex, 0) + meta["points"]
    return per, sum(per.values())


def first_exercise(notebook: str) -> str:
    return next(ex.id for ex in EXERCISES if ex.notebook == notebook)


def expected(notebook: str) -> dict[str, float]:
    per, total = points(notebook)
    first = per.get(first_exercise(notebook), 0.0)
    want = dict.fromkeys(VARIANTS, 0.0)
    want.update({"correct": total, "partial": first, "edited-tests": total, "resubmit": total})
    return want


def hand_in(course: Path, notebook: str, student: str, variant: str, when: float) -> None:
    """submitted/<student>/<notebook>/ as the release, with the variant's module and notebook."""
    sub = course / "submitted" / student / notebook
    if sub.exists():
        shutil.rmtree(sub)
    shutil.copytree(course / "release" / notebook, sub)
    work(sub, notebook, variant)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(when)) + f".{int(when * 1e6) % 1000000:06d} UTC"
    (sub / "timestamp.txt").write_text(stamp)


def work(sub: Path, notebook: str, variant: str) -> None:
    """The variant's work in sub, a copy of the release: its module and notebook."""
    target = sub / "kvlib" / f"{module_of(notebook)}.py"
    if variant in ("correct", "edited-tests"):
        target.write_text(module_source(notebook), encoding="utf-8")
    elif variant == "partial":
        target.write_text(module_source(notebook, (first_exercise(notebook),)), encoding="utf-8")
    elif variant == "patched-numpy":
        prelude = "import numpy\nnumpy.allclose = lambda *a, **k: True\nnumpy.testing.assert_allclose = lambda *a, **k: None\n"
        target.write_text(module_source(notebook, (), prelude), encoding="utf-8")
    elif variant == "exit-at-import":
        target.write_text(module_source(notebook, (), "import os\nos._exit(0)\n"), encoding="utf-8")
    elif variant == "link-to-reference":
        target.unlink()
        target.symlink_to(ROOT / "solutions" / "kvlib" / target.name)
    elif variant != "blank":
        raise ValueError(f"unknown variant {variant!r}")
    if variant == "edited-tests":
        for path in sub.glob("*.ipynb"):
            nb = json.loads(path.read_text(encoding="utf-8"))
            for cell in nb["cells"]:
                if cell["metadata"].get("nbgrader", {}).get("grade"):
                    cell["source"] = "pass  # no test here\n"
            path.write_text(json.dumps(nb), encoding="utf-8")


class Exchange:
    """The synthetic class through nbgrader's exchange, in one process: each student works in a copy of what
    fetch gives (outbound/), submits with the students' submit (PrivateSubmit); the instructor collects with
    --update. One account stands for every student, so collect is nbgrader's own with links kept as links
    (LinkKeepingCollect), not the course's owner check, whose students are Unix accounts. The link cheat is made
    as a student would make it through the exchange: `nbgrader submit` copies what a link points to, so the student
    puts the link into their own submission in inbound/ afterwards (the folder is theirs)."""

    def __init__(self, course: Path, notebook: str, top: Path):

        self.course, self.notebook, self.top = course, notebook, top
        cwd = os.getcwd()
        os.chdir(course)  # nbgrader reads the working folder's nbgrader_config.py too
        try:
            self.app = _nbgrader_app(course)
        finally:
            os.chdir(cwd)
        self.app.log.setLevel("WARNING")  # not three lines a submission
        self.api = NbGraderAPI(coursedir=self.app.coursedir, parent=self.app)
        self.authenticator = Authenticator(parent=self.app)

    def submit(self, student: str, variant: str) -> None:
        coursedir = CourseDirectory(parent=self.app)
        coursedir.course_id = self.app.coursedir.course_id
        coursedir.assignment_id, coursedir.student_id = self.notebook, student
        sub = PrivateSubmit(coursedir=coursedir, authenticator=self.authenticator, parent=self.app)
        sub.log.setLevel("WARNING")  # the API's collect leaves the shared log at INFO (before the resubmissions)
        folder = self.top / "students" / student
        if folder.exists():
            shutil.rmtree(folder)
        outbound = Path(sub.root) / coursedir.course_id / "outbound" / self.notebook
        shutil.copytree(outbound, folder / self.notebook)  # what fetch_assignment gives
        work(folder / self.notebook, self.notebook, "correct" if variant == "link-to-reference" else variant)
        sub.assignment_dir = str(folder)
        sub.start()
        if variant == "link-to-reference":
            target = Path(sub.inbound_path) / sub.assignment_filename / "kvlib" / f"{module_of(self.notebook)}.py"
            target.unlink()
            target.symlink_to(ROOT / "solutions" / "kvlib" / target.name)

    def collect(self) -> None:
        out = self.api.collect(self.notebook, update=True)
        if not out.get("success"):
            raise RuntimeError(f"nbgrader collect failed: {(out.get('log', '') + out.get('error', ''))[-2000:]}")


def make_class(n: int) -> dict[str, str]:
    """{student id: variant}, the mix of _MIX repeated, ids s000, s001, ..."""
    return {f"s{i:03d}": _MIX[i % len(_MIX)] for i in range(n)}


# ---------------------------------------------------------------------------------------------
# A throwaway PostgreSQL server on a Unix socket


def _pg_bin() -> Path:
    for version in ("17", "16", "15"):
        path = Path(f"/usr/lib/postgresql/{version}/bin")
        if (path / "initdb").exists():
            return path
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise FileNotFoundError("no PostgreSQL server here: install Debian's postgresql (initdb, pg_ctl)")


@contextlib.contextmanager
def throwaway_postgres(user: str | None = None, password: str | None = None):
    """A PostgreSQL cluster in a temporary folder, listening only on a Unix socket there; yields the
    gradebook URL (database `gradebook`, role `kvlib`). As root it runs as `user` (default: nobody):
    PostgreSQL refuses to run as root. Without `password` every local account may connect (trust: for one
    account's benchmark); with it the server asks for it (scram-sha-256) and the URL carries it, as a hub
    where every student has a shell needs. Stopped and removed on exit."""
    binary = _pg_bin()
    folder = Path(tempfile.mkdtemp(prefix="kvlib-pg-"))
    run_as: list[str] = []
    account = pwd.getpwuid(os.geteuid())
    if os.geteuid() == 0:
        account = pwd.getpwnam(user or "nobody")
        os.chown(folder, account.pw_uid, account.pw_gid)
        run_as = ["runuser", "-u", account.pw_name, "--"]
    folder.chmod(0o755)  # the socket must be reachable; the data folder itself is 0700 (initdb)
    data, sock = folder / "data", folder
    env = {**os.environ, **({"PGPASSWORD": password} if password else {})}

    def pg(*argv, **kw):
        return subprocess.run(
            run_as + [str(binary / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120, env=env, **kw
        )

    try:
        auth = ["-A", "trust"]
        if password:
            pwfile = folder / "pwfile"
            fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            os.chown(pwfile, account.pw_uid, account.pw_gid)
            auth = ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
        proc = pg("initdb", "-D", str(data), *auth, "-U", "kvlib", "--no-sync")
        if password:
            pwfile.unlink()
        if proc.returncode:
            raise RuntimeError(f"initdb failed: {proc.stderr[-2000:]}")
        opts = f"-c listen_addresses='' -k {sock} -c fsync=off -c max_connections=50"
        proc = pg("pg_ctl", "-D", str(data), "-o", opts, "-l", str(folder / "log"), "-w", "-t", "60", "start")
        if proc.returncode:
            raise RuntimeError(f"pg_ctl start failed: {proc.stdout[-1000:]}{proc.stderr[-1000:]}")
        proc = pg("createdb", "-h", str(sock), "-U", "kvlib", "gradebook")
        if proc.returncode:
            raise RuntimeError(f"createdb failed: {proc.stderr[-1000:]}")
        yield f"postgresql+psycopg2://kvlib{':' + password if password else ''}@/gradebook?host={sock}"
    finally:
        pg("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "-t", "60", "stop")
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The benchmark


class _Peak:
    """Samples the resident memory of this process's descendants (the workers, kernels, checkers)."""

    def __init__(self):
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.5):
            self.peak_mb = max(self.peak_mb, _tree_rss_mb(os.getpid()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _tree_rss_mb(root: int) -> float:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    total, stack = 0, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            pass
    return total / 1024


def bench_class(
    students: int = 20,
    assignment: str = "01-attention",
    jobs: int = 1,
    db: str = "sqlite",
    keep: str | None = None,
    via: str = "exchange",
) -> dict:
    """Grade a synthetic class handed in `via` nbgrader's exchange (submit, collect --update) or straight into
    submitted/ (as zip_collect leaves it); returns the record (raises RuntimeError if a score is not the expected
    one). Only the grading is timed."""
    if students < 1:
        raise ValueError("--students must be at least 1")
    if db not in ("sqlite", "postgres"):
        raise ValueError(f"--db must be sqlite or postgres, not {db!r}")
    if via not in ("exchange", "submitted"):
        raise ValueError(f"--via must be exchange or submitted, not {via!r}")
    module_of(assignment)  # a notebook with exercises
    want = expected(assignment)
    klass = make_class(students)
    top = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="kvlib-bench-class-"))
    course = top / "course"
    with contextlib.ExitStack() as stack:
        if not keep:
            stack.callback(shutil.rmtree, top, True)
        url = stack.enter_context(throwaway_postgres()) if db == "postgres" else None
        exchange = top / "exchange" if via == "exchange" else None
        init_course(course, earlier="given", course_id="kvlib-bench")
        with open(course / "nbgrader_config.py", "a") as f:
            if url:
                f.write(f"\nc.CourseDirectory.db_url = {url!r}\n")
            if exchange:  # one account for the whole class (see Exchange): the exchange's folders with their modes,
                # without init --exchange's check that the instructor's group is theirs alone (no other account here)
                for rel, mode in {
                    "": EXCHANGE_ROOT_MODE,
                    **{f"kvlib-bench/{k}": v for k, v in COURSE_MODES.items()},
                }.items():
                    (exchange / rel).mkdir(parents=True, exist_ok=True)
                    (exchange / rel).chmod(mode)
                f.write(f"\nc.Exchange.root = {str(exchange)!r}\n")
                f.write('c.ExchangeFactory.collect = "kvlib.grading.autograde.LinkKeepingCollect"\n')
                f.write(
                    f'c.ExchangeFactory.submit = "kvlib.app.exchange.PrivateSubmit"\nc.Exchange.cache = {str(top / "cache")!r}\n'
                )
        env = {**os.environ, "KVLIB_SOLUTIONS": "0"}
        for step in ["generate_assignment"] + (["release_assignment"] if exchange else []):
            proc = subprocess.run(
                [_python(), "-m", "nbgrader", step, assignment, "--log-level=WARN"],
                cwd=course, capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            if proc.returncode:
                raise RuntimeError(f"{step} failed: {proc.stderr[-2000:]}")
        ex = Exchange(course, assignment, top) if exchange else None
        now = time.time() - 3600
        for student, variant in klass.items():
            first = "partial" if variant == "resubmit" else variant
            if ex:
                ex.submit(student, first)
            else:
                hand_in(course, assignment, student, first, now)
        if ex:
            ex.collect()
        rounds = []
        devnull = open(os.devnull, "w")
        stack.callback(devnull.close)
        for round_no in (1, 2):
            if round_no == 2:  # the resubmitters hand in again, later; only they are regraded
                resub = [s for s, v in klass.items() if v == "resubmit"]
                if not resub:
                    break
                for s in resub:
                    if ex:
                        ex.submit(s, "correct")
                    else:
                        hand_in(course, assignment, s, "correct", now + 60)
                if ex:
                    ex.collect()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            stats: dict = {}
            with _Peak() as peak:
                results = autograde(  # its bar on a terminal only: what the grader prints would be noise here
                    course,
                    assignment,
                    jobs=jobs,
                    progress=sys.stderr.isatty(),
                    out=devnull,
                    stats=stats,
                    bar_file=sys.stderr,
                )
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            graded_now = set(resub) if round_no == 2 else set(klass)
            graded = len(graded_now)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            rounds.append(
                {
                    "round": round_no,
                    "graded": graded,
                    "wall_s": round(wall, 1),
                    "per_minute": round(graded / wall * 60, 2),
                    "cpu_s_per_submission": round(cpu / graded, 2),
                    "peak_memory_mb": round(peak.peak_mb),
                    # where the time goes: each worker's nbgrader start-up, then per submission the
                    # isolated checks and the rest (the jailed kernel's run of the notebook, copying)
                    "worker_startup_s": stats.get("worker_startup_s", []),
                    "mean_s_per_submission": _mean([r.seconds for s, r in results.items() if s in graded_now]),
                    "mean_checks_s": _mean([r.checks_s for s, r in results.items() if s in graded_now]),
                }
            )
    lost = Result("", "lost", reason="handed in, never graded (not collected, or not in submitted/)")
    got = {s: results.get(s, lost) for s in klass}
    wrong = {
        s: {"variant": v, "expected": want[v], "got": got[s].score, "status": got[s].status, "reason": got[s].reason}
        for s, v in klass.items()
        if got[s].score != want[v] or got[s].status != "graded"
    }
    report = {
        "assignment": assignment,
        "students": students,
        "jobs": jobs,
        "db": db,
        "handed_in": "through nbgrader's exchange" if via == "exchange" else "into submitted/",
        "variants": {v: sum(x == v for x in klass.values()) for v in sorted(set(klass.values()))},
        "rounds": rounds,
        "all_scores_expected": not wrong,
        "wrong": wrong,
        "cpus": os.cpu_count(),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
    }
    if wrong:
        raise RuntimeError("scores not as expected: " + json.dumps(wrong, indent=1))
    return report


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 2) if xs else 0.0


def _python() -> str:
    return sys.executable


def format_class(r: dict) -> str:
    lines = [
        f"kvlib bench class: {r['students']} students of {r['assignment']}, --jobs {r['jobs']}, gradebook {r['db']}, "
        f"handed in {r.get('handed_in', 'into submitted/')}, {r['cpus']} CPUs (load {r['load_average_1min_at_end']} "
        "at the end)",
        "  " + ", ".join(f"{n} {v}" for v, n in r["variants"].items()),
    ]
    for x in r["rounds"]:
        what = "the class" if x["round"] == 1 else "the resubmissions"
        lines.append(
            f"  round {x['round']} ({what}): {x['graded']} graded in {x['wall_s']} s: {x['per_minute']} submissions/min, "
            f"{x['cpu_s_per_submission']} CPU s per submission, peak memory {x['peak_memory_mb']} MB"
        )
        lines.append(
            f"    where the time goes: worker start-up {x['worker_startup_s']} s; per submission {x['mean_s_per_submission']} s "
            f"in a worker, of which the isolated checks {x['mean_checks_s']} s and the kernel's run of the notebook the rest"
        )
    lines.append("  every score as expected" if r["all_scores_expected"] else f"  WRONG: {r['wrong']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The figure of docs/instructors.md: grading time against class size, for one and two workers

SWEEP = Path("docs") / "class-grading.json"  # the records the figure is drawn from, relative to the repo


def record_sweep(
    sizes: tuple[int, ...] = (10, 25, 50), jobs: tuple[int, ...] = (1, 2), assignment: str = "04-kv-cache", out=None
) -> list[dict]:
    """Run bench_class for every class size and worker count, jobs interleaved at each size; write the records
    to docs/class-grading.json (or `out`) and return them."""
    records = []
    for n in sizes:
        for j in jobs:
            records.append(bench_class(students=n, assignment=assignment, jobs=j))
            print(format_class(records[-1]), flush=True)
    path = Path(out) if out else ROOT / SWEEP
    path.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return records


def plot_sweep(records: list[dict], path) -> None:
    """Save the guide's figure (kvlib.course.plotting.class_grading) of record_sweep's records to path."""
    if not records or not all(r["all_scores_expected"] for r in records):
        raise ValueError("the figure needs records whose every score was as expected (record_sweep's)")
    from kvlib.course import plotting  # noqa: PLC0415 (start-up time: matplotlib, for the guide's figure alone)

    rows = [(r["jobs"], r["students"], r["rounds"][0]["wall_s"], r["rounds"][0]["per_minute"]) for r in records]
    first = records[0]
    note = f"{first['assignment']}, {first['cpus']} CPUs, gradebook {first['db']}; every score as expected in every run"
    plotting.class_grading(rows, note=note).savefig(path)
