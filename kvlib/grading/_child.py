"""The isolated child: the only process that runs a submission's kvlib code while grading.

Started as `python -I -S _child.py CONFIG_JSON` (no site, no .pth, no PYTHON* variables), in a
jail (kvlib.grading.jail). It puts the site-packages on sys.path, imports the real numpy (and
torch) before any learner code, then the learner's modules, then serves calls: each request is
a length-prefixed .npz (function name, arguments), each reply a .npz of plain numbers or an error.
Everything it replies is untrusted: the grader reads it with allow_pickle=False and checks it.
Stdlib and numpy only (this file is copied into the jail; kvlib is the learner's there).
"""

import contextlib
import functools
import importlib
import io
import json
import os
import struct
import sys
import traceback
import types

MAX_DEPTH = 4
MAX_ITEMS = 4096
_DECODERS = ("Decoder", "SlowDecoder")  # kvlib.core.model's, sent as config and weights (and the sleep per token)
_REQUEST_FIELDS = ("id", "prompt", "max_new_tokens", "out")  # a kvlib.core.paging.Request travels as these (07-serving)
_NUMBER_KINDS = "biufc"


def _send(fd, payload: bytes) -> None:
    data = struct.pack(">Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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


def _config_fields(config) -> dict:
    fields = dict(vars(config))
    if not all(type(v) in (int, float) for v in fields.values()):
        raise TypeError("a ModelConfig with a field that is not a number")
    return fields


class Encoder:
    """Plain numbers to (schema, arrays): ndarray, numpy scalar, bool/int/float/None/str, torch
    tensor and Generator (its state), a kvlib Decoder or Attention (config and weights), a
    kvlib.core.paging.Request (its id, prompt, max_new_tokens and tokens out so far), and
    tuples/lists (a deque as a list) and str-keyed dicts of those. In requests also a torch.dtype, a kvlib ModelConfig (its sizes), a
    named function of the child's modules, a handle to an object the child keeps, and a function
    to call back (the child records the calls). In replies also a handle, for the object a learner's
    class constructor made (it stays in the child). Anything else (an object that compares equal
    to anything, an ndarray subclass's custom behaviour, a pickle) is refused, with its type."""

    def __init__(self, np, torch=None, handles=None, owners=()):
        self.np, self.torch, self.arrays = np, torch, {}
        self.handles, self.owners = handles, set(owners)  # the child's: objects of these modules go back as handles
        self.callbacks = []  # the parent's: functions a request passes, called back with what the child recorded

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
        if t.__name__ == "ModelConfig" and t.__module__ == "kvlib.core.model":  # sizes only: rebuilt in the child
            return {"t": "config", "v": _config_fields(obj)}
        if (
            t.__name__ in _DECODERS and t.__module__ == "kvlib.core.model"
        ):  # sizes and weights: rebuilt on the other side
            state = obj.state_dict()
            if len(state) > MAX_ITEMS:
                raise TypeError(f"a Decoder of more than {MAX_ITEMS} weights")
            node = {
                "t": "decoder",
                "config": _config_fields(obj.config),
                "names": list(state),
                "tensors": [self.encode(v, depth + 1) for v in state.values()],
                "training": bool(obj.training),
            }
            if t.__name__ == "SlowDecoder":
                node["per_token"] = float(obj.per_token)
            return node
        if torch is not None and t is torch.Generator:  # its state: the same draws follow on the other side
            return {"t": "generator", "k": self._array(obj.get_state().numpy())}
        if t.__name__ == "Attention" and t.__module__ == "kvlib.core.model":  # one layer's attention: sizes and weights
            state = obj.state_dict()
            sizes = {
                "d_model": int(obj.q_proj.in_features),
                "n_heads": int(obj.n_heads),
                "n_kv_heads": int(obj.n_kv_heads),
            }
            return {
                "t": "attention",
                "sizes": sizes,
                "names": list(state),
                "tensors": [self.encode(v, depth + 1) for v in state.values()],
            }
        if t.__name__ == "Request" and t.__module__ == "kvlib.core.paging":  # 07's request: its numbers, not its table
            return {"t": "request", "items": [self.encode(getattr(obj, f), depth + 1) for f in _REQUEST_FIELDS]}
        if t is _Method:
            return {"t": "method"}
        if getattr(t, "_kvlib_remote_ref", False):  # a function of the child's own modules, named (requests only)
            return {"t": "fn", "v": f"{obj.module}.{obj.name}"}
        if getattr(t, "_kvlib_handle", False):  # an object that lives in the child (requests only)
            return {"t": "handle", "id": obj.handle_id}
        if self.handles is None and isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
            self.callbacks.append(obj)  # the child records the calls; the parent replays them (requests only)
            return {"t": "callback", "i": len(self.callbacks) - 1}
        if self.handles is not None and t.__module__ in self.owners:  # the learner's own object: it stays here
            key = len(self.handles)
            self.handles[key] = obj
            return {"t": "handle", "id": key, "type": t.__name__[:100]}
        if t is tuple or t is list or (t.__name__ == "deque" and t.__module__ == "collections"):  # a deque: a list
            if len(obj) > MAX_ITEMS:
                raise TypeError(f"a {t.__name__} of more than {MAX_ITEMS} items")
            return {"t": "tuple" if t is tuple else "list", "items": [self.encode(x, depth + 1) for x in obj]}
        if t is dict:  # e.g. a Scheduler's stats
            if len(obj) > MAX_ITEMS or not all(type(k) is str for k in obj):
                raise TypeError(f"a dict whose keys are not strings, or of more than {MAX_ITEMS} items")
            return {"t": "dict", "keys": list(obj), "items": [self.encode(x, depth + 1) for x in obj.values()]}
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
        return importlib.import_module("kvlib.core.model").ModelConfig(**node["v"])
    if t == "decoder":  # the child's kvlib.core.model (the instructor's file), loaded with the weights sent
        model = importlib.import_module("kvlib.core.model")
        config = model.ModelConfig(**node["config"])
        decoder = (
            model.SlowDecoder(config, float(node["per_token"])) if "per_token" in node else model.Decoder(config)
        ).eval()
        state = dict(zip(node["names"], (decode(np, torch, head, files, x) for x in node["tensors"])))
        dtype = next((v.dtype for v in state.values() if v.is_floating_point()), None)
        if dtype is not None:  # the weights' own dtype (Exercise 6.4 keeps it), not Decoder's float32
            decoder.to(dtype)
        decoder.load_state_dict(state)
        return decoder.train(node.get("training") is True)
    if t == "attention":
        model = importlib.import_module("kvlib.core.model")
        z = node["sizes"]
        config = model.ModelConfig(
            vocab_size=1,
            d_model=z["d_model"],
            n_layers=1,
            n_heads=z["n_heads"],
            n_kv_heads=z["n_kv_heads"],
            hidden_dim=1,
            max_seq_len=1,
        )
        attn = model.Attention(config).eval()
        attn.load_state_dict(dict(zip(node["names"], (decode(np, torch, head, files, x) for x in node["tensors"]))))
        return attn
    if t == "handle":
        return head["_handles"][node["id"]]
    if t == "generator":
        gen = torch.Generator()
        gen.set_state(torch.from_numpy(files[node["k"]]))
        return gen
    if t == "callback":
        i, calls, enc = node["i"], head["_calls"], head["_enc"]

        def record(*args):  # what the parent's function would have been called with, copied now
            if len(calls) >= MAX_ITEMS:
                raise RuntimeError(f"a callback was called more than {MAX_ITEMS} times")
            calls.append([i, [enc.encode(a) for a in args]])

        return record
    if t == "fn":
        module, name = node["v"].split(".", 1)
        fn = getattr(head["_modules"][module], name)
        if not callable(fn):
            raise ValueError(f"kvlib.{module}.{name} is not a function")
        return fn
    if t in ("tuple", "list"):
        items = [decode(np, torch, head, files, x) for x in node["items"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict":
        return dict(zip(node["keys"], (decode(np, torch, head, files, x) for x in node["items"])))
    if t == "request":  # the child's kvlib.core.paging.Request (the instructor's file)
        values = [decode(np, torch, head, files, x) for x in node["items"]]
        return importlib.import_module("kvlib.core.paging").Request(*values)
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
    head = {
        "status": "error",
        "what": what,
        "type": type(err).__name__[:100],
        "message": message[:2000],
        "where": _where(err, files)[:300],
    }
    ex = getattr(err, "exercise", None)
    if type(err).__name__ == "ExerciseNotDone" and ex is not None:
        head["not_done"] = str(getattr(ex, "id", ""))
        needed = getattr(err, "needed_by", None)
        head["needed_by"] = str(getattr(needed, "id", "")) if needed is not None else ""
    return head


class _Method:
    """What an attribute that is a method reads as: the parent calls it with op "method"."""


def _attribute(obj, attr):
    value = getattr(obj, attr)
    return _Method() if callable(value) and type(value).__module__ != "torch" and not hasattr(value, "shape") else value


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
        import numpy as np  # noqa: PLC0415 (isolated child: the real numpy, from the site-packages just put on sys.path, before any learner code)

        torch = None
        if cfg.get("torch"):
            import torch  # noqa: PLC0415 (isolated child: site-packages join sys.path just above)

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
        for m in cfg["modules"]:
            modules[m] = importlib.import_module(f"kvlib.{m}")
        ready = {"status": "ready"}
    except BaseException as err:  # SyntaxError, an exit at import, a stub module that raises
        ready = _error(err, files, "import")
    _send(wfd, reply.payload(ready))
    if ready["status"] != "ready":
        return
    allowed = set(cfg["functions"])
    handles = {}  # objects of the learner's classes (a KVCache), used by later requests through their id
    owners = {f"kvlib.{m}" for m in modules}
    while True:
        data = _recv(rfd)
        if data is None:
            return
        enc = Encoder(np, torch, handles, ())
        calls = []
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                files_in = {k: z[k] for k in z.files}
            req = json.loads(str(files_in.pop("__head__")))
            op = req.get("op", "call")
            if req["fn"] not in allowed:
                raise ValueError(f"{req['fn']} is not an exercise function")
            if op == "call":
                module, name = req["fn"].split(".", 1)
                fn = getattr(modules[module], name)
                if isinstance(fn, type):  # a learner's class (KVCache): the object it makes stays here, as a handle
                    enc.owners = owners
            elif op in ("getattr", "method", "data_ptr", "setattr"):  # on an object the child handed out earlier
                attr = str(req["attr"])
                if attr.startswith("_"):
                    raise ValueError(f"{attr} is private")
                if int(req["h"]) not in handles:
                    raise ValueError("the object was lost: the isolated process restarted after an earlier call failed")
                obj = handles[int(req["h"])]
                fn = {
                    "getattr": lambda: _attribute(obj, attr),
                    "method": getattr(obj, attr) if op == "method" else None,
                    "data_ptr": lambda: int(getattr(obj, attr).data_ptr()),
                    "setattr": lambda value: setattr(obj, attr, value),
                }[op]
            else:
                raise ValueError(f"unknown request {op!r}")
            req.update(_modules=modules, _handles=handles, _calls=calls, _enc=enc)
            args = [decode(np, torch, req, files_in, a) for a in req["args"]]
            kwargs = {k: decode(np, torch, req, files_in, v) for k, v in req["kwargs"].items()}
        except BaseException as err:
            _send(
                wfd,
                enc.payload(
                    {
                        "status": "error",
                        "what": "request",
                        "type": type(err).__name__,
                        "message": str(err)[:500],
                        "where": "",
                    }
                ),
            )
            continue
        try:
            if req.get(
                "watch"
            ):  # the allocations the call makes (or, watch "flops", its matmul FLOPs), instead of its result
                measure = importlib.import_module("kvlib.measure.timing")
                result = (measure.matmul_flops if req["watch"] == "flops" else measure.new_tensors)(fn, *args, **kwargs)
            else:
                stand_in = next((a for a in (*args, *kwargs.values()) if type(a).__name__ == "SlowDecoder"), None)
                with stand_in.fake_clock(*modules.values()) if stand_in is not None else contextlib.nullcontext():
                    result = fn(*args, **kwargs)  # a SlowDecoder's calls read its fake clock (Exercise 2.3)
        except BaseException as err:  # SystemExit and KeyboardInterrupt too: the call failed
            head = _error(err, files, "call")
        else:
            try:
                # the arguments as the call left them (a function may change a tensor or a model in place)
                changeable = (getattr(torch, "Tensor", None), getattr(torch, "Generator", None))

                def after(a):
                    return enc.encode(a) if type(a) in changeable or type(a).__name__ in _DECODERS else None

                head = {
                    "status": "ok",
                    "result": enc.encode(result),
                    "after": [after(a) for a in args],
                    "after_kw": {k: after(v) for k, v in kwargs.items()},
                    "callbacks": calls,
                }
            except TypeError as err:
                enc = Encoder(np, torch)
                head = {
                    "status": "error",
                    "what": "result",
                    "type": "TypeError",
                    "message": str(err)[:300],
                    "where": "",
                }
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
