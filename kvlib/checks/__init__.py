"""The checks behind `kvlib check`, the notebooks' graded cells and the tests.

Each check tests one property of one exercise, compares against a library op (numpy, torch) or
the hand-worked example of notebook 01, and fails with a message that names the likely mistake.
A check takes the module under test (so tests can hand it a deliberately wrong one) and a
numpy Generator for its random inputs. Not here: isolation from the code under test.
"""

from __future__ import annotations

import importlib
import signal
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kvlib.course.exercises import BY_ID, EXERCISES, Exercise, ExerciseNotDone


@dataclass(frozen=True)
class Check:
    name: str  # unique across the course: "<function>_<property>"
    exercise: Exercise
    fn: Callable  # fn(module, rng) -> None; raises AssertionError with a plain message

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0]


CHECKS: dict[str, Check] = {}  # by name, in registration (= course) order
_CHECK_MODULES = {
    "attention",
    "generation",
    "recompute",
    "kv_cache",
    "roofline",
    "gqa",
    "serving",
    "compress",
    "speculative",
}  # kvlib.checks.<module> for every exercise module


def check(exercise_id: str):
    """Register a check of exercise `exercise_id`; the function's name is the check's name."""

    def register(fn):
        if fn.__name__ in CHECKS:
            raise ValueError(f"two checks named {fn.__name__}")
        CHECKS[fn.__name__] = Check(fn.__name__, BY_ID[exercise_id], fn)
        return fn

    return register


def _load_all() -> None:
    for module in sorted(_CHECK_MODULES):
        importlib.import_module(f"kvlib.checks.{module}")


def checks_for(ex: Exercise) -> list[Check]:
    _load_all()
    return [c for c in CHECKS.values() if c.exercise is ex]


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
def _time_limit(seconds: float | None):
    """Interrupt a check that runs too long (an endless loop in learner code). Unix, main thread."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise CheckTimeout(f"still running after {seconds:g} s: look for an endless loop")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _explain(err: BaseException, ex: Exercise) -> str:
    """The first failure in plain words: the message, plus where in the learner's file it broke."""
    if isinstance(err, AssertionError):
        return str(err) or "an assertion failed"
    where = ""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename.replace("\\", "/").endswith("/" + ex.file):
            where = f" (at {ex.file} line {frame.lineno}: {frame.line})"
            break
    return f"{type(err).__name__}: {err}{where}"


def run_exercise(ex: Exercise, *, seed: int = 0, timeout: float | None = 60) -> Result:
    """Run every check of one exercise on your kvlib (or the reference in reference mode)."""

    def result(status, message=""):
        return Result(ex.id, ex.title, ex.notebook, status, message)

    try:
        module = importlib.import_module(f"kvlib.{ex.module}")
    except Exception as err:  # a syntax error in one learner file must not stop the others
        return result("fail", f"{ex.file} does not import: {type(err).__name__}: {err}")
    for c in checks_for(ex):
        try:
            with _time_limit(timeout):
                c.fn(module, np.random.default_rng(seed))
        except ExerciseNotDone as err:
            if err.exercise is ex:
                return result("todo", f"not started: fill in {ex.name} in {ex.file}")
            # an earlier exercise is unfinished, so this one cannot be judged yet: name it
            return result("todo", f"do Exercise {err.exercise.id} ({err.exercise.title}) first: {err}")
        except Exception as err:
            return result("fail", f"{c.name}: {_explain(err, ex)}")
    return result("pass")


def run(selector: str | None = None, **kwargs) -> list[Result]:
    from kvlib.course.exercises import select

    return [run_exercise(ex, **kwargs) for ex in select(selector)]


def grade(name: str, *, seed: int = 0, timeout: float | None = 60) -> None:
    """Run one named check on your kvlib; raise AssertionError with its message if it fails.

    Used by the graded cells of the notebooks.
    """
    _load_all()
    if name not in CHECKS:
        raise KeyError(f"no check named {name!r}")
    c = CHECKS[name]
    module = importlib.import_module(f"kvlib.{c.exercise.module}")
    with _time_limit(timeout):
        c.fn(module, np.random.default_rng(seed))
    print(f"passed: {c.doc}")


__all__ = ["CHECKS", "EXERCISES", "Check", "Result", "check", "checks_for", "grade", "run", "run_exercise"]
