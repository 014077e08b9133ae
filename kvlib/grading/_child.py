"""The isolated child: the only process that runs a submission's kvlib code while grading.

Started as `python -I -S _child.py CONFIG_JSON` (no site, no .pth, no PYTHON* variables), in a
jail (kvlib.grading.jail). It puts the site-packages on sys.path, imports the real numpy (and
torch) before any learner code, then the learner's modules, then serves calls: each request is
a length-prefixed .npz (function name, arguments), each reply a .npz of plain numbers or an error.
Everything it replies is untrusted: the grader reads it with allow_pickle=False and checks it.
Stdlib and numpy only (this file is copied into the jail; kvlib is the learner's there).
"""
import io
import json
import os
import struct
import sys
import traceback

MAX_DEPTH = 4
MAX_ITEMS = 4096
_NUMBER_KINDS = "biufc"


def _send(fd, payload: bytes) -> None:
    data = struct.pack(">Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _recv(fd) -> bytes | None:
    def exact(n):
        chunks, left = [], n
        while left:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    head = exact(8)
    if head is None:
        return None
    return exact(struct.unpack(">Q", head)[0])


class Encoder:
    """Plain numbers to (schema, arrays): ndarray, numpy scalar, bool/int/float/None/str, torch
    tensor, and tuples/lists of those; in requests also a torch.dtype and a kvlib ModelConfig
    (its sizes; the parent never accepts either in a reply). Anything else (an object that compares equal to anything,
    an ndarray subclass's custom behaviour, a pickle) is refused, with its type in the message."""

    def __init__(self, np, torch=None):
        self.np, self.torch, self.arrays = np, torch, {}

    def _array(self, arr):
        np = self.np
        arr = np.array(arr, copy=True, subok=False)  # a plain ndarray: subclasses lose their methods
        if arr.dtype.kind not in _NUMBER_KINDS:
            raise TypeError(f"an array of dtype {arr.dtype}, not numbers")
        key = f"a{len(self.arrays)}"
        self.arrays[key] = arr
        return key

    def encode(self, obj, depth=0):
        np, torch = self.np, self.torch
        if depth > MAX_DEPTH:
            raise TypeError("values nested too deeply")
        t = type(obj)
        if obj is None:
            return {"t": "none"}
        if t is bool:
            return {"t": "bool", "v": obj}
        if t is int:
            return {"t": "int", "v": obj}
        if t is float:
            return {"t": "float", "v": obj}
        if t is str:
            if len(obj) > 100_000:
                raise TypeError("a string longer than 100,000 characters")
            return {"t": "str", "v": obj}
        if isinstance(obj, np.ndarray):
            return {"t": "array", "k": self._array(obj)}
        if isinstance(obj, np.generic) and t.__module__ == "numpy":
            return {"t": "npscalar", "k": self._array(obj)}
        if torch is not None and t is torch.Tensor:
            dtype = str(obj.dtype).replace("torch.", "")
            arr = obj.detach().cpu()
            if dtype == "bfloat16":
                arr = arr.float()
            return {"t": "tensor", "k": self._array(arr.numpy()), "dtype": dtype}
        if torch is not None and t is torch.dtype:
            return {"t": "dtype", "v": str(obj).replace("torch.", "")}
        if t.__name__ == "ModelConfig" and t.__module__ == "kvlib.model":  # sizes only: rebuilt in the child
            fields = dict(vars(obj))
            if not all(type(v) in (int, float) for v in fields.values()):
                raise TypeError("a ModelConfig with a field that is not a number")
            return {"t": "config", "v": fields}
        if t is tuple or t is list:
            if len(obj) > MAX_ITEMS:
                raise TypeError(f"a {t.__name__} of more than {MAX_ITEMS} items")
            return {"t": t.__name__, "items": [self.encode(x, depth + 1) for x in obj]}
        raise TypeError(f"a {t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else f"a {t.__name__}")

    def payload(self, head: dict) -> bytes:
        buf = io.BytesIO()
        self.np.savez(buf, __head__=self.np.array(json.dumps(head)), **self.arrays)
        return buf.getvalue()


def decode(np, torch, head, files, node):
    t = node["t"]
    if t == "none":
        return None
    if t in ("bool", "int", "float", "str"):
        return node["v"]
    if t == "array":
        return files[node["k"]]
    if t == "npscalar":
        return files[node["k"]][()]
    if t == "tensor":
        return torch.from_numpy(files[node["k"]]).to(getattr(torch, node["dtype"]))
    if t == "dtype":
        return getattr(torch, node["v"])
    if t == "config":
        import importlib

        return importlib.import_module("kvlib.model").ModelConfig(**node["v"])
    if t in ("tuple", "list"):
        items = [decode(np, torch, head, files, x) for x in node["items"]]
        return tuple(items) if t == "tuple" else items
    raise ValueError(f"unknown node {t!r}")


def _where(err, files):
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        name = frame.filename.replace("\\", "/")
        for f in files:
            if name.endswith("/" + f):
                return f"{f} line {frame.lineno}: {(frame.line or '').strip()}"
    return ""


def _error(err, files, what):
    """An error reply: the exception's type and message (the learner's own words), and where."""
    try:
        message = str(err)
    except BaseException:
        message = "(the exception's message could not be printed)"
    head = {"status": "error", "what": what, "type": type(err).__name__[:100], "message": message[:2000],
            "where": _where(err, files)[:300]}
    ex = getattr(err, "exercise", None)
    if type(err).__name__ == "ExerciseNotDone" and ex is not None:
        head["not_done"] = str(getattr(ex, "id", ""))
        needed = getattr(err, "needed_by", None)
        head["needed_by"] = str(getattr(needed, "id", "")) if needed is not None else ""
    return head


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rfd, wfd = 0, cfg["reply_fd"]
    # stdout and stderr go nowhere: a learner's prints must not block or flood anything
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = "1"
    sys.path.extend(cfg["site"])
    try:
        import numpy as np  # the real one, from site-packages, before any learner code

        torch = None
        if cfg.get("torch"):
            import torch

            torch.set_num_threads(1)
    except BaseException as err:
        _send(wfd, json.dumps({"status": "boot_error", "message": f"{type(err).__name__}: {err}"}).encode())
        return
    _send(wfd, json.dumps({"status": "booted"}).encode())  # from here on, failures are the submission's
    os.chdir(cfg["work"])
    sys.path.insert(0, cfg["work"])
    files = [f"kvlib/{m}.py" for m in cfg["modules"]]
    modules = {}
    reply = Encoder(np, torch)
    try:
        import importlib

        for m in cfg["modules"]:
            modules[m] = importlib.import_module(f"kvlib.{m}")
        ready = {"status": "ready"}
    except BaseException as err:  # SyntaxError, an exit at import, a stub module that raises
        ready = _error(err, files, "import")
    _send(wfd, reply.payload(ready))
    if ready["status"] != "ready":
        return
    allowed = set(cfg["functions"])
    while True:
        data = _recv(rfd)
        if data is None:
            return
        enc = Encoder(np, torch)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                files_in = {k: z[k] for k in z.files}
            req = json.loads(str(files_in.pop("__head__")))
            if req["fn"] not in allowed:
                raise ValueError(f"{req['fn']} is not an exercise function")
            module, name = req["fn"].split(".", 1)
            fn = getattr(modules[module], name)
            args = [decode(np, torch, req, files_in, a) for a in req["args"]]
            kwargs = {k: decode(np, torch, req, files_in, v) for k, v in req["kwargs"].items()}
        except BaseException as err:
            _send(wfd, enc.payload({"status": "error", "what": "request", "type": type(err).__name__, "message": str(err)[:500], "where": ""}))
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as err:  # SystemExit and KeyboardInterrupt too: the call failed
            head = _error(err, files, "call")
        else:
            try:
                head = {"status": "ok", "result": enc.encode(result)}
            except TypeError as err:
                enc = Encoder(np, torch)
                head = {"status": "error", "what": "result", "type": "TypeError", "message": str(err)[:300], "where": ""}
            except BaseException as err:
                enc = Encoder(np, torch)
                head = _error(err, files, "result")
        try:
            payload = enc.payload(head)
        except BaseException as err:
            payload = Encoder(np, torch).payload(_error(err, files, "result"))
        _send(wfd, payload)


if __name__ == "__main__":
    main()
