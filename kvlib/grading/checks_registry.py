"""Which checks grade a notebook: kvlib's own and the instructor's extra ones, and which of them run
on the submission's code in the isolated child. Imported by the kernel step (execute.py), which
skips those checks' hidden cells, and by the grading step (preprocessor.py), which runs them.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from nbgrader.coursedir import CourseDirectory

from kvlib import checks
from kvlib.checks import cell_id, checks_of_cell
from kvlib.course.exercises import LEARNER_MODULES

_loaded_extras: set[str] = set()


def load_checks(extra: list[str], root: Path) -> dict:
    """kvlib's checks plus the instructor's: module names, or .py files relative to the course
    folder, whose @check functions register themselves (kvlib.checks.check)."""
    checks._load_all()
    for entry in extra:
        if entry in _loaded_extras:
            continue
        if entry.endswith(".py"):
            path = (root / entry).resolve()
            name = "kvlib_course_checks_" + re.sub(r"\W", "_", path.stem)
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or not path.is_file():
                raise FileNotFoundError(f"IsolatedGrading.extra_checks names {entry}, which is not in {root}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            importlib.import_module(entry)
        _loaded_extras.add(entry)
    return checks.CHECKS


# The learner modules whose functions the proxy carries to the isolated child: every module of the
# exercise table but NOT_PROXYABLE. Their functions take numbers, arrays, tensors (int8 too),
# dtypes, ModelConfigs, Decoders and Attention layers (config and weights; a Decoder that comes back
# is rebuilt by the grader's own kvlib.core.model), functions to call back (replayed from the
# child's record), torch Generators (their state, carried both ways), kvlib.core.paging Requests
# (their numbers) and the learner's own objects (a KVCache, BlockPool, BlockTable, Scheduler or
# SinkCache stays in the child, used through a handle). A module of a later notebook whose checks
# need something else is graded the usual nbgrader way, in the (jailed) kernel while it is in
# NOT_PROXYABLE: that keeps the gradebook, the secret and the solutions out of reach but can be
# fooled by the submission's own code.
# Objects of the checks' own classes (notebook 10's model that counts its forward passes, its cache,
# drafters) stay here: the child gets stand-ins whose every use this process serves (sandbox.py).
NOT_PROXYABLE: set[str] = set()
PROXYABLE_MODULES = set(LEARNER_MODULES) - NOT_PROXYABLE


def isolatable(check) -> bool:
    return check.exercise.module in PROXYABLE_MODULES


def isolated_cell_ids(config) -> set[str]:
    """grade_ids of the graded cells IsolatedGrading will score under this configuration: each check's
    name (an instructor's own cell) and each exercise's "checks-X-Y" whose checks all run isolated."""
    root = Path(CourseDirectory(config=config).root)
    extra = list(config.IsolatedGrading.get("extra_checks", []))
    registry = load_checks(extra, root)
    names = {name for name, c in registry.items() if isolatable(c)}
    exercises = {c.exercise for c in registry.values()}
    cells = {cell_id(ex) for ex in exercises if all(isolatable(c) for c in checks_of_cell(cell_id(ex), registry))}
    return names | cells
