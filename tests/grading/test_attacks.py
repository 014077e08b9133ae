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
import threading
import time
import zipfile
from pathlib import Path

import pytest
from conftest import JAILED, NB, ROOT, accept_connections, grading_mode, nbgrader, run_kvlib

from kvlib.app import class_bench

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


ALL = ("1.1", "1.2", "1.3", "1.4", "1.5")


POINTS, TOTAL = class_bench.points(NB)  # {"1.1": 5, ...}, their sum
ZH_NOTEBOOK = ROOT / "notebooks" / "zh-CN" / NB / "attention.ipynb"  # the Chinese release (kvlib/app/translate.py)
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
    cells[0]["metadata"]["nbgrader"].update(points=100, solution=True)
    cells[1]["metadata"]["nbgrader"]["grade"] = False
    cells[2]["metadata"]["nbgrader"]["grade_id"] = "renamed"
    del cells[3]["metadata"]["nbgrader"]
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
                    "1.5": "return np.zeros(2)",
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
                    "1.5": "return _Anything()",
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
        # Exercise 1.5, a design: the named slip (straight at 爱) scores 0 there, another right query full marks
        "m-aim-slip": dict(
            expected=TOTAL - POINTS["1.5"], attention=attention(ALL, replace={"1.5": "return np.array([0.0, 3.0])"})
        ),
        "m-aim-other": dict(expected=TOTAL, attention=attention(ALL, replace={"1.5": "return np.array([-3.0, 0.0])"})),
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
        # Exercise 1.4 with a softmax by log-sum-exp, exp(s - logsumexp(s)): right, to ~5e-4 at scores of -2.8e12
        "z-logsumexp": dict(
            expected=TOTAL,
            attention=attention(
                ALL,
                replace={
                    "1.4": (
                        "T, S = q.shape[-2], k.shape[-2]\n"
                        "scores = np.where(causal_mask(T, S), q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]), -np.inf)\n"
                        "m = scores.max(axis=-1, keepdims=True)\n"
                        "probs = np.exp(scores - (m + np.log(np.exp(scores - m).sum(axis=-1, keepdims=True))))\n"
                        "return probs @ v, probs"
                    )
                },
            ),
        ),
    }
    if ZH_NOTEBOOK.is_file():  # m-partial's code with the Chinese notebook: m-partial's score (issue 50)
        subs["m-partial-zh-CN"] = dict(subs["m-partial"], notebook_file=ZH_NOTEBOOK)
    if grading_mode() != "plain":
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
                # correct code whose import, in the kernel, reaches for the checks' reference computations
                "a21-reads-the-checks": dict(
                    expected=TOTAL,
                    attention=attention(ALL, epilogue=READS_THE_CHECKS),
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
READS_THE_CHECKS = """
import glob as _glob, sys as _sys
try:  # the checks' reference computations, imported, as a library
    import kvlib.checks.attention as _ch
    print("CHECKS-IMPORTED", _ch.__file__)
except Exception as _err:
    print("CHECKS-REFUSED", type(_err).__name__)
for _dir in _sys.path:  # and read as files, wherever a kvlib/checks/ is
    for _path in _glob.glob(_dir + "/kvlib/checks/*.py"):
        if "def check" in open(_path).read() and not _path.endswith("__init__.py"):
            print("CHECKS-READ", _path)
try:
    from kvlib.checks import grade as _grade
    print("GRADE-IMPORTS")
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
    """Lines of a link's target that a leak would show: long ones, and hidden tests, that the learner does not have already
    (in the release, or in their own files: a17's attention.py solves 1.1 as the reference does)."""
    own = [p for p in (course / "release" / NB).rglob("*") if p.is_file()]
    own += [
        p
        for p in (course / "submitted" / student / NB).rglob("*")
        if not p.is_symlink() and p.is_file() and p.stat().st_nlink == 1
    ]
    release = "\n".join(_text_of(p) for p in own)
    lines = [ln.strip() for ln in _text_of(path).splitlines()]
    # a hidden test is short (grade("checks-1-1")) but secret: it names the checks
    return [ln for ln in lines if (len(ln) > 30 or "grade(" in ln) and ln not in release][:30]


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
    path = sub / "attention.ipynb"
    if spec.get("notebook_file"):  # another release of the same assignment handed in: the Chinese one
        shutil.copyfile(spec["notebook_file"], path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    if spec.get("notebook"):
        spec["notebook"](nb)
    if student.startswith("a"):  # an attack adds a cell of its own, so its notebook runs in the jailed kernel
        nb["cells"].append(
            {
                "cell_type": "code",
                "id": "mine",
                "metadata": {},
                "source": "import kvlib.attention",
                "outputs": [],
                "execution_count": None,
            }
        )
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
        # (a cell's 5 s: a21's printed proof comes from the kernel's first cell, whose imports take 1-2 s since
        # notebook 01's kernel loads no torch; they took over 4 s on a loaded CI machine when it did)
        f.write(
            "\nc.Execute.timeout = 5\nc.SandboxExecute.notebook_timeout = 10\n"
            "c.IsolatedGrading.call_timeout = 3\nc.IsolatedGrading.notebook_timeout = 60\n"
        )
    nbgrader(course, "generate_assignment", NB, "--log-level=WARN")
    listener = socket.create_server(("127.0.0.1", 0))  # what a19 tries to reach
    LOGS["connections"] = []
    threading.Thread(target=accept_connections, args=(listener, LOGS["connections"]), daemon=True).start()
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


@pytest.mark.parametrize(
    "student", ["z-correct", "z-untouched", "m-partial", "z-helper-module", "m-aim-slip", "m-aim-other", "z-logsumexp"]
)
def test_honest_submissions_get_exactly_their_score(graded, student):
    """Check that honest submissions get exactly their score after every attack: correct -> full marks,
    untouched release -> 0, softmax and mask only -> their points, correct with Exercise 1.1 in a module of the
    learner's own (kvlib/my_helpers.py) -> full marks; 1.5's design aimed straight at 爱 -> all but 1.5's points,
    another query that meets its target -> full marks; 1.4's softmax by log-sum-exp -> full marks."""
    (score, max_score), want = expected_score(graded, student)
    assert (score, max_score) == (want, TOTAL)


def test_a_chinese_submission_scores_what_its_english_twin_scores(graded):
    """Check that m-partial's code handed in with the Chinese notebook 01 (its markdown Chinese; its cells, ids and
    graded cells the English ones) gets m-partial's score in the same autograde of the English course."""
    course, subs, scores, _ = graded
    if "m-partial-zh-CN" not in subs:
        pytest.skip("notebook 01 is not translated into zh-CN yet")
    assert scores["m-partial-zh-CN"] == scores["m-partial"] == (subs["m-partial"]["expected"], TOTAL)
    handed = json.loads((course / "submitted" / "m-partial-zh-CN" / NB / "attention.ipynb").read_text(encoding="utf-8"))
    assert handed["metadata"]["kvlib"]["lang"] == "zh-CN"


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
    """Check that the attacks only the jail stops gain nothing: no reference found, gradebook and home untouched."""
    course = graded[0]
    (score, max_score), want = expected_score(graded, student)
    assert (score, max_score) == (want, TOTAL)
    assert not (course / "PWNED").exists()
    assert not PLANTED.exists()


@pytest.mark.parametrize("student", ["a17-links-unpacked-tar", "a18-links-zip-collect"])
def test_links_leak_nothing_and_the_rest_is_graded(graded, student):
    """Check that links leak nothing and the rest is graded: links to the source notebook, the reference,
    another student's file and nbgrader_config.py (symbolic, and hard links, in a hand-unpacked tar; as
    zip_collect unpacks them): the code that prints them finds nothing, the linked "helper" (the reference)
    earns nothing, the real files earn their points, and no line of any target is in the graded folder or the
    feedback."""
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
@JAILED
def test_the_checks_are_not_in_the_kernel_while_graded(graded):
    """Check that a submission's code run in the notebook's kernel during autograde can neither import the checks'
    reference computations nor read their files (every kvlib/checks/ there is a stand-in with grade() only), that
    the notebook's own `from kvlib.checks import grade` still works there, and that the code earns full marks."""
    import nbformat

    course = graded[0]
    (score, max_score), want = expected_score(graded, "a21-reads-the-checks")
    assert (score, max_score) == (want, TOTAL)
    nb = nbformat.read(course / "autograded" / "a21-reads-the-checks" / NB / "attention.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "CHECKS-REFUSED" in printed and "GRADE-IMPORTS" in printed, printed[:2000]
    assert "CHECKS-IMPORTED" not in printed and "CHECKS-READ" not in printed, printed[:2000]


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
    """Check that the outputs the learner sees name what happened: "passed", the stub's message, the symlink
    refusal, the endless loop, a softmax of zeros; no graded cell keeps what the kernel printed."""
    course = graded[0]

    def said(student, cell):
        return "".join(o.get("text", "") + o.get("evalue", "") for o in _cells(course, student)[cell])

    partial = _cells(course, "m-partial")
    assert [o.output_type for o in partial["checks-1-1"]] == ["stream"] and said("m-partial", "checks-1-1").startswith(
        "passed:"
    )
    assert "Exercise 1.2 (Attention for one query) is not done yet" in said("m-partial", "checks-1-2")
    assert "link" in said("a07-symlink-to-reference", "checks-1-1")
    assert "endless loop" in said("a08-endless-loop", "checks-1-2")
    assert "returned" in said("a05-equal-to-anything", "checks-1-1")
    assert "爱 and AI take 0.488 each" in said("m-aim-slip", "checks-1-5")  # the design's slip, named
    assert "softmax returned zeros" in said("a01-monkeypatch", "checks-1-1")  # the cause, not a guess at keepdims
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
    """Check that generate_feedback writes the learner's messages, and export gives the expected scores."""
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


def test_only_notebooks_with_cells_of_their_own_run_in_the_kernel(graded):
    """Check that an honest submission's unchanged notebook was not run in the kernel (its feedback says so)
    while an attack that added a cell was, and both were scored (SandboxExecute.run_kernel = when-needed)."""
    import nbformat

    from kvlib.grading.execute import NOT_RUN

    def outputs(student):
        nb = nbformat.read(graded[0] / "autograded" / student / NB / "attention.ipynb", as_version=4)
        return [
            o
            for c in nb.cells
            if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade")
            for o in c.outputs
        ]

    assert [o.get("text") for o in outputs("z-correct")] == [NOT_RUN]
    ran = outputs("a01-monkeypatch")
    assert ran and NOT_RUN not in [o.get("text") for o in ran]
    assert graded[2]["z-correct"][0] == TOTAL
