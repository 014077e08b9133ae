"""The engines `kvlib bench cache` compares kvlib with, each run on kvlib's own weights, greedy, batch 1:

  transformers, DynamicCache   generate(use_cache=True): its default cache, grown by concatenation
  transformers, StaticCache    generate(cache_implementation="static"): preallocated, what a user
                               tuning transformers picks (compiled only on a GPU; eager here)
  llama.cpp (F32, Q8_0)        llama-cpp-python on a GGUF file kvlib writes (kvlib.core.gguf_export)

Every way is a function (input_ids (1, T), n) -> (the n new token ids, seconds from the start
until each one existed), so the benchmark can time them alike and check that they agree.
transformers and llama.cpp are optional: `pip install -e ".[peers]"` brings llama.cpp and gguf.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

Way = Callable[[torch.Tensor, int], tuple[list[int], list[float]]]


def transformers_way(hf_model, cache_implementation: str | None = None) -> Way:
    """transformers' generate, greedy, timed by a streamer; cache_implementation "static" or None (DynamicCache)."""
    from transformers.generation.streamers import BaseStreamer  # noqa: PLC0415 (optional dependency: transformers, in the dev extra)

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


class LlamaCpp:
    """llama.cpp on a GGUF file through llama-cpp-python: token ids in, greedy token ids out.

    threads: llama.cpp's thread count for both the prompt and each step (kvlib's torch threads).
    The KV cache is float32, as kvlib's is (whatever the weights' type).
    Greedy as kvlib does it: the argmax of each step's logits (ties to the lowest id); the
    prompt is fed as ids, so no tokenizer is involved.
    """

    def __init__(self, path, n_ctx: int, threads: int = 1):
        from llama_cpp import Llama  # noqa: PLC0415 (optional dependency: llama_cpp, in the peers extra)

        # type_k, type_v 0 (GGML_TYPE_F32): keys and values cached in float32 as kvlib caches them; llama.cpp's
        # default, float16, would round them and could flip a near-tied greedy pick
        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=min(n_ctx, 512),
            n_threads=threads,
            n_threads_batch=threads,
            type_k=0,
            type_v=0,
            logits_all=False,
            verbose=False,
        )
        self.path, self.vocab = path, self.llm.n_vocab()

    def _last_logits(self) -> np.ndarray:
        """A view of llama.cpp's logits for the last token evaluated, (vocab,) float32, without a copy."""
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))

    def logits(self, ids: list[int]) -> np.ndarray:
        """(vocab,) logits for the token after ids, computed from position 0 (no reuse of earlier calls)."""
        self.llm.reset()
        self.llm.eval(ids)
        return self._last_logits().copy()

    def __call__(self, ids: torch.Tensor, n: int):
        if ids.shape[0] != 1:
            raise ValueError(f"llama.cpp runs one sequence here, got a batch of {ids.shape[0]}")
        llm, tokens, stamps = self.llm, [], []
        start = time.perf_counter()
        llm.reset()  # forget the previous run: its cache entries are overwritten from position 0
        llm.eval(ids[0].tolist())  # prefill
        for i in range(n):
            token = int(np.argmax(self._last_logits()))
            tokens.append(token)
            stamps.append(time.perf_counter())
            if i + 1 < n:
                llm.eval([token])  # one decode step against llama.cpp's KV cache
        return tokens, [t - start for t in stamps]

    def close(self):
        self.llm.close()
