"""CI's check of the learner's install, the README's first command in a virtual environment of its own.

Run with that environment's python (.ci/run does): none of the contributor's or instructor's packages is there;
`kvlib check --json` runs every exercise (each one todo on the stubs, or, a find-and-fix exercise, failing on its
shipped bug or naming the earlier exercise it needs); `kvlib lab` serves the course's notebooks,
with a Python kernel and nbgrader's Validate button. Exit 1 naming what failed. (tests/test_packaging.py checks,
statically, that the learner's packages cover every notebook's imports.)
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from kvlib.course.exercises import BY_ID

KVLIB = Path(sys.executable).parent / "kvlib"
CONTRIBUTORS = ("pytest", "xdist", "ruff", "playwright", "jupyterhub", "psycopg2")


def fail(message: str) -> None:
    print(f".ci/learner.py: {message}", file=sys.stderr)
    sys.exit(1)


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def main() -> None:
    start = time.perf_counter()
    present = [name for name in CONTRIBUTORS if importlib.util.find_spec(name) is not None]
    if present:
        fail(f"the learner's install holds {present}")
    env = {**os.environ, "KVLIB_SOLUTIONS": "0"}
    check = subprocess.run([KVLIB, "check", "--json"], capture_output=True, text=True, env=env, timeout=300)
    try:
        rows = json.loads(check.stdout)
    except ValueError:
        fail(f"kvlib check --json printed no JSON (exit {check.returncode}): {check.stderr[-2000:]}")
    wrong = [
        (r["id"], r["status"])
        for r in rows
        if r["status"] != "todo" and not (r["status"] == "fail" and BY_ID[r["id"]].kind == "fix")
    ]
    if check.returncode != 1 or not rows or wrong:
        fail(f"kvlib check: exit {check.returncode}, not todo (nor a shipped bug failing): {wrong}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = os.urandom(8).hex()
    lab = subprocess.Popen(
        [KVLIB, "lab", "--no-browser", "--port", str(port)],
        env={**env, "JUPYTER_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                specs = get(f"{base}/api/kernelspecs?token={token}")
                break
            except (urllib.error.URLError, ConnectionError):
                if lab.poll() is not None or time.monotonic() > deadline:
                    fail(f"kvlib lab did not serve on port {port}: {lab.stderr.read()[-2000:] if lab.poll() else ''}")
                time.sleep(0.5)
        if "python3" not in specs["kernelspecs"]:
            fail(f"kvlib lab has no Python kernel: {sorted(specs['kernelspecs'])}")
        extensions = {e["name"] for e in get(f"{base}/lab/api/extensions?token={token}") if e.get("enabled", True)}
        if not any("nbgrader" in name for name in extensions):
            fail(f"kvlib lab has no nbgrader extension (the Validate button): {sorted(extensions)}")
        get(f"{base}/api/contents/notebooks/01-attention/attention.ipynb?content=0&token={token}")
    finally:
        lab.terminate()
        lab.wait(timeout=30)
    print(
        f"the learner's install: kvlib check ran {len(rows)} exercises, kvlib lab served the course with a Python "
        f"kernel and nbgrader's Validate ({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
