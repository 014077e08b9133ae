"""The grader's side of isolated checking: a jailed child runs the learner's functions, the
checks run here, in the trusted grading process, on what comes back.

  sandbox = Sandbox({"kvlib/attention.py": source, ...}, functions=["attention.softmax", ...])
  kvlib.checks.CHECKS["softmax_is_stable"].fn(sandbox.module("attention"), rng)

sandbox.module("attention") is a module-like proxy: each exercise function forwards its call
(numpy arrays, torch tensors, Python numbers, dtypes, ModelConfigs, generators, Decoders and
Attention layers as their weights, kvlib.core.paging Requests as their numbers, str-keyed dicts,
functions to call back) to the child and returns the child's numbers; a Decoder that comes back is
rebuilt here by the grader's kvlib.core.model, an object of the learner's own class (a KVCache, a
BlockPool, a Scheduler, a SinkCache) stays in the child behind a RemoteObject. kvlib.core's own
classes that a learner module re-exports (Request, OutOfBlocks) are the grader's: a check builds a
Request here, and an OutOfBlocks the child raises is raised here as the grader's OutOfBlocks.
The child is started lazily, serves every call of one submission, and is killed and restarted
after a call that times out or kills it; a function that hung once fails at once afterwards.
A call whose memory is graded (fn.memory(...)) is measured by this process in the child's /proc
(kvlib.grading.memory), where the learner's code cannot reach; the child cannot start processes.
Not here: which files and checks (kvlib.grading.preprocessor), the jail itself (jail.py).
"""

from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from kvlib.course.exercises import BY_ID, ExerciseNotDone, ready_made
from kvlib.grading import _child
from kvlib.grading.jail import Jail, Limits, jail_python, kill, remove_tree, site_dirs
from kvlib.grading.memory import Watch, python_pid

_NUMBER_KINDS = "biufc"
_TENSOR_DTYPES = {
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
    "complex128",
}
# builtin exceptions a learner's function may raise that a check could expect (e.g. ValueError
# on a bad shape); any other type comes back as LearnerError
_REMOTE_TYPES = {
    e.__name__: e
    for e in (
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        LookupError,
        ZeroDivisionError,
        ArithmeticError,
        FloatingPointError,
        OverflowError,
        RuntimeError,
        NotImplementedError,
        AttributeError,
        RecursionError,
        MemoryError,
    )
}


class SandboxError(Exception):
    """A call to the learner's code failed in a way a check does not anticipate (a timeout, a
    crash, a result that is not numbers). The message is shown to the learner."""


class LearnerError(Exception):
    """An exception of a type the grader does not recreate, raised by the learner's code."""


class SetupError(RuntimeError):
    """The isolated child could not start for a reason that is not the submission's (a missing
    Python, no permission to create namespaces): the instructor's to fix."""


# kvlib.core's names a learner module re-exports that a check uses: the grader's own class, never the child's
_GRADERS_OWN = {"Request": "kvlib.core.paging", "OutOfBlocks": "kvlib.core.paging"}
_CORE_EXCEPTIONS = ("OutOfBlocks",)  # raised in the child (by kvlib.core.paging), recreated here by name


def _graders_own(name: str):
    return getattr(importlib.import_module(_GRADERS_OWN[name]), name)


def _remote_class(name) -> type | None:
    """The grader's class for an exception the child names (its own type or a base class): a builtin exception
    (never one that steers control flow: StopIteration, GeneratorExit, SystemExit...) or kvlib.core's OutOfBlocks."""
    if not isinstance(name, str):
        return None
    if name in _CORE_EXCEPTIONS:
        return _graders_own(name)
    cls = _REMOTE_TYPES.get(name) or getattr(builtins, name, None)
    if (
        isinstance(cls, type)
        and issubclass(cls, Exception)
        and not issubclass(cls, (StopIteration, StopAsyncIteration))
    ):
        return cls
    return None


def _remote_exception(head: dict) -> BaseException:
    etype, message, where = str(head.get("type", "Exception")), str(head.get("message", "")), str(head.get("where", ""))
    nd = str(head.get("not_done", ""))
    if nd in BY_ID:
        needed = BY_ID.get(str(head.get("needed_by", "")))
        return ExerciseNotDone(BY_ID[nd], needed if needed is not BY_ID[nd] else None)
    bases = head.get("bases") if isinstance(head.get("bases"), list) else []
    cls = next((c for c in map(_remote_class, [etype, *bases[:20]]) if c is not None), None)
    err = cls(message) if cls is not None else LearnerError(f"{etype}: {message}")
    err.kvlib_where = where  # type: ignore[attr-defined]
    return err


# ---------------------------------------------------------------------------------------------
# Reading the child's replies: bounded, no pickle, numbers only


_METHOD = object()  # a getattr reply's "that attribute is a method": RemoteObject makes it a call


def _check_node(node, files: dict, depth: int = 0, origin: tuple | None = None):
    """Rebuild a value from the reply's schema; anything not plain numbers raises SandboxError.
    origin: (sandbox, fn) of the call, for a handle to an object the child keeps (a learner's KVCache)."""
    if depth > _child.MAX_DEPTH or not isinstance(node, dict):
        raise SandboxError("a malformed reply")
    t = node.get("t")
    if t == "handle" and origin is not None:
        key = node.get("id")
        if type(key) is not int:
            raise SandboxError("a malformed reply")
        return RemoteObject(origin[0], origin[1], key, str(node.get("type", "object"))[:100])
    if t == "method" and origin is not None and depth == 0:
        return _METHOD
    if t == "phandle" and origin is not None:  # a grader's object the child was handed, coming back (the cache)
        key = node.get("id")
        obj = origin[0]._parents.get(key) if type(key) is int else None
        if obj is None:
            raise SandboxError("an object of the grader's that this call was never handed")
        return obj
    if t == "none":
        return None
    if t in ("bool", "int", "float", "str"):
        v = node.get("v")
        want = {"bool": bool, "int": int, "float": float, "str": str}[t]
        if t == "float" and type(v) is int:
            v = float(v)
        if type(v) is not want:
            raise SandboxError("a malformed reply")
        return v
    if t in ("array", "npscalar", "tensor"):
        arr = files.get(node.get("k"))
        if arr is None:
            raise SandboxError("a malformed reply")
        if t == "npscalar":
            if arr.ndim != 0:
                raise SandboxError("a malformed reply")
            return arr[()]
        if t == "tensor":
            import torch  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

            dtype = node.get("dtype")
            if dtype not in _TENSOR_DTYPES:
                raise SandboxError(f"a tensor of dtype {dtype!r}")
            return torch.from_numpy(np.ascontiguousarray(arr)).to(getattr(torch, dtype))
        return arr
    if t in ("tuple", "list"):
        items = node.get("items")
        if not isinstance(items, list) or len(items) > _child.MAX_ITEMS:
            raise SandboxError("a malformed reply")
        out = [_check_node(x, files, depth + 1, origin) for x in items]
        return tuple(out) if t == "tuple" else out
    if t == "dict":
        keys, items = node.get("keys"), node.get("items")
        if (
            not isinstance(keys, list)
            or not isinstance(items, list)
            or len(keys) != len(items)
            or len(items) > _child.MAX_ITEMS
            or not all(type(k) is str for k in keys)
        ):
            raise SandboxError("a malformed reply")
        return dict(zip(keys, (_check_node(x, files, depth + 1, origin) for x in items)))
    if t == "request":  # rebuilt as the grader's kvlib.core.paging.Request, from ints only
        items = node.get("items")
        if not isinstance(items, list) or len(items) != len(_child._REQUEST_FIELDS):
            raise SandboxError("a malformed reply")
        rid, prompt, max_new, out = (_check_node(x, files, depth + 1) for x in items)
        if not (
            type(rid) is int
            and type(max_new) is int
            and all(isinstance(v, list) and all(type(i) is int for i in v) for v in (prompt, out))
        ):
            raise SandboxError("a Request whose id, prompt, max_new_tokens or tokens are not ints")
        return _graders_own("Request")(rid, prompt, max_new, out)
    if t == "generator":
        import torch  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

        arr = files.get(node.get("k"))
        if arr is None or arr.dtype != np.uint8 or arr.ndim != 1 or arr.size > 1 << 16:
            raise SandboxError("a malformed reply")
        gen = torch.Generator()
        try:
            gen.set_state(torch.from_numpy(arr.copy()))
        except RuntimeError:
            raise SandboxError("a generator state that torch refuses") from None
        return gen
    if t == "decoder":
        names, tensors = node.get("names"), node.get("tensors")
        if (
            not isinstance(names, list)
            or not isinstance(tensors, list)
            or len(names) != len(tensors)
            or len(names) > _child.MAX_ITEMS
        ):
            raise SandboxError("a malformed reply")
        model = _decoder(
            node.get("config"), [str(n) for n in names], [_check_node(x, files, depth + 1) for x in tensors]
        )
        return model.train(
            node.get("training") is True
        )  # its train/eval mode, as the child left it (Exercise 6.4 keeps it)
    raise SandboxError("a malformed reply")


_MAX_ROPE = 1 << 24  # rotary-table entries (max_seq_len x head_dim) a returned Decoder may ask the grader to compute


def _decoder(config, names: list[str], tensors: list):
    """A kvlib Decoder rebuilt here, by the grader's own kvlib.core.model, from the config and weights a
    child sent: its forward is ours, whatever the submission's code was; the weights must be
    exactly the ones its config calls for."""
    import torch  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

    from kvlib.core.model import Decoder, ModelConfig, decode_layout, num_params, rotary_tables  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

    if not isinstance(config, dict) or not all(
        isinstance(k, str) and type(v) in (int, float) for k, v in config.items()
    ):
        raise SandboxError("a Decoder whose config is not numbers")
    try:
        cfg = ModelConfig(**config)
    except (TypeError, ValueError) as err:
        raise SandboxError(f"a Decoder with an impossible config ({err})") from None
    if cfg.max_seq_len * cfg.head_dim > _MAX_ROPE:
        raise SandboxError(f"a Decoder with max_seq_len {cfg.max_seq_len}: too large to grade")
    if sum(t.numel() for t in tensors if isinstance(t, torch.Tensor)) != num_params(cfg):
        raise SandboxError("a Decoder whose weights do not match its config (names or shapes)")
    # built on the CPU, no larger than the weights that came (checked above), its random initial weights drawn
    # from a forked generator so that no check's later draws move; on the meta device its first build
    # initialised through torch's Python decompositions and imported torch._dynamo: 1 s of every grading
    with torch.random.fork_rng(devices=[]):
        model = Decoder(cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = dict(zip(names, tensors))
    if set(got) != set(want) or any(
        not isinstance(v, torch.Tensor) or tuple(v.shape) != want[k] for k, v in got.items()
    ):
        raise SandboxError("a Decoder whose weights do not match its config (names or shapes)")
    model.load_state_dict(got, assign=True)
    decode_layout(model)  # as Decoder lays its weights out: the same kernels, the same last bits
    cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    model.rope_cos, model.rope_sin = cos, sin
    return model.eval()


def _model():
    import kvlib.core.model  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

    return kvlib.core.model


def _mirror(local, node, files) -> None:
    """Copy into a grader-side argument what the call did to the child's copy of it (in place)."""
    import torch  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

    if node is None or not isinstance(node, dict):
        return
    value = _check_node(node, files)
    with torch.no_grad():
        if isinstance(local, torch.Tensor) and isinstance(value, torch.Tensor) and value.shape == local.shape:
            if not torch.equal(value.to(local.dtype), local):
                local.copy_(value)
        elif isinstance(local, torch.Generator) and isinstance(value, torch.Generator):
            local.set_state(value.get_state())
        elif isinstance(local, _model().Decoder) and isinstance(value, _model().Decoder):
            theirs, ours = value.state_dict(), local.state_dict()
            if theirs.keys() == ours.keys() and all(theirs[k].shape == ours[k].shape for k in ours):
                for k, w in ours.items():
                    if not torch.equal(theirs[k].to(w.dtype), w):
                        w.copy_(theirs[k])


def load_reply(data: bytes) -> tuple[dict, dict]:
    """(head, arrays) from an .npz the child sent: stored (not compressed) members only, headers
    checked against the bytes actually there, numeric dtypes only, np.load(allow_pickle=False)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        arrays, head = {}, None
        for info in zf.infolist():
            if (
                info.compress_type != zipfile.ZIP_STORED
                or not info.filename.endswith(".npy")
                or info.file_size > len(data)
            ):
                raise ValueError("not a plain .npz")
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                count = int(np.prod(shape, dtype=np.int64)) if shape else 1
                if dtype.hasobject or count < 0 or count * dtype.itemsize > info.file_size:
                    raise ValueError("an array larger than its data")
            name = info.filename[:-4]
            if name == "__head__":
                if dtype.kind != "U" or shape != ():
                    raise ValueError("a malformed header")
            elif dtype.kind not in _NUMBER_KINDS or dtype.fields is not None:
                raise ValueError(f"an array of dtype {dtype}")
            with zf.open(info) as f:
                value = np.lib.format.read_array(f, allow_pickle=False)
            if name == "__head__":
                head = json.loads(str(value))
            else:
                arrays[name] = value
        if not isinstance(head, dict):
            raise ValueError("no header")
        return head, arrays
    except SandboxError:
        raise
    except Exception as err:
        raise SandboxError(f"the isolated process sent something that is not plain numbers ({err})") from None


# ---------------------------------------------------------------------------------------------
# The child process


def _write_all(fd: int, data: bytes, deadline: float) -> bool:
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _, w, _ = select.select([], [fd], [], left)
        if not w:
            return False
        try:
            view = view[os.write(fd, view[: 1 << 16]) :]
        except BlockingIOError:
            continue
        except OSError:  # BrokenPipeError: the child died
            raise EOFError from None
    return True


def _read_exact(fd: int, n: int, deadline: float) -> bytes | None:
    """n bytes, None on timeout; EOFError when the child closed the pipe (it died)."""
    chunks, left = [], n
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0:
            return None
        r, _, _ = select.select([fd], [], [], wait)
        if not r:
            return None
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_PACKAGE_PATH = re.compile(r"kvlib(/[A-Za-z_]\w*)*/[A-Za-z_]\w*\.py")  # kvlib/<name>.py, kvlib/<sub>/<name>.py


NOT_IN_THE_CHILD = ("checks", "grading", "app")  # kvlib's subpackages a submission's code cannot import when graded


def package_files(folder: Path) -> dict[str, bytes]:
    """The kvlib package a child imports, from folder (a kvlib/ directory): {"kvlib/<path>.py": bytes}.

    Every module and subpackage but the grader's own (NOT_IN_THE_CHILD: the checks, whose reference
    computations a learner's module must not call, the grader, the commands); links are left out."""
    files = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        if (
            path.is_file()
            and not path.is_symlink()
            and rel.parts[0] not in NOT_IN_THE_CHILD
            and "__pycache__" not in rel.parts
        ):
            files[f"kvlib/{rel.as_posix()}"] = path.read_bytes()
    return files


class Sandbox:
    """One submission's isolated child. files: {"kvlib/<path>.py": bytes} (the package it imports),
    modules: the exercise modules to import, functions: "module.name" callables it may run."""

    def __init__(
        self,
        files: dict[str, bytes],
        modules: list[str],
        functions: list[str],
        *,
        mode: str,
        python: str | None = None,
        uid: int = -1,
        call_timeout: float = 10.0,
        budget: float = 120.0,
        start_timeout: float = 60.0,
        torch: bool = False,
        limits: Limits | None = None,
        max_reply_mb: int = 64,
        binds: dict[str, Path] | None = None,
    ):
        self.files, self.modules, self.functions = dict(files), list(modules), list(functions)
        # kvlib's ready-made answers to an exercise, closed in the child while it runs (kvlib.course.exercises)
        self.ready_made = {f: ready_made(f) for f in self.functions if ready_made(f)}
        self.mode, self.uid, self.torch = mode, uid, torch
        self.python = python or (jail_python() if mode != "plain" else _plain_python())
        self.call_timeout, self.start_timeout = call_timeout, start_timeout
        self.deadline = time.monotonic() + budget
        self.budget = budget
        self.limits = limits or Limits()
        self.max_reply = max_reply_mb << 20
        self.extra_binds = dict(binds or {})
        self.failed: dict[str, str] = {}  # function -> why it fails at once from now on
        self.broken: str | None = None  # the package does not import: every call fails with this
        self.import_note = ""  # added to an import failure's message (a learner's module the grader refused)
        self.calls = self.starts = 0
        self.questions = 0  # what the child asked of the grader's objects (calls of a check's model, its drafter...)
        self.sent = 0  # bytes of arrays sent to the child (a measured call's inputs: it holds them while it runs)
        self._parents: dict[int, object] = {}  # key -> a check's object handed to the child, for one outermost call
        self._parent_keys: dict[int, int] = {}  # id(object) -> key; keys are never reused
        self._next_key = 0
        self._depth = 0
        self._proc: subprocess.Popen | None = None
        self._jail: Jail | None = None
        self._watch: Watch | None = None  # the child's /proc files, opened before its learner code runs
        self.unwatched = ""  # why the child's memory cannot be read here, if it cannot
        self.spawn = ""  # "closed", or why the child can still start processes (kvlib.grading._child)
        self.fused = ""  # "closed", or why torch's fused attention kernel still runs there (a library call is light)
        self._tmp = Path(tempfile.mkdtemp(prefix="kvlib-sandbox-"))
        self._write_scratch()

    # -- set-up --------------------------------------------------------------------------------

    def _write_scratch(self) -> None:
        work, boot = self._tmp / "work", self._tmp / "boot"
        (work / "kvlib").mkdir(parents=True)
        boot.mkdir()
        for rel, data in self.files.items():
            if not _PACKAGE_PATH.fullmatch(rel):
                raise ValueError(
                    f"the sandbox takes kvlib/<name>.py and kvlib/<subpackage>/<name>.py files only, not {rel!r}"
                )
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        shutil.copyfile(_child.__file__, boot / "_child.py")

    def _start(self) -> None:
        self.starts += 1
        sites = site_dirs()
        binds = {"/boot": self._tmp / "boot", "/work": self._tmp / "work"}
        binds.update({f"/site{i}": p for i, p in enumerate(sites)})
        binds.update(self.extra_binds)
        self._jail = jail = Jail(self.mode, binds=binds, network=False, uid=self.uid, limits=self.limits, cwd="/work")
        jail.hand_over(self._tmp / "work", self._tmp / "boot")  # a fresh uid per start
        rfd, wfd = os.pipe()
        cfg = {
            "reply_fd": wfd,
            "site": [jail.path(f"/site{i}") for i in range(len(sites))],
            "work": jail.path("/work"),
            "modules": self.modules,
            "functions": self.functions,
            "ready_made": self.ready_made,
            "torch": self.torch,
        }
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            # glibc's fixed thresholds (setting them turns its adaptive ones off): a block of 16 KiB or more is
            # its own mapping, given back when freed, so what a call holds is what it uses (Watch reads it), and
            # a loop's temporaries cannot fragment the heap by more than 16 KiB a step
            "MALLOC_MMAP_THRESHOLD_": "16384",
            "MALLOC_TRIM_THRESHOLD_": "131072",
        }
        stderr = open(jail.dir / "stderr.log", "wb")
        try:
            self._proc = jail.popen(
                [self.python, "-I", "-S", "-B", jail.path("/boot/_child.py"), json.dumps(cfg)],
                env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(wfd,),
            )
        except OSError as err:
            raise SetupError(f"could not start the isolated child: {err}") from None
        finally:
            os.close(wfd)
            stderr.close()
        self._reply_fd = rfd
        os.set_blocking(self._proc.stdin.fileno(), False)  # a stuck child must not block the grader
        try:
            head = self._boot()
        except SandboxError as err:
            self._stop()
            self.broken = str(err)
            return
        except SetupError:
            self._stop()
            raise
        if head is None:
            self._stop()
            raise SetupError(f"the isolated child did not start within {self.start_timeout:g} s")
        if head.get("status") != "ready":
            self._stop()
            err = _remote_exception(head)
            where = getattr(err, "kvlib_where", "")
            self.broken = f"{', '.join(f'kvlib/{m}.py' for m in self.modules)} does not import: {_describe(err)}" + (
                f" (at {where})" if where else ""
            )
            if self.import_note:
                self.broken += f" ({self.import_note})"

    def _stop(self) -> None:
        kill(self._proc)
        if self._proc is not None:
            for f in (self._proc.stdin,):
                try:
                    f.close()
                except OSError:
                    pass
            try:
                os.close(self._reply_fd)
            except OSError:
                pass
        self._proc = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._jail is not None:
            self._jail.close()
            self._jail = None

    def _stderr_tail(self) -> str:
        try:
            return (self._jail.dir / "stderr.log").read_bytes()[-2000:].decode(errors="replace") if self._jail else ""
        except OSError:
            return ""

    def _boot(self) -> dict | None:
        """The child's first two frames: "booted" (numpy imported: the set-up works), then, after the
        grader's go (sent once it holds the child's /proc files), the import of the learner's modules,
        "ready" or an error. None on timeout."""
        deadline = time.monotonic() + self.start_timeout
        try:
            data = self._read_frame(deadline)
        except (EOFError, SandboxError):
            data = b""
        if data is None:
            return None
        try:
            first = json.loads(data) if data[:1] == b"{" else {}
        except ValueError:
            first = {}
        if first.get("status") != "booted":
            rc = self._proc.poll() if self._proc else None
            raise SetupError(
                f"the isolated child could not start (exit code {rc}): "
                f"{first.get('message') or self._stderr_tail() or 'no message'}"
            )
        self.spawn = str(first.get("spawn", ""))[:300]
        self.fused = str(first.get("fused", ""))[:300]
        try:  # before the learner's code runs: it may make itself undumpable, which closes /proc/<pid> to others
            self._watch = Watch(python_pid(self._proc.pid, jailed=self.mode != "plain"))
            self.unwatched = ""
        except OSError as err:
            self._watch, self.unwatched = None, str(err)
        try:
            if not _write_all(self._proc.stdin.fileno(), _child.frame({"go": True}, {}), deadline):
                return None
        except EOFError:  # it died: the read below says so
            pass
        deadline = min(time.monotonic() + self.call_timeout, max(self.deadline, time.monotonic() + 1))
        try:
            data = self._read_frame(deadline)
        except EOFError:
            rc = self._proc.wait(timeout=10) if self._proc else None
            raise SandboxError(
                f"importing {', '.join(f'kvlib/{m}.py' for m in self.modules)} ended Python (exit code {rc})"
            ) from None
        if data is None:
            raise SandboxError(
                f"importing {', '.join(f'kvlib/{m}.py' for m in self.modules)} took longer than {self.call_timeout:g} s"
            )
        head, _ = load_reply(data)
        return head

    def _read_reply(self, deadline: float) -> dict | None:
        """The next reply's head, with its arrays in head["arrays"]; None on timeout."""
        data = self._read_frame(deadline)
        if data is None:
            return None
        head, arrays = load_reply(data)
        head["arrays"] = arrays
        return head

    def _read_frame(self, deadline: float) -> bytes | None:
        head = _read_exact(self._reply_fd, 8, deadline)
        if head is None:
            return None
        size = struct.unpack(">Q", head)[0]
        if size > self.max_reply:
            raise SandboxError(f"a result larger than {self.max_reply >> 20} MiB")
        return _read_exact(self._reply_fd, size, deadline)

    # -- calls ---------------------------------------------------------------------------------

    def call_many(self, fn: str, calls: list[tuple]):
        """[fn(*args, **kwargs) for args, kwargs in calls], in turn, in one request to the child (3,000 draws of a
        sampler cost one round trip, not 3,000); a generator passed to several calls is one generator there."""
        if not calls or len(calls) > _child.MAX_ITEMS:
            raise SetupError(f"call_many takes 1 to {_child.MAX_ITEMS} calls, got {len(calls)}")
        return self.call(fn, (), {}, many=[(tuple(a), dict(k)) for a, k in calls])

    def call(self, fn: str, args: tuple, kwargs: dict, measure: bool = False, on: tuple | None = None, many=None):
        """fn(*args, **kwargs) in the child: its result, with what it did to tensor and Decoder
        arguments copied back into them, and functions passed as arguments (on_token) called with what
        the child's stand-ins for them recorded. on=(op, handle, attr): instead of fn itself, an
        attribute of an object the child handed out ("getattr", "method", "setattr": args is (value,)).
        measure=True: (result, Usage), the call's memory as this process reads it in the child's /proc
        (kvlib.grading.memory), from just before the request is sent until its reply has come: nothing
        the learner's code does in the child can hide what it holds from it."""
        name = fn.split(".", 1)[1]
        if self.broken:
            raise SandboxError(self.broken)
        if fn in self.failed:
            raise SandboxError(self.failed[fn])
        if time.monotonic() >= self.deadline:
            raise SandboxError(f"grading time for this notebook ({self.budget:g} s) ran out before {name} was called")
        if self._proc is None:
            self._start()
            if self.broken:
                raise SandboxError(self.broken)
        if measure and self._watch is None:
            raise SetupError(
                f"{name}'s memory is graded, and this grader cannot read the isolated child's: {self.unwatched} "
                "(the grader reads /proc/<pid>/status and clear_refs: Linux)"
            )
        if measure:
            self.call(fn, (), {}, on=("settle", -1, ""))  # its garbage freed first: the start is what it holds
        self.calls += 1
        enc = _child.Encoder(np, _torch_if_loaded(), parents=self._register)
        try:
            head = {
                "fn": fn,
                "args": [enc.encode(a) for a in args],
                "kwargs": {k: enc.encode(v) for k, v in kwargs.items()},
            }
            if on is not None:
                head.update(op=on[0], h=on[1], attr=on[2])
            if many is not None:
                head["many"] = [
                    {"args": [enc.encode(a) for a in a_], "kwargs": {k: enc.encode(v) for k, v in k_.items()}}
                    for a_, k_ in many
                ]
        except TypeError as err:
            raise SetupError(f"a check passed {fn} something the sandbox cannot send: {err}") from None
        data = _child.frame(head, enc.arrays)
        deadline = min(time.monotonic() + self.call_timeout, self.deadline)
        try:
            sent, start = self.sent, self._watch.start() if measure else None
        except OSError:  # the process ended since the settle
            self._stop()
            self.failed[fn] = f"{name} ended the Python process running it"
            raise SandboxError(self.failed[fn]) from None
        self._depth += 1
        self.sent += sum(a.nbytes for a in enc.arrays.values())
        try:
            if not _write_all(self._proc.stdin.fileno(), data, deadline):
                reply = None
            else:
                reply = self._read_reply(deadline)
                while isinstance(reply, dict) and reply.get("status") == "callback":  # it uses an object of ours
                    reply = self._read_reply(deadline) if self._answer(reply, fn, deadline) else None
            if start is not None and isinstance(reply, dict):  # read before anything else reaches the child
                usage = self._watch.usage(start, inputs=self.sent - sent)
        except EOFError:
            reply = "died"
        except SandboxError as err:
            if self._proc is None:  # a call made while answering the child failed and stopped it
                raise
            self._stop()
            self.failed[fn] = f"{name}: {err}"
            raise SandboxError(self.failed[fn]) from None
        finally:
            self._depth -= 1
            if self._depth == 0:  # the outermost call is over: the grader's objects it handed out go
                self._parents.clear()
                self._parent_keys.clear()
        if reply is None:
            self._stop()
            if time.monotonic() >= self.deadline:
                raise SandboxError(f"grading time for this notebook ({self.budget:g} s) ran out while {name} ran")
            self.failed[fn] = f"{name} was still running after {self.call_timeout:g} s: look for an endless loop"
            raise SandboxError(self.failed[fn])
        if reply == "died":
            rc = self._proc.poll() if self._proc else None
            self._stop()
            self.failed[fn] = f"{name} ended the Python process running it (exit code {rc})"
            raise SandboxError(self.failed[fn])
        if reply.get("status") == "ok":
            arrays = reply["arrays"]
            value = _check_node(reply.get("result"), arrays, origin=(self, fn))
            after, after_kw = reply.get("after"), reply.get("after_kw")
            changed = list(zip(args, after)) if isinstance(after, list) and len(after) == len(args) else []
            after_many = reply.get("after_many")
            if many is not None and isinstance(after_many, list) and len(after_many) == len(many):
                for (a_, _), node in zip(many, after_many):
                    if isinstance(node, list) and len(node) == len(a_):
                        changed += list(zip(a_, node))
            if isinstance(after_kw, dict):
                changed += [(kwargs[k], node) for k, node in after_kw.items() if k in kwargs]
            try:
                for local, node in changed:
                    _mirror(local, node, arrays)
            except SandboxError as err:
                raise SandboxError(f"{name} left an argument as {err}") from None
            calls = reply.get("callbacks") or []
            if not isinstance(calls, list) or len(calls) > _child.MAX_ITEMS:
                raise SandboxError("a malformed reply")
            for call in calls:  # replayed in order, after the call: a check only collects what it is given
                if not (
                    isinstance(call, list)
                    and len(call) == 2
                    and type(call[0]) is int
                    and 0 <= call[0] < len(enc.callbacks)
                    and isinstance(call[1], list)
                ):
                    raise SandboxError("a malformed reply")
                enc.callbacks[call[0]](*[_check_node(n, arrays) for n in call[1]])
            return (value, usage) if measure else value
        if reply.get("what") == "result":
            raise SandboxError(
                f"{name} returned {reply.get('message')}: return numbers (a numpy array, or a tuple of them)"
            )
        raise _remote_exception(reply)

    def _register(self, obj) -> int:
        """The key the child knows a check's object by (one per object, for the outermost call)."""
        key = self._parent_keys.get(id(obj))
        if key is None or self._parents.get(key) is not obj:
            key, self._next_key = self._next_key, self._next_key + 1
            self._parents[key], self._parent_keys[id(obj)] = obj, key
        return key

    def _answer(self, head: dict, fn: str, deadline: float) -> bool:
        """Run what the child asks of a check's object (call it, read an attribute, call a method, assign one)
        here, in the grader, and send the answer; False if it could not be sent in time. A question that
        does not parse stops the child (SandboxError); one the object refuses is answered with the error."""
        import torch  # noqa: PLC0415 (start-up time: a numpy-only notebook's grading loads no torch)

        self.questions += 1
        op, key, attr, arrays = head.get("op"), head.get("h"), head.get("attr"), head["arrays"]
        args, kwargs = head.get("args"), head.get("kwargs")
        if (
            op not in ("call", "getattr", "method", "setattr")
            or type(key) is not int
            or key not in self._parents
            or not isinstance(attr, str)
            or len(attr) > 100
            or attr.startswith("_")
            or (op != "call" and not attr)
            or not isinstance(args, list)
            or not isinstance(kwargs, dict)
            or len(args) + len(kwargs) > 64
            or not all(isinstance(k, str) for k in kwargs)
        ):
            raise SandboxError("a malformed question to the grader")
        obj = self._parents[key]
        args = [_check_node(n, arrays, origin=(self, fn)) for n in args]
        kwargs = {k: _check_node(n, arrays, origin=(self, fn)) for k, n in kwargs.items()}
        if any(v is _METHOD for v in (*args, *kwargs.values())):
            raise SandboxError("a malformed question to the grader")
        public = getattr(type(obj), "kvlib_public", None)  # what of the check's object the learner's code may use
        try:
            if attr and public is not None and attr not in public:
                raise AttributeError(f"{type(obj).__name__!r} object has no attribute {attr!r}")
            if op == "call":
                if not callable(obj):
                    raise TypeError(f"{type(obj).__name__!r} object is not callable")
                result = obj(*args, **kwargs)
            elif op == "getattr":
                result = getattr(obj, attr)
                if callable(result) and not isinstance(result, (torch.Tensor, type)):
                    result = _child._Method()
            elif op == "method":
                result = getattr(obj, attr)(*args, **kwargs)
            else:
                if len(args) != 1:
                    raise SandboxError("a malformed question to the grader")
                setattr(obj, attr, args[0])
                result = None
            enc = _child.Encoder(np, torch, parents=self._register)
            answer = {"answer": "ok", "result": enc.encode(result)}
            if enc.callbacks:
                raise TypeError("a function, which the grader does not send")
        except SandboxError:
            raise
        except Exception as err:  # the check's object refused (cache.truncate(-1): ValueError): the learner's to see
            if self._proc is None:  # a call into the child made here stopped it
                raise SandboxError(str(err)) from None
            base = next(c for c in type(err).__mro__ if c.__module__ == "builtins")
            enc = _child.Encoder(np, torch)
            answer = {"answer": "error", "type": base.__name__, "message": str(err)[:2000]}
        self.sent += sum(a.nbytes for a in enc.arrays.values())
        return _write_all(self._proc.stdin.fileno(), _child.frame(answer, enc.arrays), deadline)

    def module(self, name: str) -> "SandboxModule":
        return SandboxModule(self, name, [f.split(".", 1)[1] for f in self.functions if f.split(".", 1)[0] == name])

    def close(self) -> None:
        self._stop()
        remove_tree(self._tmp)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SandboxModule:
    """Stands in for kvlib.<module> in a check: its exercise functions run in the sandbox."""

    def __init__(self, sandbox: Sandbox, module: str, names: list[str]):
        self._sandbox, self._module, self._names = sandbox, module, set(names)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(f"kvlib.{self._module}.{name} is not an exercise function the isolated grader runs")
        if name in _GRADERS_OWN:  # kvlib.core's class, re-exported (serving.Request): the grader's own
            return _graders_own(name)
        if name not in self._names:  # another function of the module: only to pass to an exercise (to_gqa's pool)
            return RemoteFunction(self._module, name)
        fn = f"{self._module}.{name}"

        def forward(*args, **kwargs):
            return self._sandbox.call(fn, args, kwargs)

        def memory(*args, **kwargs):  # (result, kvlib.grading.memory.Usage): the child's memory, read by the grader
            return self._sandbox.call(fn, args, kwargs, measure=True)

        def many(calls):
            return self._sandbox.call_many(fn, calls)

        forward.__name__, forward.memory, forward.many = name, memory, many
        return forward

    def __repr__(self) -> str:
        return f"<kvlib.{self._module} in the sandbox>"


class RemoteObject:
    """An object of the learner's own class (a KVCache, a BlockPool), kept in the isolated child: reading
    an attribute fetches a copy of its value (numbers; a method comes back callable), calling a method
    runs it there, assigning an attribute sends the value there (pool.k = tensor). A copy read is not
    the child's: pool.k.normal_() changes nothing there; assign instead."""

    _kvlib_handle = True

    def __init__(self, sandbox: Sandbox, fn: str, handle_id: int, type_name: str):
        object.__setattr__(self, "_state", (sandbox, fn, handle_id, type_name))

    @property
    def handle_id(self) -> int:
        return self._state[2]

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        sandbox, fn, key, _ = self._state
        value = sandbox.call(fn, (), {}, on=("getattr", key, attr))
        if value is not _METHOD:
            return value

        def method(*args, **kwargs):
            return sandbox.call(fn, args, kwargs, on=("method", key, attr))

        def memory(*args, **kwargs):  # (result, Usage), as SandboxModule's functions have it
            return sandbox.call(fn, args, kwargs, measure=True, on=("method", key, attr))

        method.__name__, method.memory = attr, memory
        return method

    def __setattr__(self, attr: str, value):
        if attr.startswith("_"):
            raise SandboxError(f"a {self._state[3]} in the isolated child cannot be given a private attribute ({attr})")
        sandbox, fn, key, _ = self._state
        sandbox.call(fn, (value,), {}, on=("setattr", key, attr))

    def __repr__(self) -> str:
        return f"<{self._state[3]} in the sandbox>"


class RemoteFunction:
    """kvlib.<module>.<name> as the child has it: sent by name as an argument, never run here."""

    _kvlib_remote_ref = True

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args, **kwargs):
        raise SandboxError(
            f"kvlib.{self.module}.{self.name} runs only in the isolated child, as an argument of an exercise"
        )

    def __repr__(self) -> str:
        return f"<kvlib.{self.module}.{self.name} in the sandbox>"


def _describe(err: BaseException) -> str:
    if isinstance(err, (LearnerError, ExerciseNotDone)):
        return str(err)
    return f"{type(err).__name__}: {err}"


def describe(err: BaseException) -> str:
    """A failed check's message for the learner: the check's own words, or the error and where."""
    if isinstance(err, AssertionError):
        return str(err) or "an assertion failed"
    if isinstance(err, (SandboxError, ExerciseNotDone)):
        return str(err)
    where = getattr(err, "kvlib_where", "")
    return _describe(err) + (f" (at {where})" if where else "")


def _torch_if_loaded():
    return sys.modules.get("torch")


def _plain_python() -> str:
    return sys.executable


__all__ = [
    "LearnerError",
    "RemoteFunction",
    "RemoteObject",
    "Sandbox",
    "SandboxError",
    "SandboxModule",
    "SetupError",
    "describe",
    "load_reply",
]
