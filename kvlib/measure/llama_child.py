"""llama.cpp in a process of its own: the child that kvlib.measure.peers.LlamaCpp talks to.

llama.cpp is C++ that kvlib does not control: on some CPUs it crashes (a segfault in its AMX matrix
multiply on Intel Xeons with AMX, ggml-org/llama.cpp issue 20824). Run in the benchmark's or the test
worker's own process, such a crash would take the whole benchmark, or the worker, down with it; run here,
it ends this child only, and the parent reports the crash as a row. This module imports neither torch nor
kvlib's model, so the child starts in a fraction of a second.

The parent starts `python -m kvlib.measure.llama_child FD` with one end of a socket pair as FD and talks
over it with multiprocessing's Connection (pickled dicts), one request, one answer:
  child -> {"hello": system_info, "llama_cpp_python": version}            at start, before any model is loaded
  {"op": "load", "path", "n_ctx", "threads", "extra_buffers": None|bool}  -> {"vocab", "extra_buffers", "why",
                                                                              "model_buffers": [buffer types]}
  {"op": "generate", "ids": [...], "n"}    -> {"tokens", "stamps"}   stamps: seconds from the start, timed here
  {"op": "logits", "ids": [...]}           -> {"logits": (vocab,) float32 array}
  {"op": "close"}                          -> the child exits
An error in Python comes back as {"error": "..."}; a crash ends the child, which the parent sees.

KVLIB_LLAMA_FAULT: set to a weight type in llama.cpp's model description (F32, Q8_0) or "all", it makes the
child of such a model kill itself with SIGSEGV at its first generation, to show (and test) the crash path.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import sys
import time
from multiprocessing.connection import Connection

# llama.cpp's CPU features, as llama_print_system_info() prints them: "CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | ..."
_AMX = re.compile(r"\bAMX_INT8\s*=\s*1\b")
AMX_ISSUE = "ggml-org/llama.cpp issue 20824: a segfault in ggml_backend_amx_mul_mat"
_PLAIN_BUFFERS = {"CPU", "CPU_Mapped"}  # weights as the file has them: no repacking, no AMX layout


def extra_buffers(system_info: str) -> tuple[bool, str]:
    """Whether llama.cpp may load weights into its extra buffer types (AMX, repacked) on this CPU, and why.

    Extra buffers hold the weights in a layout for a CPU's fastest kernels: repacked for AVX2/AVX-512, or tiled
    for AMX. Where the CPU has AMX, llama.cpp's AMX matrix multiply crashes (AMX_ISSUE): there the weights load
    as the file has them, into plain CPU buffers, and llama.cpp runs its AVX-512 kernels on them. Everywhere else
    llama.cpp keeps its defaults, the best it does on that CPU.
    Example: extra_buffers("CPU : AVX2 = 1 | AMX_INT8 = 1 |")[0] -> False
    """
    if _AMX.search(system_info):
        return (
            False,
            f"this CPU has AMX (AMX_INT8 = 1), whose llama.cpp kernels crash ({AMX_ISSUE}): weights in plain CPU buffers",
        )
    return (
        True,
        "llama.cpp's defaults (no AMX on this CPU): weights in its extra (repacked) buffer types where it has them",
    )


def model_buffers(log: str) -> list[str]:
    """The buffer types llama.cpp put the weights in, read off its load log ("load_tensors: AMX model buffer size")."""
    return sorted(set(re.findall(r"load_tensors:\s+(\S+) model buffer size", log)))


def plain(buffers: list[str]) -> bool:
    """True when every weight sits in a plain CPU buffer (no repacked or AMX layout)."""
    return set(buffers) <= _PLAIN_BUFFERS


class _Engine:
    """One model loaded in llama.cpp, fed token ids, greedy."""

    def __init__(self, lib, llama_cpp, log: list[str], path: str, n_ctx: int, threads: int, extra: bool):
        default = lib.llama_model_default_params

        def params():  # Llama() takes no use_extra_bufts: set it on the parameters it asks for
            p = default()
            p.use_extra_bufts = extra
            return p

        lib.llama_model_default_params = params
        start = len(log)
        try:
            # type_k, type_v 0 (GGML_TYPE_F32): keys and values cached in float32 as kvlib caches them; llama.cpp's
            # default, float16, would round them and could flip a near-tied greedy pick
            self.llm = llama_cpp.Llama(
                model_path=path,
                n_ctx=n_ctx,
                n_batch=min(n_ctx, 512),
                n_threads=threads,
                n_threads_batch=threads,
                type_k=0,
                type_v=0,
                logits_all=False,
                verbose=False,
            )
        finally:
            lib.llama_model_default_params = default
        self.buffers = model_buffers("".join(log[start:]))
        self.vocab = self.llm.n_vocab()
        fault = os.environ.get("KVLIB_LLAMA_FAULT", "")
        self.fault = bool(fault) and (fault == "all" or fault in self.llm._model.desc().split())

    def _last_logits(self):
        import numpy as np  # noqa: PLC0415 (start-up time: the child needs numpy only once a model runs)

        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))

    def generate(self, ids: list[int], n: int) -> dict:
        if self.fault:
            os.kill(os.getpid(), signal.SIGSEGV)
        llm, tokens, stamps = self.llm, [], []
        start = time.perf_counter()
        llm.reset()  # forget the previous run: its cache entries are overwritten from position 0
        llm.eval(ids)  # prefill
        for i in range(n):
            token = int(self._last_logits().argmax())  # greedy as kvlib does it: ties to the lowest id
            tokens.append(token)
            stamps.append(time.perf_counter() - start)
            if i + 1 < n:
                llm.eval([token])  # one decode step against llama.cpp's KV cache
        return {"tokens": tokens, "stamps": stamps}

    def logits(self, ids: list[int]) -> dict:
        self.llm.reset()
        self.llm.eval(ids)
        return {"logits": self._last_logits().copy()}


def serve(conn: Connection) -> None:
    import llama_cpp  # noqa: PLC0415 (optional dependency: llama_cpp, in the peers extra)
    import llama_cpp.llama_cpp as lib  # noqa: PLC0415 (optional dependency: llama_cpp, in the peers extra)

    log: list[str] = []

    @lib.llama_log_callback
    def collect(level, text, user_data):  # llama.cpp's log, kept to read the buffer types off it
        log.append(text.decode("utf-8", "replace"))

    lib.llama_log_set(collect, ctypes.c_void_p(0))
    info = lib.llama_print_system_info().decode("utf-8", "replace").strip()
    conn.send({"hello": info, "llama_cpp_python": llama_cpp.__version__})
    engine = None
    while True:
        request = conn.recv()
        op = request["op"]
        if op == "close":
            break
        try:
            if op == "load":
                extra, why = extra_buffers(info)
                if request.get("extra_buffers") is not None:
                    extra, why = request["extra_buffers"], "set by the caller"
                engine = _Engine(lib, llama_cpp, log, request["path"], request["n_ctx"], request["threads"], extra)
                conn.send({"vocab": engine.vocab, "extra_buffers": extra, "why": why, "model_buffers": engine.buffers})
            elif op == "generate":
                conn.send(engine.generate(request["ids"], request["n"]))
            elif op == "logits":
                conn.send(engine.logits(request["ids"]))
            else:
                conn.send({"error": f"unknown request {op!r}"})
        except Exception as err:  # a Python error is an answer, not a crash: the parent raises it
            conn.send({"error": f"{type(err).__name__}: {err}"})
    if engine is not None:
        engine.llm.close()


if __name__ == "__main__":
    faulthandler.enable()  # a crash prints the Python stack to stderr, which the parent keeps for its message
    serve(Connection(int(sys.argv[1])))
