"""A throwaway root for one untrusted process: the notebook kernel, or the isolated checker child.

Three modes, picked once per grading process ("auto" takes the first that works here):
  namespaces  the grader is root: new mount/PID/IPC/UTS/network namespaces (no network at all), a
              fresh tmpfs as root holding read-only binds of /usr, the site-packages and the few
              folders the process needs, a /proc that is not procfs (three files: the host paths
              behind the binds stay hidden), then chroot and setpriv to an unprivileged uid with no
              capabilities;
  userns      the grader is not root but the kernel allows user namespaces: the same jail, the
              process keeping the grader's uid outside but no capability inside;
  plain       neither: a plain child process with resource limits, which sees everything the
              grader sees (docs/instructors.md says what that does not protect).
The tools are looked for in the system's own folders (TOOL_DIRS), never on the caller's PATH:
`sudo env PATH="$PATH" ...` from an ordinary account has no /usr/sbin, where Debian keeps chroot.
`python -m kvlib.grading.jail` in a course folder prints the mode its nbgrader_config.py gets, and
why, exactly as autograde finds it (run it the way you run autograde: `sudo -E env PATH="$PATH" ...`).
Not here: what runs inside (kvlib.grading.sandbox, kvlib.grading.execute).
"""

from __future__ import annotations

import functools
import os
import resource
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODES = ("namespaces", "userns", "plain")
TOOL_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")  # util-linux's and coreutils' homes, whatever PATH says
TOOLS = ("unshare", "setpriv", "chroot", "mount")


def tool(name: str) -> str | None:
    """The absolute path of a system tool, found in TOOL_DIRS only (never through the caller's PATH)."""
    return shutil.which(name, path=os.pathsep.join(TOOL_DIRS))


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096  # address space; torch alone maps ~2 GiB
    cpu_s: int = 600  # a backstop: the callers' wall-clock timeouts normally fire first
    nproc: int = 1024  # per uid, system-wide: stops a fork bomb, not a few threads
    nofile: int = 256
    fsize_mb: int = 64

    def apply(self) -> None:
        """Set the limits on this process (a preexec_fn); they pass on to everything it starts."""
        mb = 1 << 20
        for res, value in (
            (resource.RLIMIT_AS, self.memory_mb * mb),
            (resource.RLIMIT_CPU, self.cpu_s),
            (resource.RLIMIT_NPROC, self.nproc),
            (resource.RLIMIT_NOFILE, self.nofile),
            (resource.RLIMIT_FSIZE, self.fsize_mb * mb),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(res, (value, value))


def site_dirs() -> list[Path]:
    """The grader's own site-packages (venv or conda env): the jailed Python imports numpy from there."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]).resolve() for k in ("purelib", "platlib")))


def jail_python() -> str:
    """An interpreter every user can run, of the grader's own Python version (its site-packages
    are compiled for it). The grader's may sit in a home folder other users cannot read."""
    return f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"


def _probe(mode: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="kvlib-probe-") as tmp:
        jail = Jail(mode, binds={}, network=False, tmp_mb=1)
        try:
            cmd = jail.command(["/usr/bin/true"])
            return subprocess.run(cmd, capture_output=True, timeout=30, cwd=tmp).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False
        finally:
            jail.close()


@functools.lru_cache(maxsize=None)
def find_mode(requested: str = "auto") -> tuple[str, str]:
    """(mode, why): the isolation this process gets, and the reason in words (for the log)."""
    if requested != "auto":
        if requested not in MODES:
            raise ValueError(f"isolation must be auto or one of {', '.join(MODES)}, not {requested!r}")
        return requested, f"GradingJail.isolation = {requested!r}"
    missing = [t for t in TOOLS if tool(t) is None]
    if missing:
        return "plain", f"no {', '.join(missing)} in {', '.join(TOOL_DIRS)} (util-linux)"
    if os.geteuid() == 0:
        if _probe("namespaces"):
            return "namespaces", f"root, with {tool('unshare')}"
        return "plain", "root, but a test jail with new namespaces did not start (a container without CAP_SYS_ADMIN?)"
    if _probe("userns"):
        return "userns", f"uid {os.geteuid()}, with unprivileged user namespaces"
    return "plain", f"uid {os.geteuid()} is not root, and this system refuses unprivileged user namespaces"


def detect_mode(requested: str = "auto") -> str:
    """The isolation this process can have: `requested` if given, else the strongest that works."""
    return find_mode(requested)[0]


class Jail:
    """One untrusted process's world. `binds` maps a path inside to a host folder, bound read-only;
    /tmp inside is a fresh tmpfs of `tmp_mb`, the only writable place. In plain mode nothing is
    bound: path() gives the host folder instead, and the process sees the whole disk."""

    def __init__(
        self,
        mode: str,
        *,
        binds: dict[str, Path],
        network: bool,
        tmp_mb: int = 64,
        uid: int = -1,
        limits: Limits | None = None,
        cwd: str = "/tmp",
        writable: tuple[Path, ...] = (),
    ):
        if mode not in MODES:
            raise ValueError(f"unknown isolation mode {mode!r}")
        # -1: a uid of its own, which no account and no other jail uses, so jails running side by
        # side (parallel autograding) share no process limit and cannot signal each other
        uid = uid if uid >= 0 else (1 << 30) + secrets.randbelow(1 << 28)
        self.mode, self.binds, self.network, self.tmp_mb, self.uid = mode, dict(binds), network, tmp_mb, uid
        self.writable = tuple(Path(p) for p in writable)  # host folders bound read-write at the same path inside
        self.limits = limits or Limits()
        self.cwd = cwd
        self.env_path = "/usr/bin:/bin"
        self.dir = Path(tempfile.mkdtemp(prefix="kvlib-jail-"))  # mode 700, the grader's: holds the script

    def hand_over(self, *paths: Path) -> None:
        """Make files readable by the jailed process only: owned by its uid (namespaces mode) or
        the grader's, with no access for anyone else (learner code, the kernel's key)."""
        for top in paths:
            for p in [top, *top.rglob("*")] if top.is_dir() else [top]:
                if self.mode == "namespaces":
                    os.chown(p, self.uid, self.uid)
                p.chmod(0o500 if p.is_dir() else 0o400)

    def path(self, inside: str) -> str:
        """Where the process finds a bound folder: the inside path, or in plain mode the host one."""
        if self.mode != "plain":
            return inside
        for mount, host in self.binds.items():
            if inside == mount or inside.startswith(mount + "/"):
                return str(host) + inside[len(mount) :]
        return inside

    def host_cwd(self) -> str:
        return self.path(self.cwd) if self.mode == "plain" and self.cwd != "/tmp" else str(self.dir)

    def command(self, argv: list[str]) -> list[str]:
        """The command line that runs argv (absolute inside paths) in this jail."""
        if self.mode == "plain":
            return list(argv)
        root = self.dir / "root"
        root.mkdir(exist_ok=True)
        q = shlex.quote
        lines = [
            "set -eu",
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",  # mount, chroot and setpriv, whatever PATH the jailed process gets
            "mount --make-rprivate /",
            f"mount -t tmpfs -o size=16m,mode=755,nosuid,nodev tmpfs {q(str(root))}",
            f"cd {q(str(root))}",
            # bind read-only; a user namespace must keep the host's locked flags, so retry with noexec
            'robind() { mkdir -p "$2"; mount --bind "$1" "$2"; '
            'mount -o remount,bind,ro,nosuid,nodev "$2" 2>/dev/null || mount -o remount,bind,ro,nosuid,nodev,noexec "$2"; }',
            "robind /usr usr",
            "for l in bin sbin lib lib32 lib64 libx32; do "
            'if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$l"; elif [ -d "/$l" ]; then robind "/$l" "$l"; fi; done',
            "mkdir dev",
            "for d in null zero urandom random; do touch dev/$d; mount --bind /dev/$d dev/$d; done",
            "mkdir -p etc && for f in ld.so.cache localtime; do if [ -f /etc/$f ]; then touch etc/$f; mount --bind /etc/$f etc/$f; fi; done",
            "if [ -d /etc/fonts ]; then robind /etc/fonts etc/fonts; fi",  # matplotlib's font lookup
            f"mkdir tmp && mount -t tmpfs -o size={int(self.tmp_mb)}m,mode=1777,nosuid,nodev tmpfs tmp",
            # no procfs: /proc/self/mountinfo would show the host paths behind every bind. A read-only
            # stand-in holds what the libraries read: cpuinfo (torch picks its SIMD kernels from it), meminfo, stat
            "mkdir proc && mount -t tmpfs -o size=1m,mode=755,nosuid,nodev,noexec tmpfs proc",
            "for f in cpuinfo meminfo stat; do touch proc/$f; mount --bind /proc/$f proc/$f 2>/dev/null || true; done",
            "mount -o remount,bind,ro,nosuid,nodev,noexec proc 2>/dev/null || true",
        ]
        for inside, host in self.binds.items():
            if not inside.startswith("/") or inside.rstrip("/") in {"", "/usr", "/tmp", "/dev", "/proc", "/etc"}:
                raise ValueError(f"cannot bind over {inside!r}")
            lines.append(f"robind {q(str(host))} {q(inside.lstrip('/'))}")
        for host in self.writable:  # e.g. the folder of the kernel's Unix sockets, at the same path inside and out
            if (
                not host.is_absolute()
                or len(host.parts) < 3
                or host.parts[1] in {"usr", "dev", "proc", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}
            ):
                raise ValueError(f"cannot bind {host} writable at the same path inside")
            lines.append(
                f"mkdir -p {q(str(host).lstrip('/'))} && mount --bind {q(str(host))} {q(str(host).lstrip('/'))} "
                f"&& mount -o remount,bind,nosuid,nodev,noexec {q(str(host).lstrip('/'))}"
            )
        drop = ["/usr/bin/setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
        if self.mode == "namespaces":
            drop += [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        else:  # userns: uid 0 inside maps to the grader; an empty bounding set leaves python no capability
            drop += ["--securebits=+noroot,+noroot_locked"]
        lines.append(
            f'CHROOT=$(command -v chroot); exec env PATH={q(self.env_path)} "$CHROOT" . '
            + " ".join(q(a) for a in drop + ["--"] + list(argv))
        )
        script = self.dir / "jail.sh"
        script.write_text("\n".join(lines) + "\n")
        flags = ["--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if not self.network:
            flags.append("--net")
        if self.mode == "userns":
            flags = ["--user", "--map-root-user"] + flags
        unshare = tool("unshare")
        if unshare is None:
            raise OSError(f"no unshare in {', '.join(TOOL_DIRS)}: isolation {self.mode!r} needs util-linux")
        return [unshare, *flags, "--", "/bin/sh", str(script)]

    def popen(self, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        """Start argv in the jail, in its own session (so killing the group kills it all)."""
        limits = self.limits

        def setup():
            limits.apply()
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)

        return subprocess.Popen(
            self.command(argv), env=env, cwd=self.host_cwd(), preexec_fn=setup, start_new_session=True, **kw
        )

    def close(self) -> None:
        remove_tree(self.dir)


def remove_tree(top: Path) -> None:
    """Remove a folder the grader made, even where hand_over left its folders read-only (0o500): the grader, not
    root, owns them in chroot and plain mode, and cannot unlink from a folder it may not write. What another
    account owns is left (shutil's errors ignored), as before."""
    for folder, _, _ in os.walk(top):
        try:
            os.chmod(folder, 0o700)
        except OSError:  # another uid's (namespaces mode, where the grader is root and removes it anyway)
            pass
    shutil.rmtree(top, ignore_errors=True)


def kill(proc: subprocess.Popen | None) -> None:
    """SIGKILL a jailed process and its group; in a jail, PID namespace teardown takes the rest."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
