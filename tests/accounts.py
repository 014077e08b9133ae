"""Real Unix accounts for the class tests (tests/test_hub.py, tests/test_class.py): created with
useradd, used with runuser, removed with everything they started, even when a test fails.

Accounts are named kvt-<tag>-<role> with a fresh tag per fixture, homes mode 0700 (what
docs/instructors.md asks of a hub's homes). They run the course's own environment: a virtual
environment whose site-packages is this one's, on this one's interpreter (linked to where every
account can run it, when it sits in a home folder others cannot enter).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path

from conftest import ROOT

SCRIPTS = ["nbgrader", "alembic", "jupyter", "jupyterhub-singleuser", "jupyter-lab", "jupyter-server", "kvlib"]
GUIDE = ROOT / "docs" / "instructors.md"
# the names docs/instructors.md's blocks use, which a test replaces with its own
GUIDE_NAMES = (
    "/opt/kvlib", "/home/teacher", "teacher", "/home/alice", "alice", "CHANGE-ME",
    "https://hub.example.edu", "http://127.0.0.1:10101", "/srv/kvlib-exchange", "kvlib-svc", "kvlib-2027-spring",
)  # fmt: skip


def guide_block(title: str, names: dict[str, str], lang: str = "bash") -> str:
    """The bash (or lang) block that follows `<!-- guide: TITLE -->` in docs/instructors.md, as written, with the
    guide's names (GUIDE_NAMES) replaced by the test's; raises if the guide has no such block, or if the block uses a
    name the test did not give (it would run on the machine's own /opt/kvlib or /home/alice)."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(rf"<!-- guide: {re.escape(title)} -->\n```{lang}\n(.*?)\n```", text, re.S)
    if found is None:
        raise AssertionError(f"docs/instructors.md has no block marked <!-- guide: {title} -->")
    block = found.group(1)
    for name in GUIDE_NAMES:  # longest first, in this order: /home/teacher before teacher
        if name in names:
            block = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", names[name].replace("\\", "\\\\"), block)
    left = [n for n in GUIDE_NAMES if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", block)]
    if left:
        raise AssertionError(f"the guide's block {title!r} uses {left}: give the test's own in names")
    return block


def unavailable() -> str | None:
    """Why real accounts cannot be used here, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (it creates Unix accounts)"
    for tool in ("useradd", "userdel", "runuser"):
        if not shutil.which(tool):
            return f"needs {tool}"
    return None


def _open_to_all(path: Path) -> bool:
    return all(p.stat().st_mode & 0o005 == 0o005 for p in [path, *path.parents])


def _interpreter(folder: Path) -> Path:
    """This environment's base Python where every account can run it: in place if it is, else a
    tree of hard links to it (its standard library, not its site-packages) in folder."""
    base = Path(sys.base_prefix).resolve()
    exe = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if _open_to_all(base / "bin"):
        return base
    skip = {base / "lib" / exe / "site-packages", base / "lib" / exe / "test"}
    for top, dirs, files in os.walk(base):
        here = Path(top)
        dirs[:] = [d for d in dirs if here / d not in skip]
        dest = folder / here.relative_to(base)
        dest.mkdir(exist_ok=True)
        dest.chmod(0o755)
        for name in files:
            src = here / name
            if src.is_symlink():
                (dest / name).symlink_to(os.readlink(src))
            else:
                try:
                    os.link(src, dest / name)
                except OSError:  # another file system
                    shutil.copy2(src, dest / name)
    return folder


def make_env(folder: Path) -> tuple[Path, dict[str, str]]:
    """A virtual environment every account can run: this environment's interpreter (see
    _interpreter), its site-packages (linked), its console scripts. Returns its bin/ folder and the
    variables it needs."""
    exe = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    base = _interpreter(folder.with_name("python"))
    env = {"LD_LIBRARY_PATH": str(base / "lib")}
    subprocess.run(
        [str(base / "bin" / exe), "-m", "venv", "--without-pip", str(folder)],
        check=True,
        timeout=120,
        env={**os.environ, **env},
    )
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    ours = Path(sysconfig.get_paths(vars={"base": str(folder), "platbase": str(folder)})["purelib"])
    shutil.rmtree(ours)
    ours.symlink_to(site)
    for data in ("share", "etc"):  # nbconvert's templates, JupyterLab's extensions and their settings
        if (Path(sys.prefix) / data).is_dir() and not (folder / data).exists():
            (folder / data).symlink_to(Path(sys.prefix).resolve() / data)
    for ep in entry_points(group="console_scripts"):
        if ep.name in SCRIPTS and not (folder / "bin" / ep.name).exists():
            module, _, attr = ep.value.partition(":")
            script = folder / "bin" / ep.name
            script.write_text(
                f"#!{folder}/bin/python\nimport sys\nfrom {module} import {attr.split('.')[0]}\nsys.exit({attr}())\n"
            )
            script.chmod(0o755)
    for p in [folder, *folder.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o055 if p.is_dir() else p.stat().st_mode | 0o044)
    return folder / "bin", env


class Accounts:
    """Creates accounts kvt-<tag>-<role>; close() removes every one, its processes and its home."""

    def __init__(self):
        for need in (ROOT, Path(sysconfig.get_paths()["purelib"]).resolve()):  # what every account imports from
            closed = [p for p in [need, *need.parents] if p.stat().st_mode & 0o005 != 0o005]
            if closed:
                raise RuntimeError(
                    f"{need} is not open to other accounts ({closed[-1]} is mode {closed[-1].stat().st_mode & 0o777:o}): "
                    "the accounts this test makes could not run the course; clone it where others can read "
                    f"(chmod o+rx {closed[-1]})"
                )
        self.tag = secrets.token_hex(2)
        self.names: dict[str, str] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix=f"kvt-{self.tag}-"))
        self.tmp.chmod(0o755)
        self.bin, self.base_env = make_env(self.tmp / "env")

    def add(self, role: str) -> str:
        name = f"kvt-{self.tag}-{role}"
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name], check=True, timeout=60)
        self.names[role] = name
        home = Path(pwd.getpwnam(name).pw_dir)
        home.chmod(0o700)
        return name

    def home(self, role: str) -> Path:
        return Path(pwd.getpwnam(self.names[role]).pw_dir)

    def env(self, role: str, **extra) -> dict[str, str]:
        """The account's environment; an extra variable given as None is left out."""
        name = self.names[role]
        env = {
            "HOME": str(self.home(role)),
            "USER": name,
            "LOGNAME": name,
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "PYTHONPATH": str(ROOT),
            "LANG": "C.UTF-8",
            "KVLIB_SOLUTIONS": "0",
            "OMP_NUM_THREADS": "1",
            "OMP_WAIT_POLICY": "PASSIVE",
            **self.base_env,
            **extra,
        }
        return {k: v for k, v in env.items() if v is not None}

    def run(
        self,
        role: str,
        *argv: str,
        cwd: Path | None = None,
        timeout: float = 600,
        check: bool = True,
        via: list[str] = (),
        input: str | None = None,
        **extra,
    ):
        """argv as the account (runuser), in its home unless cwd, with input on its stdin (else none); via: a command
        run as root that runs the rest (e.g. `ip netns exec NAME`); returns the CompletedProcess."""
        env = self.env(role, **extra)
        cmd = [*via, "runuser", "-u", self.names[role], "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]
        stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        proc = subprocess.run(cmd, cwd=cwd or self.home(role), capture_output=True, text=True, timeout=timeout, **stdin)
        if check:
            assert proc.returncode == 0, (
                f"{' '.join(argv)} as {role}: rc {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
            )
        return proc

    def python(self, role: str, code: str, **kw):
        return self.run(role, str(self.bin / "python"), "-c", code, **kw)

    def processes(self, uid: int) -> list[int]:
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        out.append(int(entry))
                except FileNotFoundError:
                    pass
        return out

    def close(self) -> None:
        for name in self.names.values():
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                continue
            for _ in range(20):  # the account's processes (a server, a kernel) end before it does
                pids = self.processes(uid)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
                time.sleep(0.2)
            subprocess.run(["userdel", "--remove", "--force", name], capture_output=True, timeout=60)
        shutil.rmtree(self.tmp, ignore_errors=True)
        left = self.leftovers()
        if left:
            raise RuntimeError(f"the class tests left behind: {'; '.join(left)}")

    def leftovers(self) -> list[str]:
        """What of these accounts is still here after close(): an account, its home, its processes, the folder."""
        left = []
        for name in self.names.values():
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            left.append(f"the account {name}")
            if self.processes(entry.pw_uid):
                left.append(f"processes of {name}: {self.processes(entry.pw_uid)}")
        homes = [p for p in Path("/home").glob(f"kvt-{self.tag}-*")] if Path("/home").is_dir() else []
        left += [f"the home {p}" for p in homes]
        if self.tmp.exists():
            left.append(f"the folder {self.tmp}")
        return left
