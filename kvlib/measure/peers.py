"""The engines `kvlib bench cache` compares kvlib with, each run on kvlib's own weights, greedy, batch 1:

  transformers, DynamicCache   generate(use_cache=True): its default cache, grown by concatenation
  transformers, StaticCache    generate(cache_implementation="static"): preallocated, what a user
                               tuning transformers picks (compiled only on a GPU; eager here)
  llama.cpp (F32, Q8_0)        llama-cpp-python on a GGUF file kvlib writes (kvlib.core.gguf_export), run in a
                               child process (kvlib.measure.llama_child), so that its crash is a row, not the end

Every way is a function (input_ids (1, T), n) -> (the n new token ids, seconds from the start
until each one existed), so the benchmark can time them alike and check that they agree.
transformers and llama.cpp are optional: `pip install -e ".[peers]"` brings llama.cpp and gguf.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

from kvlib.measure import llama_child

Way = Callable[[torch.Tensor, int], tuple[list[int], list[float]]]


def transformers_way(hf_model, cache_implementation: str | None = None) -> Way:
    """transformers' generate, greedy, timed by a streamer; cache_implementation "static" or None (DynamicCache)."""
    from transformers.generation.streamers import BaseStreamer  # noqa: PLC0415 (start-up time: transformers imports for seconds; only its ways need it)

    class Stamps(BaseStreamer):
        def __init__(self):
            self.stamps, self.prompt_seen = [], False

        def put(self, value):
            if self.prompt_seen:  # the first put is the prompt itself
                self.stamps.append(time.perf_counter())
            self.prompt_seen = True

        def end(self):
            pass

    extra = {"cache_implementation": cache_implementation} if cache_implementation else {}

    def run(ids: torch.Tensor, n: int):
        streamer = Stamps()
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                streamer=streamer,
                pad_token_id=0,
                **extra,
            )
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"transformers stopped after {out.shape[1] - ids.shape[1]} of {n} tokens")
        return out[0, ids.shape[1] :].tolist(), [t - start for t in streamer.stamps]

    return run


def kvlib_way(fn, model) -> Way:
    """kvlib's generate (2.2, no cache) or generate_cached (4.5), timed by its on_token callback."""

    def run(ids: torch.Tensor, n: int):
        stamps = []
        start = time.perf_counter()
        out = fn(model, ids, n, on_token=lambda token: stamps.append(time.perf_counter()))
        return out[0, ids.shape[1] :].tolist(), [t - start for t in stamps]

    return run


def llama_cpp_available() -> str | None:
    """None if llama-cpp-python and gguf import, else what is missing and how to install it."""
    missing = []
    for module, package in (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    return f'{" and ".join(missing)} not installed (pip install -e ".[peers]")' if missing else None


class PeerCrashed(RuntimeError):
    """A peer's process ended without answering: a crash (a signal), an exit, or no answer in time."""


def _signal_name(returncode: int) -> str:
    try:
        return f"signal {-returncode}, {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"


class LlamaCpp:
    """llama.cpp on a GGUF file, in a child process of its own: token ids in, greedy token ids out.

    The engine runs in kvlib.measure.llama_child, so that a crash in llama.cpp's C++ ends that child only:
    every call then raises PeerCrashed, which says how it ended and the cause where it is known, and the
    benchmark or test that called goes on. Times are taken inside the child, so the pipe costs no time.
    threads: llama.cpp's thread count for both the prompt and each step (kvlib's torch threads).
    extra_buffers: None (default) lets llama_child.extra_buffers decide from this CPU's features (off where it has
    AMX); True or False forces llama.cpp's extra (AMX, repacked) weight buffers on or off.
    The KV cache is float32, as kvlib's is (whatever the weights' type). Greedy as kvlib does it: the argmax of
    each step's logits (ties to the lowest id); the prompt is fed as ids, so no tokenizer is involved.
    After loading: system_info (llama.cpp's CPU features line), extra_buffers and why, model_buffers (the buffer
    types the weights went to, from llama.cpp's own load log).
    """

    TIMEOUT_S = 600  # one request's answer: far beyond any run here; a child that hangs is killed and reported

    def __init__(self, path, n_ctx: int, threads: int = 1, extra_buffers: bool | None = None):
        self.path = path
        parent, child = socket.socketpair()
        self._stderr = tempfile.TemporaryFile()  # the child's last words, for the message if it crashes
        with child:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kvlib.measure.llama_child", str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
            )
        self._conn = Connection(parent.detach())
        self.system_info = self.extra_buffers = self.why = None
        self.model_buffers: list[str] = []
        hello = self._answer("start")
        self.system_info, self.llama_cpp_python = hello["hello"], hello["llama_cpp_python"]
        loaded = self._ask(
            {"op": "load", "path": str(path), "n_ctx": n_ctx, "threads": threads, "extra_buffers": extra_buffers}
        )
        self.vocab, self.extra_buffers, self.why = loaded["vocab"], loaded["extra_buffers"], loaded["why"]
        self.model_buffers = loaded["model_buffers"]

    def _answer(self, what: str) -> dict:
        try:
            if not self._conn.poll(self.TIMEOUT_S):
                self._proc.kill()
                self._proc.wait()
                raise PeerCrashed(f"llama.cpp: no answer to {what} within {self.TIMEOUT_S} s on this CPU (killed)")
            answer = self._conn.recv()
        except (EOFError, OSError):
            raise PeerCrashed(self._death(what)) from None
        if "error" in answer:
            raise RuntimeError(f"llama.cpp ({Path(self.path).name}): {answer['error']}")
        return answer

    def _ask(self, request: dict) -> dict:
        try:
            self._conn.send(request)
        except OSError:
            raise PeerCrashed(self._death(request["op"])) from None
        return self._answer(request["op"])

    def _death(self, what: str) -> str:
        """How the child ended, in a sentence: the signal or exit status, the cause where known, its last words."""
        code = self._proc.wait()
        how = f"crashed ({_signal_name(code)})" if code < 0 else f"exited with status {code}"
        if os.environ.get("KVLIB_LLAMA_FAULT"):
            cause = "KVLIB_LLAMA_FAULT asked for it"
        elif self.system_info and self.extra_buffers and llama_child.extra_buffers(self.system_info)[0] is False:
            cause = f"extra buffers were forced on a CPU with AMX ({llama_child.AMX_ISSUE})"
        else:
            cause = "cause unknown"
        self._stderr.seek(0)
        lines = [ln.strip() for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        if code < 0:  # faulthandler's stack, innermost frame first: where in Python the C++ was entered
            frame = next((ln for ln in lines if ln.startswith("File ")), None)
            said = f"; innermost Python frame: {frame}" if frame else ""
        else:
            said = f"; its last words: {' / '.join(lines[-3:])}" if lines else ""
        return f"llama.cpp: {how} on this CPU during {what} ({Path(self.path).name}): {cause}{said}"

    def logits(self, ids: list[int]) -> np.ndarray:
        """(vocab,) logits for the token after ids, computed from position 0 (no reuse of earlier calls)."""
        return self._ask({"op": "logits", "ids": list(ids)})["logits"]

    def __call__(self, ids: torch.Tensor, n: int):
        if ids.shape[0] != 1:
            raise ValueError(f"llama.cpp runs one sequence here, got a batch of {ids.shape[0]}")
        answer = self._ask({"op": "generate", "ids": ids[0].tolist(), "n": n})
        return answer["tokens"], answer["stamps"]

    def close(self):
        if self._proc.poll() is None:
            try:
                self._conn.send({"op": "close"})
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._conn.close()
        self._stderr.close()
