"""The test command itself (pyproject.toml's pytest options, tests/conftest.py's scheduler): a worker that dies ends
the run promptly, as a failure that names the test, instead of leaving the other workers idle until CI's limit."""

import subprocess
import sys
import textwrap

import tomllib
from conftest import ROOT


def test_a_crashed_worker_fails_the_run_promptly(tmp_path):
    """Check that under the suite's own options and scheduler, a test that kills its worker (SIGSEGV) ends the run
    within a minute, exit status 1, naming that test (pytest-xdist re-queues a crashed worker's finished units as
    empty ones and can wait on them forever, pytest-xdist issue 1378: a hang seen here with llama.cpp, issue 43)."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts} -p no:cacheprovider\n")
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler  # the suite's own scheduling units
        """)
    )
    (tmp_path / "test_crash.py").write_text(
        "import os, signal\n\ndef test_crash():\n    os.kill(os.getpid(), signal.SIGSEGV)\n\ndef test_after():\n    pass\n"
    )
    for i in range(5):
        (tmp_path / f"test_fine_{i}.py").write_text("import time\n\ndef test_a():\n    time.sleep(0.2)\n")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"the run hung after a worker crashed:\n{err.stdout}") from None
    assert run.returncode == 1, run.stdout + run.stderr
    assert "crashed while running 'test_crash.py::test_crash'" in run.stdout, run.stdout
