"""The checks behind `kvlib check`, the notebooks' graded cells and the tests.

<module>.py  one per learner module of the exercise table (CHECK_MODULES): @check functions, one
             property of one exercise each
Each check tests one property of one exercise, compares against a library op (numpy, torch) or
the hand-worked example of notebook 01, and fails with a message that names the likely mistake.
A check takes the module under test (so tests can hand it a deliberately wrong one) and a
numpy Generator for its random inputs. Not here: isolation from the code under test.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import linecache
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kvlib.course import i18n
from kvlib.course.exercises import (
    BY_ID,
    EXERCISES,
    LEARNER_MODULES,
    SHIPPED_CALLS,
    Exercise,
    ExerciseNotDone,
    close_ready_made,
    ready_made,
    select,
    solutions_enabled,
)
from kvlib.course.hints import exercise_title, stuck

BY_NAME = {(ex.module, ex.name.split(".")[-1]): ex for ex in EXERCISES}  # (module, function) -> exercise


@dataclass(frozen=True)
class Check:
    name: str  # unique across the course: "<function>_<property>"
    exercise: Exercise
    fn: Callable  # fn(module, rng) -> None; raises AssertionError with a plain message

    @property
    def doc(self) -> str:
        """The property checked: the docstring's first paragraph on one line (first_paragraph)."""
        return first_paragraph(self.fn.__doc__)


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph on one line, as a check's verdict line shows it (its first line may wrap
    mid-sentence); kvlib/app/translate.py keys the catalogue's translation of it the same way."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


CHECKS: dict[str, Check] = {}  # by name, in registration (= course) order
CHECK_MODULES = LEARNER_MODULES  # kvlib.checks.<module> for every learner module of the exercise table


def check(exercise_id: str):
    """Register a check of exercise `exercise_id`; the function's name is the check's name."""

    def register(fn):
        if fn.__name__ in CHECKS:
            raise ValueError(f"two checks named {fn.__name__}")
        CHECKS[fn.__name__] = Check(fn.__name__, BY_ID[exercise_id], fn)
        return fn

    return register


def _load_all() -> None:
    for module in CHECK_MODULES:
        importlib.import_module(f"kvlib.checks.{module}")


def checks_for(ex: Exercise) -> list[Check]:
    _load_all()
    return [c for c in CHECKS.values() if c.exercise is ex]


# ---------------------------------------------------------------------------------------------
# Memory, where the isolated grader measures it

MB = 1 << 20
# what an honest child may hold beyond its boot: kvlib's modules, torch's lazy set-up, the check's small objects
HELD_SLACK = 16 * MB


def isolated(fn) -> bool:
    """Whether fn runs in the isolated grader's child (a kvlib.grading sandbox function), not in this process."""
    return getattr(fn, "memory", None) is not None


def memory_of(fn, *args):
    """(result, Usage) of fn(*args) where the grading process measures the call's memory (in the isolated grader:
    fn.memory, read in the child's /proc by kvlib.grading.memory, out of the learner's code's reach); None where
    it cannot (a local run, which watches the tensors fn allocates instead: kvlib.measure.timing.new_tensors)."""
    memory = getattr(fn, "memory", None)
    return None if memory is None else memory(*args)


def held_nothing_before(usage, name: str, allowed: int = 0) -> None:
    """Fail if the child held more than `allowed` bytes (the check's own objects there) plus HELD_SLACK beyond its
    boot when fn was called: a buffer made at import or kept from an earlier call, written in place, would hide
    what a call uses from the measure of its peak."""
    extra = usage.held - allowed
    assert extra <= HELD_SLACK, (
        f"when {name} was called, its process already held {extra / MB:.0f} MB more than the learner's modules and "
        f"the check's own objects need: memory kept between calls (a tensor at module level, a cache of results) "
        "hides what a call uses, so the grader counts it as used. Keep no large tensors between calls"
    )


# ---------------------------------------------------------------------------------------------
# Running checks


@dataclass(frozen=True)
class Result:
    id: str
    title: str
    notebook: str
    status: str  # "pass", "fail" or "todo"
    message: str

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "notebook": self.notebook,
            "status": self.status,
            "message": self.message,
        }


class CheckTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float | None, message: str | None = None):
    """Interrupt a check that runs too long (an endless loop in learner code). Unix, main thread. Nests: inside
    another limit, the sooner one holds, and the outer one runs on afterwards with what it had left."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return
    outer_left = signal.getitimer(signal.ITIMER_REAL)[0]

    def _raise(signum, frame):
        if message:
            raise CheckTimeout(message)
        raise CheckTimeout(f"still running after {seconds:g} s: look for an endless loop")

    old = signal.signal(signal.SIGALRM, _raise)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_left:  # the outer limit's time, less this one's
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 1e-3))


def _explain(err: BaseException, ex: Exercise) -> str:
    """The first failure in plain words.

    A check's AssertionError already names the cause. Anything else was raised inside the learner's
    code (a shape mismatch, numpy handed to torch): say which exercise's function raised it, where,
    with which arguments (their shapes and dtypes), and what its docstring promises to take and give.
    In the learner's language (kvlib.course.i18n): a check's message as its translation has it.
    """
    if isinstance(err, AssertionError):
        return i18n.translate(str(err)) if str(err) else i18n.tr("an assertion failed")
    frame = _learner_frame(err, ex)
    if frame is None:
        return f"{type(err).__name__}: {err}"
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    called = BY_NAME.get((ex.module, frame.f_code.co_name))
    name = called.name if called else frame.f_code.co_name
    error = f"{type(err).__name__}: {err}"
    where = dict(error=error, name=name, file=ex.file, line=frame.f_lineno, code=line)
    text = (
        i18n.tr("{error} (in {name}, at {file} line {line}: {code})", **where)
        if line
        else (i18n.tr("{error} (in {name}, at {file} line {line})", **where))
    )
    args = _arguments(frame)
    if args:
        text += i18n.tr("; it was called with {args}", args=args)
    contract = _contract(called) if called else ""
    if contract:
        text += i18n.tr("; Exercise {id} expects {contract}", id=called.id, contract=contract)
    return text


def _learner_frame(err: BaseException, ex: Exercise):
    """The outermost frame of the traceback that runs in the learner's file kvlib/<module>.py: the
    exercise function the check called (None if the error never reached the learner's code)."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("/" + ex.file):
            return tb.tb_frame
        tb = tb.tb_next
    return None


def _describe(value) -> str:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:  # a numpy array or a torch tensor
        return f"{type(value).__module__.split('.')[0]} {type(value).__name__} {tuple(shape)} {dtype}"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    return type(value).__name__


def _arguments(frame) -> str:
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return ", ".join(f"{n}={_describe(frame.f_locals[n])}" for n in names if n in frame.f_locals and n != "self")


def _contract(called: Exercise) -> str:
    """The Args:/Returns: lines of an exercise's docstring, on one line."""
    try:
        obj = importlib.import_module(f"kvlib.{called.module}")
        for part in called.name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return ""
    keep, out = False, []
    for line in (inspect.getdoc(obj) or "").splitlines():
        head = line.split(":")[0].strip()
        if head in {"Args", "Returns"}:
            keep = True
        elif head in {"Raises", "Example", "Examples"} or not line.strip():
            keep = False
        if keep:
            out.append(" ".join(line.split()))
    return " ".join(out)


class Graded:
    """The learner's module as a local run hands it to a check: an exercise function that kvlib answers ready-made
    (kvlib.course.exercises.READY_MADE) runs with those answers closed, as the isolated grader's child runs it."""

    def __init__(self, module, name: str):
        self._module, self._name = module, name
        self.__wrapped__ = module  # what it views: a fake clock patches that module's imported clocks

    def __getattr__(self, attr):
        value = getattr(self._module, attr)
        entries = ready_made(f"{self._name}.{attr}") if callable(value) else []
        if not entries:
            return value

        @functools.wraps(value)
        def closed(*args, **kwargs):
            reopen = close_ready_made(entries)
            try:
                return value(*args, **kwargs)
            finally:
                reopen()

        return closed


def run_exercise(ex: Exercise, *, seed: int = 0, timeout: float | None = 60, _outer=frozenset()) -> Result:
    """Run every check of one exercise on your kvlib (or the reference in reference mode). A failure that ran an
    earlier find-and-fix exercise's shipped body, which still fails its own checks, names that bug to fix first."""

    def result(status, message=""):
        return Result(ex.id, ex.title, ex.notebook, status, message)

    try:
        module = importlib.import_module(f"kvlib.{ex.module}")
    except Exception as err:  # a syntax error in one learner file must not stop the others
        return result(
            "fail", i18n.tr("{file} does not import: {error}", file=ex.file, error=f"{type(err).__name__}: {err}")
        )
    for c in checks_for(ex):
        SHIPPED_CALLS.clear()
        try:
            with time_limit(timeout):
                c.fn(Graded(module, ex.module), np.random.default_rng(seed))
        except ExerciseNotDone as err:
            if err.exercise is ex:
                return result("todo", i18n.tr("not started: fill in {name} in {file}", name=ex.name, file=ex.file))
            # an earlier exercise is unfinished, so this one cannot be judged yet: name it
            first = err.exercise
            title = exercise_title(first)
            text = i18n.tr("do Exercise {id} ({title}) first: {error}", id=first.id, title=title, error=err)
            return result("todo", text)
        except Exception as err:
            if first := _unfixed(SHIPPED_CALLS - {ex} - _outer, seed, timeout, _outer | {ex}):
                text = i18n.tr(
                    "do Exercise {id} ({title}) first: it ran here and still fails its own checks (kvlib check {id})",
                    id=first.id,
                    title=exercise_title(first),
                )
                return result("todo", text)
            return result("fail", f"{c.name}: {_explain(err, ex)} {stuck(ex.id)}")
    return result("pass")


def shipped_note(*exercise_ids: str) -> list[str]:
    """Before a cell that runs find-and-fix exercises' bodies (a measurement, a claim): print one line for each that
    does not pass its checks yet, so that what the cell prints is read as coming from that body; returns the lines.
    Nothing in reference mode. Example: shipped_note("2.2") before a cell that generates text."""
    if solutions_enabled():
        return []
    lines = []
    for ex_id in exercise_ids:
        ex = BY_ID[ex_id]
        if ex.kind != "fix":
            raise ValueError(f"Exercise {ex_id} is not a find-and-fix exercise (its kind is {ex.kind!r})")
        if run_exercise(ex).status != "pass":
            lines.append(
                i18n.tr(
                    "Exercise {id} does not pass its checks yet (kvlib check {id}): what this cell prints runs its "
                    "body as it stands",
                    id=ex.id,
                )
            )
    for line in lines:
        print(line)
    return lines


def _unfixed(shipped, seed, timeout, outer) -> Exercise | None:
    """The first, in course order, of the find-and-fix exercises that ran whose own checks still fail."""
    for ex in sorted(shipped, key=EXERCISES.index):
        if run_exercise(ex, seed=seed, timeout=timeout, _outer=outer).status != "pass":
            return ex
    return None


def run(selector: str | None = None, **kwargs) -> list[Result]:
    return [run_exercise(ex, **kwargs) for ex in select(selector)]


CELL_PREFIX = "checks-"


def cell_id(ex: Exercise) -> str:
    """The nbgrader grade_id of an exercise's one graded cell: "checks-X-Y" (every check of X.Y)."""
    return CELL_PREFIX + ex.id.replace(".", "-")


def checks_of_cell(grade_id: str, registry: dict[str, Check] | None = None) -> list[Check]:
    """The checks a graded cell runs: all of kvlib's checks of an exercise for "checks-X-Y", else the one
    check of that name (an instructor's own cell); [] when the name is neither. registry: CHECKS by default (the
    grader passes kvlib's checks plus the instructor's)."""
    if registry is None:
        _load_all()
        registry = CHECKS
    if grade_id in registry:
        return [registry[grade_id]]
    if grade_id.startswith(CELL_PREFIX):
        ex_id = grade_id[len(CELL_PREFIX) :].replace("-", ".")
        return [c for c in registry.values() if c.exercise.id == ex_id and c.fn.__module__.startswith(__name__ + ".")]
    return []


def grade(name: str, *, seed: int = 0, timeout: float | None = 60) -> None:
    """Run a graded cell's checks on your kvlib ("checks-X-Y": every check of exercise X.Y; or one check
    by name); print each verdict, and raise AssertionError naming every failure if one fails.

    Used by the graded cells' hidden tests when a notebook is graded in its kernel: all or nothing,
    where the isolated grader (kvlib.grading.preprocessor) gives points for each check that passes.
    """
    cell = checks_of_cell(name)
    if not cell:
        raise KeyError(f"no check and no exercise's cell named {name!r}")
    failures = []
    for c in cell:
        module = importlib.import_module(f"kvlib.{c.exercise.module}")
        try:
            with time_limit(timeout):
                c.fn(Graded(module, c.exercise.module), np.random.default_rng(seed))
        except ExerciseNotDone:
            raise
        except Exception as err:  # the cause named, then where the hints are
            failures.append((c, err))
            print(i18n.tr("failed: {check}", check=i18n.translate(c.doc)))
        else:
            print(i18n.tr("passed: {check}", check=i18n.translate(c.doc)))
    if failures:
        c, err = failures[0]
        text = "; ".join(f"{c.name}: {_explain(err, c.exercise)}" for c, err in failures)
        failed = i18n.tr("{failed} of {total} checks failed: {text}", failed=len(failures), total=len(cell), text=text)
        raise AssertionError(f"{failed} {stuck(c.exercise.id)}") from err


__all__ = [
    "CHECKS",
    "EXERCISES",
    "Check",
    "Graded",
    "Result",
    "cell_id",
    "check",
    "checks_for",
    "checks_of_cell",
    "grade",
    "run",
    "run_exercise",
    "shipped_note",
]
