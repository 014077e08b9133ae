"""pytest runs the course in reference mode: every exercise resolves to solutions/kvlib.

The environment variable is set here, before anything imports kvlib, so that notebook kernels
and command-line runs started by the tests inherit it. Tests of learner mode override it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["KVLIB_SOLUTIONS"] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent

# Fixtures that run whole notebooks, nbgrader, a benchmark or a browser: a test using one is slow.
# `pytest -m "not slow"` (the contributor's quick loop) leaves those tests out.
SLOW_FIXTURES = {"graded", "graded_sizes", "released", "server", "page", "quick_gqa_report"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def learner_mode(monkeypatch):
    """Run a test against the learner stubs in kvlib/, as a fresh clone has them."""
    import kvlib

    monkeypatch.setenv("KVLIB_SOLUTIONS", "0")
    kvlib.use_solutions(False)
    yield
    kvlib.course.exercises._forced = None


def run_kvlib(*args, env=None, cwd=ROOT, timeout=300):
    """Run the kvlib command line in a child process; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kvlib", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def handed_in(module, names, **replaced):
    """What a learner hands in, as a check sees it: `names` of a kvlib module (the reference, in
    reference mode), with some replaced by deliberately other implementations."""
    import types

    handed = types.SimpleNamespace(**{name: getattr(module, name) for name in names})
    for name, value in replaced.items():
        setattr(handed, name, value)
    return handed
