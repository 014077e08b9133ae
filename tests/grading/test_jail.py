"""kvlib/grading/jail.py: a jailed process has no network and sees no host paths."""

from __future__ import annotations

import socket
import subprocess
import threading

from conftest import JAILED, accept_connections


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
