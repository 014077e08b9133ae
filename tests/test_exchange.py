"""kvlib/app/exchange.py as one account sees it (tests/test_hub.py runs it between real accounts): what
`nbgrader submit` with the students' config puts in inbound/."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

NB = "01-attention"


@pytest.mark.slow  # nbgrader's start-up: seconds
def test_a_submission_leaves_out_what_autograde_puts_back(tmp_path):
    """Check that a submission made with the students' config (PrivateSubmit) holds the notebook, the learner's
    kvlib files and a helper module of theirs, but not assets/ nor kvlib's subpackages (autograde copies those from
    the source), with its folders mode 0770."""
    from kvlib.app.course_folder import student_config_text

    exchange, course_id = tmp_path / "exchange", "kvt-unit"
    nb = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    files = {
        "attention.ipynb": nb,
        "kvlib/attention.py": "# mine\n",
        "kvlib/my_helpers.py": "# mine too\n",
        "kvlib/core/model.py": "# the course's\n",
        "kvlib/course/figures/x.py": "# the course's\n",
        "assets/tiny/weights.bin": "0" * 1000,
        "YOUR_FILES.md": "# Your files\n",
    }
    for top in (exchange / course_id / "outbound" / NB, tmp_path / "home" / NB):
        for rel, text in files.items():
            (top / rel).parent.mkdir(parents=True, exist_ok=True)
            (top / rel).write_text(text)
    (exchange / course_id / "inbound").mkdir(mode=0o3733)
    (tmp_path / "home" / ".jupyter").mkdir()
    (tmp_path / "home" / ".jupyter" / "nbgrader_config.py").write_text(student_config_text(str(exchange), course_id))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("JUPYTER_CONFIG_DIR", None)  # the students' config in ~/.jupyter, as the guide puts it
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "submit", NB, "--student=alice"],
        cwd=tmp_path / "home", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sub,) = (exchange / course_id / "inbound").iterdir()
    got = sorted(p.relative_to(sub).as_posix() for p in sub.rglob("*") if p.is_file())
    mine = ["YOUR_FILES.md", "attention.ipynb", "kvlib/attention.py", "kvlib/my_helpers.py"]
    assert got == sorted(mine + ["submission_secret.txt", "timestamp.txt"])  # the last two: nbgrader's own
    assert all(p.stat().st_mode & 0o7777 == 0o770 for p in [sub, *sub.rglob("*")] if p.is_dir())
