"""kvlib: the package behind the course on how LLMs generate text.

Dimension key, used in every docstring, comment and plot of the course:
    B  batch         T  seq_len (new tokens in this call)   S  kv_len (keys attended to)
    C  d_model       H  n_heads       H_kv  n_kv_heads       D  head_dim
    group_size = n_heads // n_kv_heads (queries per key/value head)

At the top of the package stand only the learner's modules, one per notebook (LEARNER_MODULES,
read off the exercise table); everything else lives in a subpackage named for its job, bottom up:
core (the model and its weights), course (exercise table, input checks, figures), variants (the
other ways the benchmarks compare with the learner's), study (corpus, training, quality studies),
measure, checks, grading and app (command line, lab, release). Modules are imported lazily, so
that a learner's broken file cannot stop `kvlib check` from reporting on the others.
"""

from __future__ import annotations

import importlib

from kvlib.course.exercises import EXERCISES, LEARNER_MODULES, ExerciseNotDone, solutions_enabled, use_solutions

__all__ = ["EXERCISES", "LEARNER_MODULES", "ExerciseNotDone", "solutions_enabled", "use_solutions"]

_SUBPACKAGES = ("core", "course", "variants", "study", "measure", "checks", "grading", "app")
_SUBMODULES = {*LEARNER_MODULES, *_SUBPACKAGES}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"kvlib.{name}")
    raise AttributeError(f"module 'kvlib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES})
