"""Classroom grading end to end: `kvlib course init`, then nbgrader's own commands on a temporary
course with generated submissions of notebook 01, honest ones and ones that try to cheat.

Every submission is autograded in ONE `nbgrader autograde` call (the expensive part: a kernel
per submission). Students are graded in name order, so the attacks ("a..") run before the
honest submissions ("m-partial", "z-..") whose exact scores prove that no attack leaked into a
later grade. The kernel's time limits are tight here: scores never depend on the kernel.
Attacks that only the jail stops (walking up the disk, writing the gradebook, planting an
IPython startup file) are skipped where the grader cannot create namespaces (docs/instructors.md: plain mode).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_kvlib

NB = "01-attention"


def _mode() -> str:
    from kvlib.grading.jail import detect_mode

    return detect_mode()


JAILED = pytest.mark.skipif(
    sys.platform != "linux" or _mode() == "plain",
    reason="needs namespaces (root or user namespaces): the plain fallback does not stop this",
)


def nbgrader(course, *args, check=True, timeout=900):
    # nbgrader runs the `alembic` command for its gradebook: put this environment's bin/ first
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args], cwd=course, capture_output=True, text=True, env=env, timeout=timeout
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


# ---------------------------------------------------------------------------------------------
# Generated submissions: kvlib/attention.py variants and notebook edits

REFERENCE = (ROOT / "solutions" / "kvlib" / "attention.py").read_text(encoding="utf-8")
_EXERCISE = re.compile(r'^\s*@exercise\("(\d+\.\d+)"')
_ANCHOR = "from kvlib.course.exercises import exercise\n"


def attention(done=(), replace=None, prelude="", epilogue="") -> str:
    """kvlib/attention.py with the exercises in `done` solved (the reference), `replace` {id: body}
    written in, the rest stubs; `prelude` runs at import, `epilogue` after the functions."""
    replace = replace or {}
    out, current, skipping = [], None, False
    for line in REFERENCE.splitlines(keepends=True):
        if m := _EXERCISE.match(line):
            current = m.group(1)
        stripped = line.strip()
        if stripped == "### BEGIN SOLUTION":
            indent = line[: len(line) - len(line.lstrip())]
            if current in replace:
                out += [indent + body + "\n" for body in replace[current].splitlines()]
                skipping = True
            elif current not in done:
                out.append(f'{indent}raise NotImplementedError("Exercise {current} (notebooks/{NB}): stub")\n')
                skipping = True
            continue
        if stripped == "### END SOLUTION":
            skipping = False
            continue
        if not skipping:
            out.append(line)
    text = "".join(out)
    assert _ANCHOR in text
    return text.replace(_ANCHOR, _ANCHOR + prelude + "\n", 1) + epilogue


ALL = ("1.1", "1.2", "1.3", "1.4")


def _points() -> dict[str, float]:
    """Points of the notebook's graded cells, per exercise (each cell's grade_id names its check)."""
    from kvlib import checks

    checks._load_all()
    out: dict[str, float] = {}
    for cell in json.loads((ROOT / "solutions" / NB / "attention.ipynb").read_text(encoding="utf-8"))["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("grade"):
            exercise = checks.CHECKS[meta["grade_id"]].exercise.id
            out[exercise] = out.get(exercise, 0) + meta["points"]
    return out


POINTS = _points()  # {"1.1": 3, ...}
TOTAL = sum(POINTS.values())
PLANTED = Path.home() / ".ipython" / "profile_default" / "startup" / "00-kvlib-grading-test.py"


def _graded_cells(nb):
    return [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]


def edit_tests(nb):
    for cell in _graded_cells(nb):
        cell["source"] = 'print("passed")'


def delete_tests(nb):
    nb["cells"] = [c for c in nb["cells"] if not c["metadata"].get("nbgrader", {}).get("grade")]


def change_metadata(nb):
    cells = _graded_cells(nb)
    cells[0]["metadata"]["nbgrader"]["points"] = 100
    cells[1]["metadata"]["nbgrader"]["grade"] = False
    cells[2]["metadata"]["nbgrader"]["grade_id"] = "renamed"
    cells[3]["metadata"]["nbgrader"]["solution"] = True
    del cells[4]["metadata"]["nbgrader"]
    bonus = {
        "grade": True,
        "grade_id": "bonus",
        "points": 1000,
        "locked": False,
        "solution": False,
        "schema_version": 3,
    }
    nb["cells"].append(
        {
            "cell_type": "code",
            "id": "bonus",
            "metadata": {"nbgrader": bonus},
            "source": "print('passed')",
            "outputs": [],
            "execution_count": None,
        }
    )
    nb["cells"].append(
        {
            "cell_type": "markdown",
            "id": "bonus2",
            "source": "bonus",
            "metadata": {"nbgrader": {**bonus, "grade_id": "bonus2", "points": 50, "locked": True}},
        }
    )


def submissions(course: Path, port: int = 0) -> dict:
    """student -> dict(attention=source | None (a link), notebook=edit fn, files={rel: text}, expected=points)."""
    subs = {
        # monkeypatching the checker, numpy and torch at import; the functions return zeros
        "a01-monkeypatch": dict(
            expected=0,
            attention=attention(
                replace={
                    "1.1": "return np.zeros_like(scores)",
                    "1.2": "return np.zeros(v.shape[-1]), np.zeros(k.shape[0])",
                    "1.3": "return np.zeros((seq_len, kv_len), dtype=bool)",
                    "1.4": "return np.zeros(q.shape[:-1] + v.shape[-1:]), np.zeros(q.shape[:-1] + k.shape[-2:-1])",
                },
                prelude="""
import numpy as _np
_np.allclose = lambda *a, **k: True
_np.array_equal = lambda *a, **k: True
_np.isclose = lambda *a, **k: True
try:
    import kvlib.checks as _checks
    _checks.grade = lambda *a, **k: print("passed")
    import kvlib.checks.attention as _ca
    _ca._close = lambda *a, **k: True
    import torch as _torch
    _torch.allclose = lambda *a, **k: True
    _torch.softmax = lambda x, dim=-1: x * 0
except Exception:
    pass
""",
            ),
        ),
        # an IPython input transformer: every later cell in the kernel just prints "passed"
        "a02-input-transformer": dict(
            expected=0,
            attention=attention(
                prelude="""
try:
    from IPython import get_ipython as _gi
    _gi().input_transformers_cleanup.append(lambda lines: ['print("passed")\\n'])
except Exception:
    pass
"""
            ),
        ),
        # a fake numpy package beside the notebook, and one inside kvlib/
        "a03-fake-numpy": dict(
            expected=0,
            attention=attention(),
            files={
                "numpy/__init__.py": "allclose = array_equal = isclose = lambda *a, **k: True\n"
                "def __getattr__(name):\n    return lambda *a, **k: True\n",
                "kvlib/numpy.py": "allclose = lambda *a, **k: True\n",
            },
        ),
        "a04-exit-at-import": dict(expected=0, attention=attention(ALL, prelude="import os as _os\n_os._exit(0)\n")),
        # results that compare equal to anything: an object, and an ndarray subclass
        "a05-equal-to-anything": dict(
            expected=0,
            attention=attention(
                prelude="""
class _Anything:
    shape = property(lambda self: (3,))
    dtype = bool
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __array__(self, *a, **k): raise RuntimeError
    def __getitem__(self, i): return self
    def __iter__(self): return iter([self, self])
    def __len__(self): return 2
class _EqArray(np.ndarray):
    def __eq__(self, other): return np.ones(np.shape(other), dtype=bool)
    def __array_function__(self, func, types, args, kwargs): return True
""",
                replace={
                    "1.1": "return _Anything()",
                    "1.2": "return _Anything(), _Anything()",
                    "1.3": "return np.zeros((seq_len, kv_len), dtype=bool).view(_EqArray)",
                    "1.4": "return np.zeros(q.shape[:-1] + v.shape[-1:]).view(_EqArray), _Anything()",
                },
            ),
        ),
        "a06-patch-builtins": dict(
            expected=0,
            attention=attention(
                replace={
                    "1.1": "return np.zeros_like(scores)",
                    "1.3": "return np.zeros((seq_len, kv_len), dtype=bool)",
                },
                prelude="""
import builtins as _b
_b.isinstance = lambda *a: True
_b.all = lambda *a: True
_b.any = lambda *a: True
_b.AssertionError = type("AssertionError", (Exception,), {})
""",
            ),
        ),
        "a07-symlink-to-reference": dict(expected=0, attention=None),
        # an endless loop in attend (interruptible), and one that swallows KeyboardInterrupt
        "a08-endless-loop": dict(
            expected=TOTAL - POINTS["1.2"], attention=attention(ALL, replace={"1.2": "while True:\n    pass"})
        ),
        "a09-loop-ignores-interrupt": dict(
            expected=TOTAL - POINTS["1.4"],
            attention=attention(
                ALL,
                replace={
                    "1.4": (
                        "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass"
                    )
                },
            ),
        ),
        "a10-prints-megabytes": dict(
            expected=0,
            attention=attention(
                prelude="""
import os as _os, sys as _sys
print("x" * 3_000_000)
_os.write(1, b"y" * 3_000_000)
_os.write(2, b"z" * 3_000_000)
""",
                replace={
                    "1.1": "print('w' * 2_000_000)\nraise NotImplementedError('Exercise 1.1 (notebooks/01-attention): stub')"
                },
            ),
        ),
        # the read-only test cells rewritten; deleted (with a partly correct kvlib: honest score);
        # their metadata changed (points, flags, ids, extra graded cells)
        "a11-edited-tests": dict(expected=0, attention=attention(), notebook=edit_tests),
        "a12-deleted-tests": dict(
            expected=POINTS["1.1"] + POINTS["1.3"], attention=attention(("1.1", "1.3")), notebook=delete_tests
        ),
        "a13-changed-metadata": dict(expected=0, attention=attention(), notebook=change_metadata),
        # links to the source notebook, the reference in the clone, another student's file and the
        # config: unpacked by hand with `tar` (links kept), and collected by `nbgrader zip_collect`;
        # their code prints whatever it can read and imports a linked "helper" that is the reference
        "a17-links-unpacked-tar": dict(
            expected=POINTS["1.1"] + POINTS["1.3"],
            links="tar",
            attention=attention(("1.1", "1.3"), prelude=LEAK, epilogue=LINKED_HELPER),
        ),
        "a18-links-zip-collect": dict(
            expected=POINTS["1.1"] + POINTS["1.3"],
            links="zip_collect",
            attention=attention(("1.1", "1.3"), prelude=LEAK, epilogue=LINKED_HELPER),
        ),
        # honest submissions, graded after every attack
        "m-partial": dict(expected=POINTS["1.1"] + POINTS["1.3"], attention=attention(("1.1", "1.3"))),
        "z-correct": dict(expected=TOTAL, attention=attention(ALL)),
        # Exercise 1.1's code moved to a module of the learner's own, which the rest imports
        "z-helper-module": dict(
            expected=TOTAL,
            attention=attention(
                ALL,
                replace={"1.1": "return stable_softmax(scores)"},
                prelude="from kvlib.my_helpers import stable_softmax\n",
            ),
            files={"kvlib/my_helpers.py": HELPER},
        ),
        "z-untouched": dict(expected=0, attention="release"),
    }
    if _mode() != "plain":
        ref = str(ROOT / "solutions" / "kvlib" / "attention.py")
        subs.update(
            {
                # correct code that, in the kernel and in the isolated child, calls a server on the grader's localhost
                "a19-connects-to-localhost": dict(
                    expected=TOTAL,
                    attention=attention(
                        ALL,
                        prelude=f"""
import socket as _socket
try:
    with _socket.create_connection(("127.0.0.1", {port}), timeout=3) as _c:
        _c.sendall(b"reached the grader's machine")
except OSError:
    pass
""",
                    ),
                ),
                # look for the reference everywhere, and switch on reference mode
                "a14-walks-up-for-solutions": dict(
                    expected=0,
                    attention=attention(
                        epilogue=f"""
import os as _os, pathlib as _pl
def _find():
    starts = [_pl.Path(__file__).resolve(), _pl.Path.cwd(), _pl.Path("/")]
    found = [_pl.Path({ref!r})] + [p / "solutions" / "kvlib" / "attention.py" for s in starts for p in (s, *s.parents)]
    for top in ("/", "/work", "/tmp", "/root", "/home", "/srv", "/opt"):
        for dirpath, dirnames, filenames in _os.walk(top):
            if dirpath.count(_os.sep) > 4:
                dirnames[:] = []
            if dirpath.endswith("solutions/kvlib") and "attention.py" in filenames:
                found.append(_pl.Path(dirpath) / "attention.py")
    for path in found:
        try:
            return path.read_text()
        except OSError:
            pass
_src = _find()
if _src:
    exec(compile(_src, "reference", "exec"), globals())
try:
    import kvlib
    kvlib.use_solutions()
except Exception:
    pass
"""
                    ),
                ),
                "a15-writes-gradebook": dict(
                    expected=0,
                    attention=attention(
                        prelude=f"""
import sqlite3 as _sql, pathlib as _pl
for _db in [_pl.Path({str(course / "gradebook.db")!r}), *[p / "gradebook.db" for p in _pl.Path.cwd().parents]]:
    try:
        with _sql.connect(_db) as _con:
            _con.execute("UPDATE grade SET auto_score = 1")
    except Exception:
        pass
try:
    _pl.Path({str(course / "PWNED")!r}).write_text("x")
except Exception:
    pass
"""
                    ),
                ),
                "a16-plants-startup-file": dict(
                    expected=0,
                    attention=attention(
                        prelude=f"""
import os as _os, pathlib as _pl
for _d in {{_pl.Path.home() / ".ipython", _pl.Path(_os.environ.get("IPYTHONDIR", "/nonexistent")), _pl.Path({str(PLANTED.parent.parent.parent)!r})}}:
    try:
        _p = _d / "profile_default" / "startup"
        _p.mkdir(parents=True, exist_ok=True)
        (_p / {PLANTED.name!r}).write_text("import kvlib.checks\\nkvlib.checks.grade = lambda *a, **k: print('passed')\\n")
    except Exception:
        pass
"""
                    ),
                ),
            }
        )
    return subs


# what a submission links to: (link in the submission, its target as the link names it, the target's path)
def link_targets(course: Path) -> list[tuple[str, str, Path]]:
    reference = ROOT / "solutions" / "kvlib" / "attention.py"
    return [
        ("notes.txt", f"../../../source/{NB}/attention.ipynb", course / "source" / NB / "attention.ipynb"),
        ("reference.txt", str(reference), reference),
        (
            "other.txt",
            f"../../z-correct/{NB}/kvlib/attention.py",
            course / "submitted" / "z-correct" / NB / "kvlib" / "attention.py",
        ),
        ("config.txt", "../../../nbgrader_config.py", course / "nbgrader_config.py"),
        ("kvlib/ref_helper.py", str(reference), reference),
    ]


LEAK = """
import os as _os
for _name in ("notes.txt", "reference.txt", "other.txt", "config.txt", "hard-config.txt", "hard-source.txt",
              "kvlib/ref_helper.py", "kvlib/hard_ref.py"):
    for _where in ("", _os.path.dirname(__file__) + "/../"):
        try:
            print(open(_where + _name).read())
        except Exception:
            pass
"""
LINKED_HELPER = """
try:  # the reference itself, through a link in kvlib/: every exercise solved
    from kvlib.ref_helper import softmax, attend, causal_mask, causal_self_attention  # noqa: F811
except Exception:
    pass
"""
HELPER = """import numpy as np


def stable_softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
"""


def _text_of(path: Path) -> str:
    """A file as the learner would see it printed: a notebook's cell sources, anything else as it is."""
    if path.suffix == ".ipynb":
        return "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"])
    return path.read_text(errors="replace")


def _secret_lines(path: Path, course: Path, student: str) -> list[str]:
    """Lines of a link's target that a leak would show: long ones that the learner does not have already
    (in the release, or in their own files: a17's attention.py solves 1.1 as the reference does)."""
    own = [p for p in (course / "release" / NB).rglob("*") if p.is_file()]
    own += [
        p
        for p in (course / "submitted" / student / NB).rglob("*")
        if not p.is_symlink() and p.is_file() and p.stat().st_nlink == 1
    ]
    release = "\n".join(_text_of(p) for p in own)
    lines = [ln.strip() for ln in _text_of(path).splitlines()]
    return [ln for ln in lines if len(ln) > 30 and ln not in release][:30]


def _what_the_learner_sees(course: Path, student: str) -> str:
    """The outputs of the student's graded notebook, every other file of their graded folder, and their feedback."""
    import html

    seen = []
    for path in (course / "autograded" / student).rglob("*"):
        if path.suffix == ".ipynb":
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                seen += [json.dumps(o) for o in cell.get("outputs", [])]
                seen += [
                    "".join(o.get("text", "")) + "".join(o.get("traceback", [])) + o.get("evalue", "")
                    for o in cell.get("outputs", [])
                ]
            seen.append(_text_of(path).split("\n")[0])  # the cell the grader adds on top
        elif path.is_file():
            seen.append(path.read_text(errors="replace"))
    seen.append(html.unescape((course / "feedback" / student / NB / "attention.html").read_text(encoding="utf-8")))
    return "\n".join(seen)


def make_links(course: Path, student: str, how: str) -> None:
    """The link student's submission: unpacked by hand with tar (links kept; hard links added), or a
    zip with links (as `zip -y` stores them) collected by `nbgrader zip_collect`."""
    sub = course / "submitted" / student / NB
    if how == "tar":
        staging = course.parent / f"staging-{student}"
        shutil.copytree(sub, staging)
        shutil.rmtree(sub)
        (staging / "attention.ipynb").unlink()  # the notebook itself a link to the source notebook
        (staging / "attention.ipynb").symlink_to(f"../../../source/{NB}/attention.ipynb")
        for name, target, _ in link_targets(course):
            (staging / name).symlink_to(target)
        (staging / "kvlib-linked").symlink_to(ROOT / "solutions", target_is_directory=True)
        archive = course.parent / f"{student}.tar"
        subprocess.run(["tar", "-cf", str(archive), "-C", str(staging), "."], check=True)
        sub.mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(archive), "-C", str(sub)], check=True)  # as an instructor would
        # hard links too (not to another student's file: that file would be refused in their submission as well)
        os.link(course / "nbgrader_config.py", sub / "hard-config.txt")
        os.link(course / "source" / NB / "attention.ipynb", sub / "hard-source.txt")
        try:
            os.link(ROOT / "solutions" / "kvlib" / "attention.py", sub / "kvlib" / "hard_ref.py")
        except OSError:  # the clone on another file system: no hard link to it possible
            pass
    else:
        archive = course / "downloaded" / NB / "archive" / f"{student}.zip"
        archive.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive, "w") as z:
            for path in sorted(sub.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(sub).as_posix())
            for name, target, _ in link_targets(course):
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o120777 << 16  # a symbolic link
                z.writestr(info, target)
        shutil.rmtree(course / "submitted" / student)
        nbgrader(
            course,
            "zip_collect",
            NB,
            "--log-level=WARN",
            "--FileNameCollectorPlugin.named_regexp=.*/extracted/(?P<student_id>[^/]+)/(?P<file_id>.+)",
            '--FileNameCollectorPlugin.valid_ext=[".ipynb", ".py", ".txt"]',
        )


def snapshot(folder: Path) -> dict:
    """Every entry under folder as it is on disk: links (their target), files (content, link count,
    mode, modification time), folders (mode)."""
    import hashlib
    import stat

    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, folder)
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1:  # a hard link: its other name may change it
                out[rel] = ("hard link",)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    out[rel] = (
                        "file",
                        hashlib.sha256(f.read()).hexdigest(),
                        info.st_nlink,
                        info.st_mode,
                        info.st_mtime_ns,
                    )
            else:
                out[rel] = ("folder", info.st_mode)
    return out


def hand_in(course: Path, student: str, spec: dict) -> None:
    sub = course / "submitted" / student / NB
    shutil.copytree(course / "release" / NB, sub)
    target = sub / "kvlib" / "attention.py"
    if spec["attention"] is None:
        target.unlink()
        target.symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    elif spec["attention"] != "release":
        target.write_text(spec["attention"], encoding="utf-8")
    for rel, text in spec.get("files", {}).items():
        (sub / rel).parent.mkdir(parents=True, exist_ok=True)
        (sub / rel).write_text(text, encoding="utf-8")
    if spec.get("notebook"):
        path = sub / "attention.ipynb"
        nb = json.loads(path.read_text(encoding="utf-8"))
        spec["notebook"](nb)
        path.write_text(json.dumps(nb), encoding="utf-8")


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) .*Sanitizing .*/submitted/([^/]+)/")


def per_student_seconds(log: str, end: float) -> dict[str, float]:
    """Seconds from each submission's "Sanitizing" log line to the next one (the last: to `end`)."""
    from datetime import datetime

    starts = [
        (datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp(), m.group(2))
        for m in map(_STAMP.match, log.splitlines())
        if m
    ]
    out = {}
    for (t, s), nxt in zip(starts, [t for t, _ in starts[1:]] + [end]):
        out[s] = nxt - t
    return out


LOGS: dict = {}  # the graded fixture's autograde log, what changed in submitted/ during it, connections made


def _accept(listener, connections: list) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # closed
            return
        with conn:
            conn.settimeout(5)
            try:
                connections.append(conn.recv(100))
            except OSError:
                connections.append(b"")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A course folder from `kvlib course init`, notebook 01 released, every submission handed in
    and autograded in one call; returns (course, submissions, scores, seconds per student)."""
    from nbgrader.api import Gradebook

    course = tmp_path_factory.mktemp("course")
    if PLANTED.exists():
        PLANTED.unlink()
    proc = run_kvlib("course", "init", str(course))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "nbgrader_config.py", "a") as f:  # tight limits: the scores never wait on the kernel
        f.write(
            "\nc.Execute.timeout = 4\nc.SandboxExecute.notebook_timeout = 12\n"
            "c.IsolatedGrading.call_timeout = 3\nc.IsolatedGrading.notebook_timeout = 60\n"
        )
    nbgrader(course, "generate_assignment", NB, "--log-level=WARN")
    listener = socket.create_server(("127.0.0.1", 0))  # what a19 tries to reach
    LOGS["connections"] = []
    threading.Thread(target=_accept, args=(listener, LOGS["connections"]), daemon=True).start()
    subs = submissions(course, listener.getsockname()[1])
    for student, spec in subs.items():
        hand_in(course, student, spec)
    for student, spec in subs.items():
        if spec.get("links"):
            make_links(course, student, spec["links"])
    before = snapshot(course / "submitted")
    # rc 0: every submission was processed, whatever it did
    proc = nbgrader(course, "autograde", NB, "--Application.log_format=%(asctime)s %(message)s", timeout=1500)
    LOGS["autograde"] = proc.stdout + proc.stderr
    after = snapshot(course / "submitted")
    LOGS["submitted changes"] = sorted(rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel))
    seconds = per_student_seconds(proc.stdout + proc.stderr, time.time())
    print("\nseconds to autograde each submission:", {s: round(t) for s, t in seconds.items()})
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {s.student.id: (s.score, s.max_score) for s in gb.assignment_submissions(NB)}
    listener.close()
    yield course, subs, scores, seconds
    if PLANTED.exists():  # only in plain mode could an attack have put it there
        PLANTED.unlink()


def expected_score(graded, student):
    _, subs, scores, _ = graded
    return scores[student], subs[student]["expected"]


@pytest.mark.parametrize("student", ["z-correct", "z-untouched", "m-partial", "z-helper-module"])
def test_honest_submissions_get_exactly_their_score(graded, student):
    """Check correct -> full marks, untouched release -> 0, softmax and mask only -> their points, correct
    with Exercise 1.1 in a module of the learner's own (kvlib/my_helpers.py) -> full marks, after every attack."""
    (score, max_score), want = expected_score(graded, student)
    assert (score, max_score) == (want, TOTAL)


@pytest.mark.parametrize(
    "student",
    [
        "a01-monkeypatch",
        "a02-input-transformer",
        "a03-fake-numpy",
        "a04-exit-at-import",
        "a05-equal-to-anything",
        "a06-patch-builtins",
        "a07-symlink-to-reference",
        "a10-prints-megabytes",
        "a11-edited-tests",
        "a12-deleted-tests",
        "a13-changed-metadata",
    ],
)
def test_attack_gains_nothing(graded, student):
    """Check that each attack scores what its honest code earns (0 for stubs), out of the notebook's points."""
    (score, max_score), want = expected_score(graded, student)
    assert (score, max_score) == (want, TOTAL)


@JAILED
@pytest.mark.parametrize("student", ["a14-walks-up-for-solutions", "a15-writes-gradebook", "a16-plants-startup-file"])
def test_jailed_attack_gains_nothing(graded, student):
    """Check the attacks only the jail stops: no reference found, gradebook and home untouched."""
    course = graded[0]
    (score, max_score), want = expected_score(graded, student)
    assert (score, max_score) == (want, TOTAL)
    assert not (course / "PWNED").exists()
    assert not PLANTED.exists()


@pytest.mark.parametrize("student", ["a17-links-unpacked-tar", "a18-links-zip-collect"])
def test_links_leak_nothing_and_the_rest_is_graded(graded, student):
    """Check links to the source notebook, the reference, another student's file and nbgrader_config.py
    (symbolic, and hard links, in a hand-unpacked tar; as zip_collect unpacks them): the code that
    prints them finds nothing, the linked "helper" (the reference) earns nothing, the real files
    earn their points, and no line of any target is in the graded folder or the feedback."""
    course = graded[0]
    (score, max_score), want = expected_score(graded, student)
    assert (score, max_score) == (want, TOTAL)
    nbgrader(course, "generate_feedback", NB, f"--student={student}", "--log-level=WARN")
    seen = _what_the_learner_sees(course, student)
    for _, _, target in link_targets(course):
        lines = _secret_lines(target, course, student)
        assert lines, target
        leaked = [ln for ln in lines if ln in seen]
        assert not leaked, f"{target.name} leaked into {student}'s graded notebook or feedback: {leaked[:2]}"


def test_links_are_named_in_the_log_and_the_feedback(graded):
    """Check that every refused link is named in the autograde log and at the top of the learner's
    graded notebook and feedback, with the reason; and that nothing in submitted/ changed."""
    import nbformat

    from kvlib.grading.preprocessor import _plain

    course, student = graded[0], "a17-links-unpacked-tar"
    refused = ["attention.ipynb", "kvlib-linked", "hard-config.txt", "hard-source.txt"]
    refused += [name for name, _, _ in link_targets(course)]
    log = LOGS["autograde"]
    for name in refused:
        assert f"Refused {student}/{NB}/{name}: " in log, name
    note = nbformat.read(course / "autograded" / student / NB / "attention.ipynb", as_version=4).cells[0]
    assert note.cell_type == "markdown" and "refused" in note.source
    for name in refused:
        assert f"- {_plain(name)}: " in note.source, name
    assert "symbolic link" in note.source and "hard link" in note.source
    nbgrader(course, "generate_feedback", NB, f"--student={student}", "--log-level=WARN")
    html = (course / "feedback" / student / NB / "attention.html").read_text(encoding="utf-8")
    assert "The grader refused these files" in html and "notes.txt" in html
    assert LOGS["submitted changes"] == [], f"autograde changed these in submitted/: {LOGS['submitted changes'][:10]}"


@JAILED
def test_jails_have_no_network(graded):
    """Check that code in the jailed kernel and the isolated child cannot reach a server listening on
    the grader's 127.0.0.1 (both jails have a network namespace of their own, with nothing in it)."""
    (score, max_score), want = expected_score(graded, "a19-connects-to-localhost")
    assert (score, max_score) == (want, TOTAL)
    assert LOGS["connections"] == [], f"a jailed process reached 127.0.0.1: {LOGS['connections']}"


@pytest.mark.parametrize("student,limit", [("a08-endless-loop", 90), ("a09-loop-ignores-interrupt", 90)])
def test_endless_loop_costs_its_exercise_only_and_bounded_time(graded, student, limit):
    """Check that an endless loop in one exercise zeroes that exercise, grades the rest, in bounded time."""
    (score, _), want = expected_score(graded, student)
    assert score == want
    assert graded[3][student] < limit, f"{student} took {graded[3][student]:.0f} s to grade"


def _cells(course, student):
    """grade_id -> the graded cell's outputs, each {"output_type", "text" or "evalue"}."""
    import nbformat

    nb = nbformat.read(course / "autograded" / student / NB / "attention.ipynb", as_version=4)
    return {c.metadata.nbgrader.grade_id: c.outputs for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}


def test_feedback_names_the_mistake(graded):
    """Check the outputs the learner sees: "passed", the stub's message, the symlink refusal,
    the endless loop; no graded cell keeps what the kernel printed."""
    course = graded[0]
    partial = _cells(course, "m-partial")
    assert partial["softmax_is_stable"][0]["text"].startswith("passed:")
    assert "Exercise 1.2 (Attention for one query) is not done yet" in partial["attend_matches_sdpa"][0]["evalue"]
    assert "link" in _cells(course, "a07-symlink-to-reference")["softmax_is_stable"][0]["evalue"]
    assert "endless loop" in _cells(course, "a08-endless-loop")["attend_matches_sdpa"][0]["evalue"]
    assert "returned" in _cells(course, "a05-equal-to-anything")["softmax_is_stable"][0]["evalue"]
    for outputs in _cells(course, "a02-input-transformer").values():
        assert [o.output_type for o in outputs] == ["error"]


def test_megabytes_of_output_are_capped(graded):
    """Check that a submission printing megabytes leaves a notebook of bounded size."""
    path = graded[0] / "autograded" / "a10-prints-megabytes" / NB / "attention.ipynb"
    assert path.stat().st_size < 2_000_000


def test_grading_twice_gives_the_same_score_and_feedback(graded):
    """Check that re-autograding a submission reproduces its score and every message."""
    from nbgrader.api import Gradebook

    course = graded[0]
    before = _cells(course, "m-partial")
    nbgrader(course, "autograde", NB, "--student=m-partial", "--force", "--log-level=WARN")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        again = gb.find_submission(NB, "m-partial").score
    assert again == graded[2]["m-partial"][0]
    after = _cells(course, "m-partial")

    def messages(cells):
        return {k: [o.get("evalue", o.get("text")) for o in v] for k, v in cells.items()}

    assert messages(before) == messages(after)


def test_feedback_and_csv_export(graded):
    """Check generate_feedback writes the learner's messages, and export gives the expected scores."""
    course, subs = graded[0], graded[1]
    nbgrader(course, "generate_feedback", NB, "--student=m-partial", "--log-level=WARN")
    html = (course / "feedback" / "m-partial" / NB / "attention.html").read_text(encoding="utf-8")
    assert "is not done yet" in html and (course / "grading_secret").read_text().strip() not in html
    # each graded cell shows its verdict, never its hidden tests (which name the checks)
    assert "passed: " in html and "HIDDEN TESTS" not in html and "grade(" not in html
    nbgrader(course, "export", "--to=grades.csv", "--log-level=WARN")
    rows = list(csv.DictReader(io.StringIO((course / "grades.csv").read_text())))
    got = {r["student_id"]: float(r["score"]) for r in rows}
    assert got == {s: float(spec["expected"]) for s, spec in subs.items()}
    assert {float(r["max_score"]) for r in rows} == {float(TOTAL)}


# ---------------------------------------------------------------------------------------------
# Fast checks of the parts (no nbgrader run)


def test_course_init_never_overwrites_without_force(tmp_path):
    """Check that init refuses to change an instructor's file, and --force keeps a .bak of it."""
    from kvlib.app.course_folder import CourseFolderExists, init_course

    init_course(tmp_path)
    secret = (tmp_path / "grading_secret").read_text()
    assert (tmp_path / "grading_secret").stat().st_mode & 0o777 == 0o600
    config = tmp_path / "nbgrader_config.py"
    config.write_text(config.read_text() + "# mine\n")
    with pytest.raises(CourseFolderExists):
        init_course(tmp_path)
    assert config.read_text().endswith("# mine\n")
    init_course(tmp_path, force=True)
    assert (tmp_path / "nbgrader_config.py.bak").read_text().endswith("# mine\n")
    assert (tmp_path / "grading_secret").read_text() == secret  # never replaced


def test_course_init_lists_learner_files_and_earlier_modules(tmp_path):
    """Check exclude_overwriting, stubs for this notebook, and --earlier given/own for later ones."""
    from traitlets.config.loader import PyFileConfigLoader

    from kvlib.app.course_folder import init_course, learner_edited, learner_files, module_notebooks

    init_course(tmp_path)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert config.Autograde.exclude_overwriting[NB] == ["kvlib/attention.py"]
    stub = (tmp_path / "source" / NB / "kvlib" / "attention.py").read_text()
    assert "### BEGIN SOLUTION" not in stub and 'raise NotImplementedError("Exercise 1.1' in stub
    later = [nb for nb in dict.fromkeys(module_notebooks().values()) if nb != NB]
    if later:  # a notebook after 01: attention.py is given (the reference) or the learner's own
        given = learner_files(later[0], "given")["kvlib/attention.py"].decode()
        assert "np.exp(scores - scores.max" in given and "BEGIN SOLUTION" not in given
        assert "kvlib/attention.py" in learner_edited(later[0], "own")
        assert "kvlib/attention.py" not in learner_edited(later[0], "given")


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_replies_must_be_plain_numbers():
    """Check the grader's reader refuses pickles, compressed members and headers that lie."""
    from kvlib.grading.sandbox import SandboxError, load_reply

    head = np.array(json.dumps({"status": "ok"}))
    assert load_reply(_npz(__head__=head, a0=np.ones(3)))[1]["a0"].sum() == 3
    with pytest.raises(SandboxError):
        load_reply(_npz(__head__=head, a0=np.array([object()], dtype=object)))
    buf = io.BytesIO()
    np.savez_compressed(buf, __head__=head, a0=np.zeros(10))
    with pytest.raises(SandboxError):
        load_reply(buf.getvalue())
    liar = io.BytesIO()
    with zipfile.ZipFile(liar, "w") as z:
        z.writestr("__head__.npy", _npy(head))
        z.writestr("a0.npy", _npy_header((10**9,), "<f8") + b"\0" * 16)
    with pytest.raises(SandboxError):
        load_reply(liar.getvalue())


def test_a_returned_decoder_is_rebuilt_by_the_grader():
    """Check a Decoder in a reply: rebuilt by the grader's own kvlib.core.model from numbers, refused when
    its weights do not match its config or its config is not numbers, and never accepted as a function."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.grading import _child
    from kvlib.grading.sandbox import SandboxError, _check_node

    config = ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=24, max_seq_len=8)
    torch.manual_seed(0)
    sent = Decoder(config).eval()
    enc = _child.Encoder(np, torch)
    node = enc.encode(sent)
    files = {k: np.asarray(v) for k, v in enc.arrays.items()}
    got = _check_node(node, files)
    assert type(got) is Decoder and got.config == config
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        assert torch.equal(got(ids), sent(ids))
    wrong = {**node, "config": {**node["config"], "n_kv_heads": 4}}  # k_proj would need 4 heads of rows
    with pytest.raises(SandboxError, match="do not match"):
        _check_node(wrong, files)
    with pytest.raises(SandboxError, match="not numbers"):
        _check_node({**node, "config": {**node["config"], "d_model": "16"}}, files)
    with pytest.raises(SandboxError, match="too large"):
        _check_node({**node, "config": {**node["config"], "max_seq_len": 1 << 30}}, files)
    with pytest.raises(SandboxError):
        _check_node({"t": "fn", "v": "gqa.to_gqa"}, files)


def test_isolated_calls_copy_back_what_they_change_in_place(tmp_path):
    """Check that a learner's function that changes a tensor argument in place changes the grader's
    tensor too (as it would in the kernel), and that a watched call returns what it allocated."""
    import torch

    from kvlib.grading.sandbox import RemoteFunction, Sandbox, SandboxError, package_files

    files = package_files(ROOT / "kvlib")
    files["kvlib/gqa.py"] = (
        (ROOT / "solutions" / "kvlib" / "gqa.py")
        .read_text(encoding="utf-8")
        .replace("    B, H_kv, S, D = x.shape\n", "    B, H_kv, S, D = x.shape\n    x.mul_(2)\n", 1)
        .encode()
    )
    with Sandbox(
        files,
        ["gqa"],
        ["gqa.repeat_kv", "gqa.grouped_attention"],
        mode="plain",
        torch=True,
        call_timeout=60,
        budget=120,
    ) as sandbox:
        gqa = sandbox.module("gqa")
        x = torch.ones(1, 2, 3, 4)
        out = gqa.repeat_kv(x, 2)
        assert torch.equal(x, torch.full((1, 2, 3, 4), 2.0)) and out.shape == (1, 4, 3, 4)
        q, k = torch.randn(1, 4, 1, 4), torch.randn(1, 2, 5, 4)
        made = gqa.grouped_attention.watch(q, k, k)
        assert made and all(isinstance(op, str) and isinstance(shape, tuple) for op, shape in made)
        assert isinstance(gqa.first_head_of_group, RemoteFunction)
        with pytest.raises(SandboxError, match="only in the isolated child"):
            gqa.first_head_of_group(k, 2, 1)


def test_the_child_keeps_a_learners_cache_and_carries_generators_and_callbacks():
    """Check the objects notebooks 02 and 04 pass: a KVCache made and used in the child through a
    handle, a generator whose state comes back advanced, an on_token callback replayed here."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.generation import next_token
    from kvlib.grading.sandbox import RemoteObject, Sandbox, SandboxError, package_files

    files = package_files(ROOT / "kvlib")
    for module in ("attention", "generation", "kv_cache"):  # 4.x use 1.3's mask and 2.1's sampling
        files[f"kvlib/{module}.py"] = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_bytes()
    functions = ["generation.next_token", "kv_cache.KVCache", "kv_cache.generate_cached"]
    config = ModelConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=24, max_seq_len=32)
    with Sandbox(
        files, ["generation", "kv_cache"], functions, mode="plain", torch=True, call_timeout=60, budget=120
    ) as sandbox:
        kv, gen = sandbox.module("kv_cache"), sandbox.module("generation")
        cache = kv.KVCache(config, batch=1, max_seq_len=8)
        assert isinstance(cache, RemoteObject) and cache.pos == 0 and tuple(cache.k.shape) == (2, 1, 2, 8, 4)
        where = cache.kvlib_data_ptr("k")
        k, _ = cache.update(1, torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
        cache.advance(3)
        assert tuple(k.shape) == (1, 2, 3, 4) and cache.pos == 3 and cache.kvlib_data_ptr("k") == where
        cache.pos = 1  # assigned in the child, as in the kernel
        assert cache.pos == 1
        with pytest.raises(SandboxError, match="private attribute"):
            cache._pos = 0
        ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        logits = torch.randn(6, 13)
        assert torch.equal(gen.next_token(logits, temperature=1.0, generator=theirs), next_token(logits, 1.0, ours))
        assert torch.equal(theirs.get_state(), ours.get_state())  # the child's draws advanced our generator
        torch.manual_seed(0)
        model, seen = Decoder(config).eval(), []
        out = kv.generate_cached(
            model, torch.tensor([[1, 2]]), 4, on_token=lambda t: seen.append(int(t[0])), cache=cache
        )
        assert seen == out[0, 2:].tolist() and cache.pos == 2 + 3  # the cache made before, reset and reused


def test_the_child_keeps_a_schedulers_pool_and_tables_and_carries_requests():
    """Check the objects notebook 07 passes: a BlockPool, BlockTables and a Scheduler kept in the child,
    attributes assigned there (pool.k = ...), Requests and the stats dict carried as numbers, and an
    OutOfBlocks raised there raised here as kvlib.core.paging's own."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.core.paging import OutOfBlocks, Request
    from kvlib.grading.sandbox import RemoteObject, Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    for module in ("attention", "gqa", "serving"):  # 7.3 uses 6.2's grouped_attention
        files[f"kvlib/{module}.py"] = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_bytes()
    functions = ["serving.BlockPool", "serving.BlockTable", "serving.Scheduler", "serving.paged_attention"]
    config = ModelConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=24, max_seq_len=32)
    with Sandbox(files, ["serving"], functions, mode="plain", torch=True, call_timeout=60, budget=120) as sandbox:
        sv = sandbox.module("serving")
        assert sv.Request is Request and sv.OutOfBlocks is OutOfBlocks
        pool, table = sv.BlockPool(config, 4, 4), sv.BlockTable(4)
        assert isinstance(pool, RemoteObject) and isinstance(table, RemoteObject)
        pool.k = torch.ones(2, 4, 2, 4, 4)
        assert torch.equal(pool.k, torch.ones(2, 4, 2, 4, 4))
        assert table.append(pool, 5) == [0, 1, 2, 3, 4] and table.blocks == [0, 1] and pool.n_free == 2
        with pytest.raises(OutOfBlocks):
            table.append(pool, 12)  # 17 tokens: 5 blocks of a pool of 4
        torch.manual_seed(0)
        sched = sv.Scheduler(Decoder(config).eval(), sv.BlockPool(config, 8, 4), max_batch=2)
        sched.add(Request(7, [1, 2, 3], 2))
        waiting = sched.waiting
        assert [(r.id, r.prompt, r.max_new_tokens, r.out) for r in waiting] == [(7, [1, 2, 3], 2, [])]
        sched.step()
        assert sched.stats["decode_steps"] == 1 and [len(r.out) for r in sched.finished] == [2]


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _npy_header(shape, descr) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"shape": shape, "fortran_order": False, "descr": descr})
    return buf.getvalue()


def test_screening_refuses_links_and_reads_the_rest(tmp_path):
    """Check the screening of a submission: symbolic links (to files and folders), hard links to a file
    outside, a pipe and a linked submission folder are refused with the reason and never read; hard
    links between two files of the submission, and everything else, are read."""
    from kvlib.grading.submission import HARDLINK, LINKED_FOLDER, SPECIAL, SYMLINK, read, screen

    top = tmp_path / "submitted"
    sub = top / "alice" / NB
    (sub / "kvlib").mkdir(parents=True)
    (sub / "kvlib" / "attention.py").write_text("mine")
    (sub / "kvlib" / "ref.py").symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    (sub / "linked").symlink_to(ROOT / "solutions", target_is_directory=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.link(outside, sub / "hard.txt")
    (sub / "a.txt").write_text("twice")
    os.link(sub / "a.txt", sub / "kvlib" / "b.txt")  # both names inside: a file like any other
    os.mkfifo(sub / "pipe")
    screened = screen(sub, top=top)
    assert screened.refused == {"hard.txt": HARDLINK, "kvlib/ref.py": SYMLINK, "linked": SYMLINK, "pipe": SPECIAL}
    assert set(screened.files) == {"a.txt", "kvlib/attention.py", "kvlib/b.txt"}
    assert read(screened, "kvlib/attention.py") == b"mine" and read(screened, "kvlib/b.txt") == b"twice"
    for rel in ("kvlib/ref.py", "linked/kvlib/attention.py", "hard.txt", "pipe"):
        with pytest.raises(PermissionError, match="link|not a regular file"):
            read(screened, rel)
    with pytest.raises(FileNotFoundError):
        read(screened, "kvlib/missing.py")
    with pytest.raises(PermissionError, match="larger"):
        read(screened, "kvlib/attention.py", limit=2)
    (top / "bob").symlink_to(top / "alice", target_is_directory=True)
    linked = screen(top / "bob" / NB, top=top)
    assert linked.refused == {".": LINKED_FOLDER} and not linked.files


def test_learner_helper_modules_travel_within_limits(tmp_path):
    """Check which of a learner's own kvlib/ modules go to the isolated child: their own names only
    (never kvlib's), no links, no more than MAX_HELPERS, none over MAX_HELPER_BYTES."""
    from kvlib.grading.submission import MAX_HELPER_BYTES, MAX_HELPERS, helper_modules, reserved_names, screen

    kvlib = tmp_path / "kvlib"
    kvlib.mkdir()
    for name in ("attention", "core", "checks", "__init__", "my_helpers"):
        (kvlib / f"{name}.py").write_text(f"# {name}\n")
    (kvlib / "sub").mkdir()
    (kvlib / "sub" / "deep.py").write_text("# not directly in kvlib/\n")
    (kvlib / "linked.py").symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    (kvlib / "huge.py").write_text("#" * (MAX_HELPER_BYTES + 1))
    for i in range(MAX_HELPERS + 2):
        (kvlib / f"x{i:02d}.py").write_text("")
    reserved = reserved_names(ROOT / "kvlib")
    assert {"attention", "core", "checks", "grading", "__init__"} <= reserved
    taken, refused = helper_modules(screen(tmp_path), reserved)
    assert taken["kvlib/my_helpers.py"] == b"# my_helpers\n"
    assert not {
        "kvlib/attention.py",
        "kvlib/core.py",
        "kvlib/checks.py",
        "kvlib/__init__.py",
        "kvlib/sub/deep.py",
    } & set(taken)
    assert "link" in refused["kvlib/linked.py"] and "larger" in refused["kvlib/huge.py"]
    assert len(taken) == MAX_HELPERS and any("more than" in why for why in refused.values())


# ---------------------------------------------------------------------------------------------
# Notebooks 02 to 06: exercises that take models, caches, generators and callbacks, graded in isolation too


@JAILED
def test_a_jail_has_no_network_and_no_host_paths(tmp_path):
    """Check a jailed process directly: it cannot connect to a server on the grader's 127.0.0.1, finds
    no /proc/self/mountinfo (which would list the host folders behind its binds), and torch still
    finds the CPU's vector instructions in the /proc stand-in."""
    from kvlib.grading.jail import Jail, detect_mode, jail_python, site_dirs

    listener = socket.create_server(("127.0.0.1", 0))
    connections: list = []
    threading.Thread(target=_accept, args=(listener, connections), daemon=True).start()
    sites = site_dirs()
    code = f"""
import os, socket, sys
sys.path.extend({[f"/site{i}" for i in range(len(sites))]!r})
try:
    socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=3).sendall(b"out")
    print("connected")
except OSError as err:
    print("no network:", err.errno)
print("mountinfo" if os.path.exists("/proc/self/mountinfo") else "no mountinfo")
import torch
print("cpu", torch.backends.cpu.get_cpu_capability())
"""
    jail = Jail(detect_mode(), binds={f"/site{i}": p for i, p in enumerate(sites)}, network=False, tmp_mb=64)
    try:
        proc = subprocess.run(
            jail.command([jail_python(), "-I", "-S", "-c", code]),
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            cwd=jail.dir,
            timeout=120,
        )
    finally:
        jail.close()
        listener.close()
    out = proc.stdout
    assert "no network" in out and "no mountinfo" in out, out + proc.stderr[-2000:]
    import torch

    assert f"cpu {torch.backends.cpu.get_cpu_capability()}\n" in out, out  # the same kernels as outside
    assert str(sites[0]) not in out and connections == []


def test_collect_copies_links_as_links(tmp_path):
    """Check the course's `nbgrader collect` step: a link a student put in their exchange folder arrives
    in submitted/ as a link (which autograde then refuses), not as a copy of what it points to."""
    from nbgrader.coursedir import CourseDirectory

    from kvlib.grading.autograde import LinkKeepingCollect

    src = tmp_path / "inbound" / "alice+01-attention+2026-01-01"
    (src / "kvlib").mkdir(parents=True)
    (src / "kvlib" / "attention.py").write_text("mine")
    (src / "notes.txt").symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    (src / "solutions").symlink_to(ROOT / "solutions", target_is_directory=True)
    dest = tmp_path / "submitted" / "alice" / NB
    LinkKeepingCollect(coursedir=CourseDirectory(root=str(tmp_path))).do_copy(str(src), str(dest))
    assert (dest / "kvlib" / "attention.py").read_text() == "mine"
    assert (dest / "notes.txt").is_symlink() and (dest / "solutions").is_symlink()


def test_a_linked_timestamp_or_submission_folder_stops_that_submission(tmp_path):
    """Check that autograde stops, naming why, before nbgrader reads a timestamp.txt that is a link
    (nbgrader reads it before any other step) or anything in a submission folder that is a link."""
    from nbgrader.coursedir import CourseDirectory

    from kvlib.grading.autograde import ScreenedAutograde

    converter = ScreenedAutograde(coursedir=CourseDirectory(root=str(tmp_path)))
    sub = tmp_path / "submitted" / "alice" / NB
    sub.mkdir(parents=True)
    (sub / "timestamp.txt").symlink_to("/dev/zero")
    with pytest.raises(PermissionError, match="timestamp.txt in the submission is a symbolic link"):
        converter.init_destination(NB, "alice")
    (tmp_path / "submitted" / "bob").mkdir()
    (tmp_path / "submitted" / "bob" / NB).symlink_to(tmp_path / "submitted" / "alice" / NB, target_is_directory=True)
    with pytest.raises(PermissionError, match="submission folder is itself a link"):
        converter.init_destination(NB, "bob")
