"""Running a submitted notebook during autograde: nbgrader's Execute, with the kernel jailed and
a time budget for the whole notebook.

The kernel runs the learner's own kvlib code (the notebook imports it), so it is untrusted: as
the grader's user it could write the gradebook or plant an IPython startup file for the next
student. SandboxKernelManager starts it in a jail (kvlib.grading.jail) that sees only the
notebook's folder (read-only), the site-packages (read-only) and a fresh /tmp, with no network:
Jupyter talks to it over Unix sockets in a folder bound into the jail, not over localhost. Scores do not depend on what the
kernel prints (IsolatedGrading replaces the graded cells' outputs); the kernel's run gives the
learner their notebook's outputs in the feedback, so a notebook in which nothing counts in the kernel
(SandboxExecute.run_kernel = "when-needed") is not run at all.
Every other notebook run (present --check, Validate, the tests) waits for the kernel the same way
(SteppedNotebookClient, SteppedKernelClient). Not here: the scores (preprocessor.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from queue import Empty
from time import monotonic

import nbformat
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbformat.v4 import new_output
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import Execute
from traitlets import Bool, Enum, Integer, List, Type, Unicode, default
from traitlets.config import Configurable

from kvlib.grading.checks_registry import isolated_cell_ids
from kvlib.grading.jail import Jail, Limits, find_mode, jail_python, remove_tree, site_dirs


def _chunked(get_msg, step: float = 0.5):
    """get_msg that waits in short steps, each ending in a real zmq poll of the socket.

    A reply is sometimes never noticed by the asyncio wait: zmq.asyncio wakes on the socket's
    edge-triggered FD, and that wake-up is lost now and then while the other channel is busy (notebook
    01's widget cell floods iopub with comm messages). One run in 20 of notebook 01 then stalled: the
    kernel sent the last cell's execute_reply at 4.0 s, and the wait for it, begun at 3.7 s, returned it
    at 63.7 s, exactly its 60 s timeout, because pyzmq polls the socket itself once the timeout fires.
    A step of 0.5 s makes that same poll happen twice a second: a lost wake-up costs at most a step,
    and the cell's own timeout is unchanged."""

    async def chunked(timeout=None, **kw):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            wait = step if deadline is None else max(0.0, min(step, deadline - monotonic()))
            try:
                return await get_msg(timeout=wait, **kw)
            except Empty:
                if deadline is not None and monotonic() >= deadline:
                    raise

    return chunked


def poll_in_steps(kc):
    """Make a kernel client's shell and iopub waits poll in steps (see _chunked); returns kc."""
    for channel in (kc.shell_channel, kc.iopub_channel):
        channel.get_msg = _chunked(channel.get_msg)
    return kc


class SteppedNotebookClient(NotebookClient):
    """nbclient's NotebookClient whose waits for the kernel survive a lost wake-up (poll_in_steps).

    Every path that runs a notebook uses it: `kvlib present --check`, the notebook tests. Its kernel is stopped at
    once when the last cell is done (nbclient's shutdown_kernel="immediate"): the outputs are in, no notebook of the
    course registers an exit hook, and a kernel that imported torch spends about 0.7 s of CPU tearing itself down."""

    @default("shutdown_kernel")
    def _immediate(self):
        return "immediate"

    async def async_start_new_kernel_client(self):
        return poll_in_steps(await super().async_start_new_kernel_client())

    start_new_kernel_client = run_sync(async_start_new_kernel_client)  # the sync setup_kernel calls this one


class SteppedChannel(AsyncZMQSocketChannel):
    """jupyter_client's async channel whose get_msg waits in steps (see _chunked)."""

    async def get_msg(self, timeout=None):
        return await _chunked(super().get_msg)(timeout=timeout)


class SteppedKernelClient(AsyncKernelClient):
    """An async kernel client with stepped shell and iopub waits, for `nbgrader validate` (the Validate
    button), which builds nbgrader's own Execute: nbgrader_config.py names it as
    c.AsyncKernelManager.client_class."""

    shell_channel_class = Type(SteppedChannel)
    iopub_channel_class = Type(SteppedChannel)


def _name(resources) -> str:
    ids = resources.get("nbgrader", {})
    return f"{ids.get('student')}/{ids.get('assignment')}/{ids.get('notebook')}"


NOT_RUN = (
    "The grader did not run this notebook's cells: each graded cell's result below comes from the isolated "
    "checks of your kvlib code, which do not need them. Run the notebook yourself to see its outputs.\n"
)


def _not_run(nb):
    """The notebook as autograde leaves it when no cell needs the kernel: no outputs, and one note."""
    first = True
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if first:
            cell.outputs = [new_output("stream", name="stdout", text=NOT_RUN)]
            first = False
    return nb


def _without_hidden_tests(source: str) -> str:
    out, hidden = [], False
    for line in source.splitlines(keepends=True):
        if "BEGIN HIDDEN TESTS" in line:
            hidden = True
        elif "END HIDDEN TESTS" in line:
            hidden = False
        elif not hidden:
            out.append(line)
    return "".join(out)


class PlainModeRefused(RuntimeError):
    """No jail here, and the course's nbgrader_config.py does not allow grading without one."""


class GradingJail(Configurable):
    """Settings shared by the jailed kernel and the isolated checker (c.GradingJail.<name>)."""

    isolation = Unicode("auto", help="auto, namespaces (root), userns (user namespaces) or plain (no jail)").tag(
        config=True
    )
    uid = Integer(-1, help="uid of jailed processes in namespaces mode; -1: a fresh unused one for each").tag(
        config=True
    )
    python = Unicode(
        "", help="the interpreter inside the jail; default /usr/bin/pythonX.Y of the grader's version"
    ).tag(config=True)
    memory_limit_mb = Integer(4096, help="address-space limit of each jailed process").tag(config=True)
    extra_binds = List(
        Unicode(),
        help="host folders bound read-only at the same path inside, e.g. a conda "
        "environment whose python GradingJail.python names",
    ).tag(config=True)
    debug = Bool(False, help="let the jailed kernel write to the grader's terminal (raw fd 1 and 2)").tag(config=True)
    allow_plain = Bool(
        True,
        help="grade in plain mode (no jail: the submission's code runs as you) when no jail works here; "
        "a course folder from `kvlib course init` sets it False",
    ).tag(config=True)

    @property
    def mode(self) -> str:
        """The isolation grading gets here; PlainModeRefused if that is plain and allow_plain is False."""
        mode, why = find_mode(self.isolation)
        if mode == "plain" and not self.allow_plain:
            raise PlainModeRefused(
                f"refusing to grade in plain mode ({why}): the submissions' code would run as you, seeing "
                'what you see. Run autograde as root (sudo -E env PATH="$PATH" nbgrader autograde ...), '
                "or set c.GradingJail.allow_plain = True in nbgrader_config.py to grade without a jail "
                '(docs/instructors.md, "Isolation")'
            )
        return mode

    def announce(self, log) -> str:
        """Say in the log (stderr, and nbgrader's logfile if set), at the start of a grading run, which
        isolation it gets and why; raises PlainModeRefused where that is refused. Returns the mode."""
        mode = self.mode
        why = find_mode(self.isolation)[1]
        what = {
            "namespaces": "the kernel and the isolated checks run jailed, each as a fresh unprivileged uid",
            "userns": "the kernel and the isolated checks run jailed in user namespaces, as your uid outside",
            "plain": "NO JAIL: the kernel and the isolated checks run as you, seeing what you see",
        }[mode]
        log.warning("Grading isolation: %s (%s): %s", mode, why, what)
        return mode

    def limits(self, **kw) -> Limits:
        return Limits(memory_mb=self.memory_limit_mb, **kw)

    def interpreter(self) -> str:
        """The jail's Python: configured, else the system one of the grader's version, else the
        grader's own (its installation is then bound into the jail, see binds())."""
        if self.python:
            return self.python
        system = jail_python()
        return system if os.path.exists(system) else str(Path(sys.executable).resolve())

    def binds(self) -> dict[str, Path]:
        """Extra read-only binds, at the same path inside: extra_binds, and the grader's own Python
        installation when there is no system Python of its version."""
        paths = [Path(p) for p in self.extra_binds]
        if not self.python and not os.path.exists(jail_python()):
            paths.append(Path(sys.base_prefix).resolve())
        return {str(p.resolve()): p.resolve() for p in paths}


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in a jail (unless GradingJail.isolation ends up plain)."""

    _kernel_jail: Jail | None = None
    _kernel_files: Path | None = None

    async def _async_pre_start_kernel(self, **kw):
        settings = GradingJail(config=self.config)
        mode = settings.mode
        self._cleanup_jail()
        if mode == "plain":  # nbgrader's usual kernel, but never in the grader's HOME (root-owned files left there)
            cmd, kw = await super()._async_pre_start_kernel(**kw)
            home = self._kernel_files = Path(tempfile.mkdtemp(prefix="kvlib-kernel-home-"))
            env = dict(kw.get("env") or os.environ)
            env.update(HOME=str(home), IPYTHONDIR=str(home / "ipython"), MPLCONFIGDIR=str(home / "matplotlib"))
            kw["env"] = env
            return cmd, kw
        files = self._kernel_files = Path(tempfile.mkdtemp(prefix="kvlib-kernel-"))  # mode 700
        # Jupyter talks to the kernel over Unix sockets in a folder of its own, not TCP on localhost:
        # the jail then has no network at all (its own, empty network namespace)
        sockets = files / "ipc"
        sockets.mkdir()
        self.transport, self.ip = "ipc", str(sockets / "kernel")
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        (files / "conn").mkdir()
        (files / "boot").mkdir()
        shutil.copyfile(self.connection_file, files / "conn" / "kernel.json")
        shutil.copyfile(Path(__file__).with_name("_kernel_boot.py"), files / "boot" / "_kernel_boot.py")
        nb_dir = Path(kw.get("cwd") or os.getcwd()).resolve()
        sites = site_dirs()
        binds = {"/nb": nb_dir, "/conn": files / "conn", "/boot": files / "boot"}
        binds.update({f"/site{i}": p for i, p in enumerate(sites)})
        binds.update(settings.binds())
        # every kvlib/checks/ the kernel could read gets a stand-in: grade() and no checks (_kernel_checks.py)
        stand_in = files / "checks"
        stand_in.mkdir(mode=0o755)
        shutil.copyfile(Path(__file__).with_name("_kernel_checks.py"), stand_in / "__init__.py")
        (stand_in / "__init__.py").chmod(0o644)
        masked = [inside for inside, host in binds.items() if (host / "kvlib" / "checks").is_dir()]
        binds.update({f"{inside}/kvlib/checks": stand_in for inside in masked})
        jail = self._kernel_jail = Jail(
            mode,
            binds=binds,
            network=False,
            uid=settings.uid,
            tmp_mb=512,
            limits=settings.limits(),
            cwd="/nb",
            writable=(sockets,),
        )
        jail.hand_over(files / "conn", files / "boot")  # the kernel's key: for the kernel only
        if mode == "namespaces":  # the kernel makes its sockets here, as its own uid
            os.chown(sockets, jail.uid, jail.uid)
        sockets.chmod(0o700)
        cfg = {
            "cwd": "/nb",
            "site": [f"/site{i}" for i in range(len(sites))],
            "connection_file": "/conn/kernel.json",
            "args": ["--HistoryManager.enabled=False", "--IPKernelApp.log_level=WARN"],
        }
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": "/tmp/home",
            "USER": "learner",
            "LOGNAME": "learner",
            "IPYTHONDIR": "/tmp/ipython",
            "MPLCONFIGDIR": "/tmp/matplotlib",
            "JUPYTER_RUNTIME_DIR": "/tmp/runtime",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            "NBGRADER_EXECUTION": os.environ.get("NBGRADER_EXECUTION", "autograde"),
        }
        kw["env"] = env
        kw["cwd"] = str(jail.dir)
        kw["preexec_fn"] = jail.limits.apply
        if not settings.debug:  # a learner's os.write(1, ...) must not flood the grader's log
            kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        argv = [settings.interpreter(), "-I", "-S", "-B", "/boot/_kernel_boot.py", json.dumps(cfg)]
        return jail.command(argv), kw

    def _cleanup_jail(self) -> None:
        if self._kernel_jail is not None:
            self._kernel_jail.close()
            self._kernel_jail = None
        if self._kernel_files is not None:
            remove_tree(self._kernel_files)
            self._kernel_files = None

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            self._cleanup_jail()

    # nbclient calls this name for a kernel that died; jupyter_client binds it to the base method
    cleanup_resources = _async_cleanup_resources


class SandboxExecute(Execute):
    """nbgrader's Execute with the kernel in a jail, a budget for the whole notebook (after it,
    the remaining cells are not run), and a cap on each cell's output."""

    notebook_timeout = Integer(
        300, help="seconds for all the cells of one notebook; Execute.timeout still bounds each cell"
    ).tag(config=True)
    max_output_chars = Integer(100_000, help="output kept per cell; the rest is dropped with a note").tag(config=True)
    skip_isolated_hidden_tests = Bool(
        True,
        help="do not run, in the kernel, the hidden tests of graded cells that IsolatedGrading scores: "
        "their outcome there is discarded, and they import torch (seconds per notebook)",
    ).tag(config=True)

    run_kernel = Enum(
        ["when-needed", "always"],
        "when-needed",
        help="when-needed: run the notebook in the kernel only if something in it counts there (a graded cell "
        "IsolatedGrading does not score, a learner's answer cell, a code cell the learner added or changed); "
        "otherwise no cell is run (the scores are the same: they come from the isolated checks) and the "
        "feedback says so. always: run every notebook.",
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources, km=None):
        self._deadline = monotonic() + self.notebook_timeout
        self._stopped = ""
        self._out_chars: dict[int, int] = {}
        # the kernel is ours whatever the notebook's metadata names (nbgrader restores it anyway)
        self.kernel_name = "python3"
        self._isolated: set[str] = set()
        if self.skip_isolated_hidden_tests:
            self._isolated = isolated_cell_ids(self.config)
        why = self._kernel_needed(nb, resources)
        if why is None:
            self.log.info(
                "not running %s in a kernel: every graded cell is scored by isolated checks", _name(resources)
            )
            return _not_run(nb), resources
        self.log.debug("running %s in a kernel: %s", _name(resources), why)
        try:
            return super().preprocess(nb, resources, km=km)
        finally:  # a kernel that died or hung skips jupyter's own clean-up
            if isinstance(getattr(self, "km", None), SandboxKernelManager):
                self.km._cleanup_jail()

    def _kernel_needed(self, nb, resources) -> str | None:
        """Why this notebook must run in the kernel, or None when nothing in it counts there."""
        if self.run_kernel == "always":
            return "SandboxExecute.run_kernel = always"
        ids = resources.get("nbgrader", {})
        try:
            coursedir = CourseDirectory(config=self.config)
            folder = coursedir.format_path(coursedir.source_directory, ".", ids["assignment"])
            source = nbformat.read(Path(folder) / f"{ids['notebook']}.ipynb", as_version=4)
        except Exception as err:  # no source to compare with: run it, as nbgrader would
            return f"its source notebook could not be read ({type(err).__name__})"
        known = {c.source for c in source.cells if c.cell_type == "code"}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution"):
                return f"cell {meta.get('grade_id')} is the learner's answer"
            if cell.cell_type != "code":
                continue
            if meta.get("grade") and meta.get("grade_id") not in self._isolated:
                return f"graded cell {meta.get('grade_id')} is scored in the kernel"
            if cell.source not in known and cell.source.strip():
                return "a code cell the learner added or changed"
        return None

    async def async_start_new_kernel_client(self):
        return poll_in_steps(await super().async_start_new_kernel_client())

    start_new_kernel_client = run_sync(async_start_new_kernel_client)  # the sync setup_kernel calls this one

    def _get_timeout(self, cell):
        base = super()._get_timeout(cell)
        left = max(1.0, self._deadline - monotonic())
        return int(math.ceil(min(base, left) if base else left))

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if not self._stopped and monotonic() >= self._deadline:
            self._stopped = (
                f"Not run: the notebook used up its {self.notebook_timeout} s (look for an endless loop above)."
            )
        if self._stopped:
            cell.outputs = [new_output("stream", name="stderr", text=self._stopped + "\n")]
            cell.execution_count = None
            return cell, resources
        source = cell.source
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in self._isolated and cell.metadata.nbgrader.get("grade"):
            cell.source = _without_hidden_tests(source)
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._stopped = "Not run: the kernel died in an earlier cell (did your code exit Python?)."
            cell.outputs.append(new_output("stream", name="stderr", text="The kernel died while running this cell.\n"))
            return cell, resources
        except CellTimeoutError:  # no reply even after the interrupt: the kernel is stuck
            self._stopped = (
                "Not run: the kernel was still stuck in an earlier cell (an endless loop that ignores interrupts?)."
            )
            cell.outputs.append(
                new_output("stream", name="stderr", text="This cell did not finish, even when interrupted.\n")
            )
            return cell, resources
        except Exception as err:  # the kernel is the submission's: whatever it sends, grading goes on
            self.log.warning("kernel failure in cell %d: %s: %s", index, type(err).__name__, err)
            self._stopped = "Not run: the kernel stopped answering properly in an earlier cell."
            cell.outputs.append(
                new_output("stream", name="stderr", text=f"The kernel failed here ({type(err).__name__}).\n")
            )
            return cell, resources
        finally:
            cell.source = source

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        size = len(content.get("text", "")) + sum(len(str(v)) for v in content.get("data", {}).values())
        size += sum(len(line) for line in content.get("traceback", []))
        used = self._out_chars.get(cell_index, 0)
        self._out_chars[cell_index] = used + size
        if used + size <= self.max_output_chars:
            return super().output(outs, msg, display_id, cell_index)
        if used <= self.max_output_chars:
            note = new_output(
                "stream",
                name="stderr",
                text=f"\n[output dropped: this cell printed more than {self.max_output_chars:,} characters]\n",
            )
            outs.append(note)
            return note
        return None
