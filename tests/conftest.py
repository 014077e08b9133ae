"""pytest runs the course in reference mode: every exercise resolves to solutions/kvlib.

The environment variable is set here, before anything imports kvlib, so that notebook kernels
and command-line runs started by the tests inherit it. Tests of learner mode override it.
"""

import io
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

os.environ["KVLIB_SOLUTIONS"] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Bytecode is cached, as Python does unless told not to: where PYTHONDONTWRITEBYTECODE is set (on this project's
# machines it is), each of the three workers rewrote every test file's asserts again (its collection 7.5 -> 5.1 CPU-s
# with the caches; what the suite starts gains little, ~0.07 CPU-s a process). The caches go to __pycache__ (git
# ignores it; releases leave it out). A PYTHONPYCACHEPREFIX folder would miss site-packages' caches: torch recompiled.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

ROOT = Path(__file__).resolve().parent.parent

# Fixtures that run whole notebooks, nbgrader, a benchmark or a browser: a test using one is slow.
# `pytest -m "not slow"` (the contributor's quick loop) leaves those tests out.
SLOW_FIXTURES = {"graded", "graded_sizes", "released", "server", "page", "quick_gqa_report"}


# Files whose tests stand apart per notebook: each notebook's tests may run on either worker (its own
# executed notebook there), instead of the whole file waiting on one worker. (tests/grading/test_course_notebooks.py
# is one unit: it grades every notebook in one nbgrader process, whose start-up costs more than a notebook's grading.)
SPLIT_BY_NOTEBOOK = {"test_notebooks.py"}
_NOTEBOOK = re.compile(r"(?:notebook_|\[)(\d\d)")


def scheduling_unit(nodeid: str) -> str:
    """The tests pytest-xdist sends to one worker together: a file (so its module fixtures, a graded course or a
    JupyterHub term, are made once), or in SPLIT_BY_NOTEBOOK a file's tests of one notebook."""
    path, _, name = nodeid.partition("::")
    if path.rsplit("/", 1)[-1] in SPLIT_BY_NOTEBOOK:
        found = _NOTEBOOK.search(name)
        return f"{path}::{found.group(1) if found else 'other'}"
    return path


def pytest_xdist_make_scheduler(config, log):
    """Schedule by scheduling_unit (pyproject: -n 3 --dist loadscope). Read off the test ids, as the controller
    sees them: xdist's own loadgroup renames ids, which pytest 9.2 no longer honours, so each test was sent
    alone and a file's module fixture was made on both workers (the graded course and the hub's term twice)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only where xdist runs the suite

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

    return ByUnit(config, log)


# The files whose one scheduling unit takes minutes (a graded class, a hub term, a browser), started first so
# that the workers end together: the shorter units (one notebook each, the quick files) fill in behind them.
LONGEST_FIRST = ("test_attacks.py", "test_course_notebooks.py", "test_hub.py", "test_browser.py", "test_class.py")


def pytest_collection_modifyitems(items):
    """Mark slow tests, and order the scheduling units (xdist hands them out in this order; pyproject turns off its
    own reordering by test count): LONGEST_FIRST, then the other slow ones, then the rest."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    def rank(item):
        name = item.path.name
        return (item.get_closest_marker("slow") is None, LONGEST_FIRST.index(name) if name in LONGEST_FIRST else 99)

    items.sort(key=rank)


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add up each test file's seconds (setup, call, teardown), for the summary below."""
    name = report.nodeid.split("::")[0]
    _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The ten test files that took longest (summed over their tests), to see where the suite's time goes."""
    if _FILE_SECONDS:
        terminalreporter.write_sep("=", "seconds per test file (all workers), the slowest ten")
        for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:10]:
            terminalreporter.write_line(f"{seconds:8.1f}  {name}")


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


class Terminal(io.StringIO):
    """A stream that says it is a terminal and keeps what is written: the progress bars a run shows there."""

    def isatty(self) -> bool:
        return True


@contextmanager
def on_a_terminal():
    """sys.stderr as a Terminal for the with block (a module fixture's run too); yields it."""
    before, sys.stderr = sys.stderr, Terminal()
    try:
        yield sys.stderr
    finally:
        sys.stderr = before


def shown_progress(text: str, desc: str) -> bool:
    """Whether a progress bar named desc showed in text, with how far it was (n/total)."""
    return re.search(rf"{re.escape(desc)}[^\r\n%|]*:\s+\d+%\|[^\r\n]*\| \d+/\d+ \[", text) is not None


def run_kvlib(*args, env=None, cwd=ROOT, timeout=300):
    """Run the kvlib command line in a child process; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kvlib", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------------------------------------
# Grading (tests/grading/): shared by the attack suite, the jail test and the later notebooks' grading.
# They live here, not in a tests/grading/conftest.py: a second module named conftest would be the one
# that `from conftest import ...` finds in every test file.


NB = "01-attention"  # the notebook the attack suite, the screening and the course-folder tests grade


def grading_mode() -> str:
    """The isolation the grader gets on this machine: a jail with namespaces, or plain (docs/instructors.md)."""
    from kvlib.grading.jail import detect_mode

    return detect_mode()


JAILED = pytest.mark.skipif(
    sys.platform != "linux" or grading_mode() == "plain",
    reason="needs namespaces (root or user namespaces): the plain fallback does not stop this",
)


def accept_connections(listener, connections: list) -> None:
    """Record the first bytes of each connection to `listener` until it closes: what a jailed attack sent."""
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


def nbgrader(course, *args, check=True, timeout=900):
    # nbgrader runs the `alembic` command for its gradebook: put this environment's bin/ first
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    # this checkout's kvlib grades (first on sys.path), but no PYTHONPATH: a plain-mode kernel would inherit it
    # and import this checkout's kvlib instead of the submission's
    env = {**os.environ, "PATH": path, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": ""}
    run = "import sys; sys.path.insert(0, sys.argv.pop(1)); from nbgrader.apps.nbgraderapp import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", run, str(ROOT), *args],
        cwd=course,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def handed_in(module, names, **replaced):
    """What a learner hands in, as a check sees it: `names` of a kvlib module (the reference, in
    reference mode), with some replaced by deliberately other implementations."""
    import types

    handed = types.SimpleNamespace(**{name: getattr(module, name) for name in names})
    for name, value in replaced.items():
        setattr(handed, name, value)
    return handed


def check_failures(where, handed) -> list[tuple[str, Exception]]:
    """Run checks on what a learner hands in; return (check name, error) for each check that failed, in order.

    `where` names the checks: an exercise id ("1.2") runs each check of that exercise, a check's name that check.
    """
    from kvlib.checks import CHECKS, Graded, checks_for
    from kvlib.course.exercises import BY_ID

    checks = checks_for(BY_ID[where]) if where in BY_ID else [CHECKS[where]]
    failures = []
    for check in checks:
        try:  # as `kvlib check` runs it: kvlib's ready-made answers to the exercise closed (kvlib.checks.Graded)
            check.fn(Graded(handed, check.exercise.module), np.random.default_rng(0))
        except Exception as err:  # noqa: BLE001 - any failure scores 0, as in the grader
            failures.append((check.name, err))
    return failures


def assert_slip_named(where, handed, words) -> None:
    """Check that a likely wrong implementation fails the check named (with an AssertionError), or the exercise
    named (its first failing check, as `kvlib check` reports it), with a message that names the slip."""
    from kvlib.checks import CHECKS

    with np.errstate(all="ignore"):
        failures = check_failures(where, handed)
    assert failures, f"{where} passed a wrong implementation"
    name, err = failures[0]
    if where in CHECKS:
        assert isinstance(err, AssertionError), err
        assert words in str(err)
    else:
        failure = f"{name}: {type(err).__name__}: {err}"
        assert words in failure, failure


def case_ids(cases) -> list[str]:
    """Parametrize ids for SLIPS and ALTERNATIVES: the exercise id, then the name of the function that replaces the
    reference (the start of the slip's words where that function is a lambda)."""
    from kvlib.checks import CHECKS

    ids = []
    for where, replaced, *words in cases:
        ex_id = CHECKS[where].exercise.id if where in CHECKS else where
        name = next(iter(replaced.values())).__name__
        ids.append(f"{ex_id}-{words[0][:24] if name == '<lambda>' and words else name}")
    return ids


# ---------------------------------------------------------------------------------------------
# A learner function that changes its arguments: every check must compute what it expects before the call


def vandal(fn, spoil):
    """`fn` made hostile: it spoils each argument in place with `spoil`, then answers from what is left of them."""

    def vandal(*args, **kwargs):
        for arg in (*args, *kwargs.values()):
            spoil(arg)
        return fn(*args, **kwargs)

    vandal.__name__ = fn.__name__
    return vandal


def spoil_everything(x) -> None:
    """Zero what can be zeroed in place; shrink a config; slow a stand-in's clock to nothing; reseed a generator."""
    import torch

    from kvlib.core.model import ModelConfig, SlowDecoder

    if isinstance(x, np.ndarray) and x.flags.writeable:
        x[...] = 0
    elif isinstance(x, torch.Tensor):
        with torch.no_grad():
            x.zero_()
    elif isinstance(x, torch.nn.Module):
        with torch.no_grad():
            for p in x.parameters():
                p.zero_()
        if isinstance(x, SlowDecoder):
            x.per_token = 0.0
    elif isinstance(x, ModelConfig):
        for field in ("d_model", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "vocab_size"):
            object.__setattr__(x, field, 2 if field == "d_model" else 1)
    elif isinstance(x, torch.Generator):
        x.manual_seed(0)


def spoil_config_tensors_models(x) -> None:
    """Shrink a config to one layer, zero a tensor or a Decoder's weights, in place."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig

    if isinstance(x, ModelConfig):
        object.__setattr__(x, "n_layers", 1)  # a frozen dataclass still yields to object.__setattr__
    elif isinstance(x, torch.Tensor):
        x.zero_()
    elif isinstance(x, Decoder):
        with torch.no_grad():
            for p in x.parameters():
                p.zero_()


# The earlier notebooks' modules whose exercises a module's own use: a correct learner has done those too, so a test that
# grades or checks one module hands in the reference's of these (any module not named uses none)
EARLIER_DONE = {
    "generation": ("attention",),  # 2.4 joins the heads through Exercise 1.4's causal_self_attention
    "kv_cache": ("attention", "generation"),  # 4.x use Exercise 1.3's mask and 2.1's sampling
    "roofline": ("kv_cache",),  # 5.3 uses Exercise 4.4's kv_cache_bytes
    "fused": ("compress",),  # 9.4's cells compare with Exercise 8.2 over an Int8KVCache (8.1's quantize)
    "serving": ("gqa",),  # 7.3 uses Exercise 6.2's grouped_attention
    "speculative": ("kv_cache", "attention", "generation"),  # 10.x run on 4.1's KVCache (and so 1.3's mask, 2.1)
}


def checks_in_child(module: str, source: str, exercise_ids) -> dict[str, str]:
    """Every check of the exercises on kvlib/<module>.py as `source`, run in the isolated grading child:
    check name -> "pass" or its message."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import BY_ID, EXERCISES
    from kvlib.grading.sandbox import Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    files[f"kvlib/{module}.py"] = source.encode()
    for earlier in EARLIER_DONE.get(module, ()):
        files[f"kvlib/{earlier}.py"] = (ROOT / "solutions" / "kvlib" / f"{earlier}.py").read_bytes()
    functions = sorted({f"{ex.module}.{ex.name}" for ex in EXERCISES if ex.module == module})
    verdicts = {}
    with Sandbox(files, [module], functions, mode="plain", torch=True, call_timeout=60, budget=300) as sandbox:
        for ex_id in exercise_ids:
            for check in checks_for(BY_ID[ex_id]):
                try:
                    check.fn(sandbox.module(module), np.random.default_rng(0))
                    verdicts[check.name] = "pass"
                except AssertionError as err:
                    verdicts[check.name] = str(err)
    return verdicts
