"""kvlib/grading/jail.py: a jailed process has no network and sees no host paths; the mode is found without
the caller's PATH, plain mode is refused where the course says so, and the guide's sudo command grades jailed."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import nbformat
import pytest
from conftest import JAILED, NB, ROOT, accept_connections, grading_mode, nbgrader, run_kvlib


@JAILED
def test_a_jail_has_no_network_and_no_host_paths(tmp_path):
    """Check that a jailed process has no network and no host paths: it cannot connect to a server on the
    grader's 127.0.0.1, finds no /proc/self/mountinfo (which would list the host folders behind its binds), and
    torch still finds the CPU's vector instructions in the /proc stand-in."""
    from kvlib.grading.jail import Jail, detect_mode, jail_python, site_dirs

    listener = socket.create_server(("127.0.0.1", 0))
    connections: list = []
    threading.Thread(target=accept_connections, args=(listener, connections), daemon=True).start()
    sites = site_dirs()
    code = f"""
import os, socket, sys
sys.path.extend({[f"/site{i}" for i in range(len(sites))]!r})
try:
    socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=3).sendall(b"out")
    print("connected")
except OSError as err:
    print("no network:", err.errno)
print("mountinfo" if os.path.exists("/proc/self/mountinfo") else "no mountinfo")
import torch
print("cpu", torch.backends.cpu.get_cpu_capability())
"""
    jail = Jail(detect_mode(), binds={f"/site{i}": p for i, p in enumerate(sites)}, network=False, tmp_mb=64)
    try:
        proc = subprocess.run(
            jail.command([jail_python(), "-I", "-S", "-c", code]),
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            cwd=jail.dir,
            timeout=120,
        )
    finally:
        jail.close()
        listener.close()
    out = proc.stdout
    assert "no network" in out and "no mountinfo" in out, out + proc.stderr[-2000:]
    import torch

    assert f"cpu {torch.backends.cpu.get_cpu_capability()}\n" in out, out  # the same kernels as outside
    assert str(sites[0]) not in out and connections == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become an account that is not root")
def test_a_grader_that_is_not_root_removes_its_handed_over_folders():
    """Check that an instructor grading without root (chroot or plain mode, where the grader owns what it handed over,
    folders 0o500) leaves no folder of the sandbox's behind: each hub term left three in /tmp before remove_tree."""
    from kvlib.grading.jail import Jail, remove_tree

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an ordinary account, as a hub's instructor
        code = 1
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            top = Path(tempfile.mkdtemp(prefix="kvlib-test-remove-"))
            (top / "work" / "kvlib" / "core").mkdir(parents=True)
            (top / "work" / "kvlib" / "core" / "model.py").write_text("x = 1\n")
            jail = Jail("plain", binds={}, network=False)
            jail.hand_over(top / "work")
            jail.close()
            assert (top / "work" / "kvlib").stat().st_mode & 0o777 == 0o500
            shutil.rmtree(top, ignore_errors=True)  # what the grader did before: the tree stays
            stayed = (top / "work" / "kvlib" / "core" / "model.py").exists()
            remove_tree(top)
            os.write(write, json.dumps({"stayed": stayed, "removed": not top.exists()}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    assert os.waitpid(pid, 0)[1] == 0 and out, "the child failed"
    assert json.loads(out) == {"stayed": True, "removed": True}, out


def test_a_course_folder_refuses_plain_mode_unless_allowed(tmp_path):
    """Check that a course folder from `kvlib course init` refuses to grade without a jail: its config sets
    c.GradingJail.allow_plain = False, and in plain mode GradingJail names the setting that would allow it."""
    from traitlets.config import Config

    from kvlib.grading.execute import GradingJail, PlainModeRefused

    proc = run_kvlib("course", "init", str(tmp_path / "course"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\nc.GradingJail.allow_plain = False\n" in (tmp_path / "course" / "nbgrader_config.py").read_text()
    config = Config()
    config.GradingJail.isolation, config.GradingJail.allow_plain = "plain", False
    with pytest.raises(PlainModeRefused, match=r"c\.GradingJail\.allow_plain = True"):
        GradingJail(config=config).mode
    config.GradingJail.allow_plain = True
    assert GradingJail(config=config).mode == "plain"


def test_modes_are_found_without_the_callers_path(monkeypatch):
    """Check that the jail's tools are found in the system folders whatever PATH says (sudo's PATH from an
    ordinary account lacks /usr/sbin, where Debian keeps chroot), and the jail's command names them by path."""
    from kvlib.grading.jail import TOOLS, Jail, find_mode, tool

    monkeypatch.setenv("PATH", "/nowhere")
    if any(tool(t) is None for t in TOOLS):
        pytest.skip("util-linux's unshare, setpriv, chroot or mount is not installed")
    jail = Jail("namespaces", binds={}, network=False)
    try:
        assert jail.command(["/usr/bin/true"])[0] == tool("unshare") and tool("unshare").startswith("/")
    finally:
        jail.close()
    find_mode.cache_clear()
    try:
        assert find_mode()[0] == grading_mode()  # the same mode as with the tests' own PATH
    finally:
        find_mode.cache_clear()


SUDO_TOOLS = ("sudo", "useradd", "userdel", "runuser")


@pytest.mark.slow
@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or grading_mode() != "namespaces",
    reason="makes an account with sudo rights: needs root, and a jail with namespaces",
)
def test_the_guides_sudo_command_from_an_ordinary_account_grades_jailed():
    """Check that the guide's `sudo -E env PATH="$PATH" nbgrader autograde` grades in the jail when an ordinary
    account (made here with useradd, sudo rights from a sudoers.d file, both removed after) runs it with a PATH
    that lacks /usr/sbin: the log names the mode, the kernel runs as neither root nor that account and not in its
    HOME, the guide's mode check says the same, and the correct submission gets every point."""
    from nbgrader.api import Gradebook

    from kvlib.grading.jail import tool

    if any(tool(t) is None for t in SUDO_TOOLS):  # CI (.ci/run) installs sudo and sets KVLIB_CLASS_TEST=required
        (pytest.fail if os.environ.get("KVLIB_CLASS_TEST") == "required" else pytest.skip)(
            f"needs {', '.join(SUDO_TOOLS)} (apt-get install sudo)"
        )
    user = f"kvjail{secrets.token_hex(4)}"
    sudoers = Path("/etc/sudoers.d") / f"kvlib-test-{user}"
    course = Path(tempfile.mkdtemp(prefix="kvlib-sudo-course-"))
    course.chmod(0o755)  # the account's shell starts there
    try:
        subprocess.run([tool("useradd"), "--create-home", "--shell", "/bin/sh", user], check=True, capture_output=True)
        # PYTHONPATH kept (sudo drops it): the checkout under test grades, not only the installed kvlib
        sudoers.write_text(f'Defaults:{user} env_delete -= "PYTHONPATH"\n{user} ALL=(root) NOPASSWD:SETENV: ALL\n')
        sudoers.chmod(0o440)
        proc = run_kvlib("course", "init", str(course))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        nbgrader(course, "generate_assignment", NB, "--log-level=WARN")
        sub = course / "submitted" / "alice" / NB
        shutil.copytree(course / "release" / NB, sub)
        shutil.copy(ROOT / "solutions" / "kvlib" / "attention.py", sub / "kvlib" / "attention.py")
        nb_path = sub / "attention.ipynb"
        nb = json.loads(nb_path.read_text())
        probe = 'import os\nprint("kernel uid", os.getuid(), "home", os.environ.get("HOME"))\n'
        nb["cells"].insert(
            0, {"cell_type": "code", "metadata": {}, "source": probe, "outputs": [], "execution_count": None}
        )
        nb_path.write_text(json.dumps(nb))
        # the instructor owns the course folder, which `kvlib course init` made theirs alone (0700)
        subprocess.run(["chown", "-R", f"{user}:", str(course)], check=True, capture_output=True)
        home = f"/home/{user}"
        path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"  # no /usr/sbin, no /sbin
        assert "sbin" not in path

        def as_account(command: str) -> subprocess.CompletedProcess:
            env = ["env", "-i", f"HOME={home}", f"USER={user}", f"PATH={path}", f"PYTHONPATH={ROOT}", "LANG=C.UTF-8"]
            return subprocess.run(
                [tool("runuser"), "-u", user, "--", *env, "/bin/sh", "-c", f"cd {course} && {command}"],
                capture_output=True,
                text=True,
                timeout=900,
            )

        skeleton = set(Path(home).rglob("*"))  # what useradd copied from /etc/skel
        check = as_account('sudo -E env PATH="$PATH" python -m kvlib.grading')
        assert check.returncode == 0 and "Grading isolation: namespaces" in check.stdout, check.stdout + check.stderr
        graded = as_account(f'sudo -E env PATH="$PATH" nbgrader autograde {NB}')
        log = graded.stdout + graded.stderr
        assert graded.returncode == 0, log[-5000:]
        assert "Grading isolation: namespaces" in log, log[-5000:]
        out = nbformat.read(course / "autograded" / "alice" / NB / "attention.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in out.cells for o in c.get("outputs", []))
        uid, kernel_home = re.search(r"kernel uid (\d+) home (\S+)", printed).groups()
        account_uid = int(subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout)
        assert int(uid) not in (0, account_uid) and kernel_home not in (home, "/root"), printed
        # nothing of the kernel's own in the account's HOME (nbgrader itself, as root, makes ~/.ipython there)
        left = sorted(str(p.relative_to(home)) for p in Path(home).rglob("*") if p not in skeleton)
        assert not [p for p in left if p.split("/")[0] != ".ipython"], left
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            (scored,) = gb.assignment_submissions(NB)
            assert scored.max_score > 0 and scored.score == scored.max_score
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run([tool("userdel"), "--remove", user], capture_output=True)
        shutil.rmtree(course, ignore_errors=True)
