"""kvlib: the package behind the course on how LLMs generate text.

Dimension key, used in every docstring, comment and plot of the course:
    B  batch         T  seq_len (new tokens in this call)   S  kv_len (keys attended to)
    C  d_model       H  n_heads       H_kv  n_kv_heads       D  head_dim
    group_size = n_heads // n_kv_heads (queries per key/value head)

At the top of the package stand only the learner's modules, one per notebook (attention,
generation, recompute, kv_cache, roofline, gqa); everything else lives in a subpackage named for
its job: core (the model and its weights), course (exercises, input checks, figures), measure,
study (corpus, training, the GQA study), checks, grading and app (command line, lab, release).
Modules are imported lazily, so that a learner's broken file cannot stop `kvlib check` from reporting on the others.
"""

from __future__ import annotations

import importlib

from kvlib.course.exercises import EXERCISES, ExerciseNotDone, solutions_enabled, use_solutions

__all__ = ["EXERCISES", "ExerciseNotDone", "solutions_enabled", "use_solutions"]

_SUBMODULES = {
    "attention",
    "generation",
    "recompute",
    "kv_cache",
    "roofline",
    "gqa",
    "core",
    "measure",
    "study",
    "course",
    "checks",
    "grading",
    "app",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"kvlib.{name}")
    raise AttributeError(f"module 'kvlib' has no attribute {name!r}")
