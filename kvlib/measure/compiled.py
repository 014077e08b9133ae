"""kvlib's model decoding through torch.compile on a CPU: what the same weights do with fused, packed kernels.

`kvlib bench cache` times it beside kvlib's own cached decoding (Exercise 4.5, eager) and the peers.
It is not the learner's code: it runs kvlib's model (kvlib.core.model) with a cache of its own whose
shapes never change, because a compiled step must not change shape from one token to the next:

  * the cache is preallocated for max_len tokens, one key and one value tensor per layer, and each
    new token's keys and values are written at its position with index_copy_ (a tensor position,
    not a Python int, so nothing recompiles as the position moves);
  * every step attends over all max_len slots, the ones not yet written masked out, as
    transformers' StaticCache does: a little more reading than a growing cache, shapes fixed.

The step is compiled by inductor with freezing (the weights become constants it may repack into
the blocked layout its own matrix kernels read fastest) and, with autotune, lets it pick between
its generated C++ matrix kernels and MKL's by timing both. The weight repacking is what closes most
of the gap to llama.cpp: it is a layout chosen for the kernel, as llama.cpp's own is.
Compiling takes seconds to tens of seconds, once per model; a C++ compiler must be installed.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from kvlib.core.model import Decoder


class StaticCacheDecoder(nn.Module):
    """A kvlib Decoder with a preallocated cache of max_len tokens: forward(ids, positions) -> last logits.

    ids (1, T) are new tokens at absolute positions `positions` (T,), a long tensor; their keys and
    values are written into the cache there, and they attend to every position up to their own.
    Returns the logits of the last one, (1, vocab_size). Batch 1, float32, as `kvlib bench cache`.
    """

    def __init__(self, model: Decoder, max_len: int):
        super().__init__()
        c = model.config
        if not 1 <= max_len <= c.max_seq_len:
            raise ValueError(f"max_len must be in [1, {c.max_seq_len}] (the model's rotary table), got {max_len}")
        self.model, self.max_len = model, max_len
        shape = (1, c.n_kv_heads, max_len, c.head_dim)
        param = next(model.parameters())
        for i in range(c.n_layers):  # one key and one value buffer per layer, written in place
            self.register_buffer(f"k{i}", torch.zeros(shape, dtype=param.dtype, device=param.device), persistent=False)
            self.register_buffer(f"v{i}", torch.zeros(shape, dtype=param.dtype, device=param.device), persistent=False)
        self.register_buffer("slots", torch.arange(max_len, device=param.device), persistent=False)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        m, T = self.model, ids.shape[1]
        x = m.embed(ids)  # (1, T, C)
        cos, sin = m.rope_cos[positions], m.rope_sin[positions]  # (T, D): the rotary angles at those positions
        mask = self.slots[None, :] <= positions[:, None]  # (T, max_len): a token sees every slot up to its own
        for i, layer in enumerate(m.layers):
            attn, h = layer.attn, layer.attn_norm(x)
            q = attn.project_q(h, cos, sin)  # (1, H, T, D)
            k, v = attn.project_kv(h, cos, sin)  # (1, H_kv, T, D)
            k_all, v_all = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            k_all.index_copy_(2, positions, k)  # written in place at the tokens' positions
            v_all.index_copy_(2, positions, v)
            out = F.scaled_dot_product_attention(
                q, k_all, v_all, attn_mask=mask, enable_gqa=attn.n_kv_heads != attn.n_heads
            )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(1, T, -1))  # (1, H, T, D) -> (1, T, C)
            x = x + layer.mlp(layer.mlp_norm(x))
        return m.lm_head(m.norm(x[:, -1])).float()  # (1, vocab_size)


INDUCTOR = {"freezing": True}  # weights as constants: inductor may fold and repack them
AUTOTUNE = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}  # its C++ matrix kernels against MKL's


def compiled_way(model: Decoder, max_len: int, autotune: bool = True):
    """`kvlib bench cache`'s way (ids (1, T), n) -> (n new token ids, seconds until each existed), greedy.

    The prompt runs eagerly through the same static cache (its shape is used once); every decode
    step runs the compiled step. The first call compiles (seconds to tens of seconds: the benchmark's
    warm-up pays it). Raises RuntimeError naming the cause if torch.compile cannot compile here.
    """
    import torch._inductor.config as inductor_config  # noqa: PLC0415 (start-up time: inductor loads only when a step is compiled)

    static = StaticCacheDecoder(model, max_len).eval()
    settings = INDUCTOR | (AUTOTUNE if autotune else {})
    step = torch.compile(static, fullgraph=True)

    def run(ids: torch.Tensor, n: int):
        T = ids.shape[1]
        if ids.shape[0] != 1 or T + n > max_len:
            raise ValueError(
                f"batch 1 and at most {max_len} tokens in all: got prompt {tuple(ids.shape)} and {n} new tokens"
            )
        stamps, tokens = [], []
        with torch.inference_mode(), inductor_config.patch(settings):
            start = time.perf_counter()
            token = static(ids, torch.arange(T, device=ids.device)).argmax(-1)  # (1,): prefill, eager
            for i in range(n):
                tokens.append(int(token))
                stamps.append(time.perf_counter() - start)
                if i + 1 < n:
                    try:
                        token = step(token[:, None], torch.tensor([T + i], device=ids.device)).argmax(-1)
                    except Exception as err:  # no C++ compiler, an unsupported op...: say so, in one line
                        raise RuntimeError(
                            f"torch.compile could not compile the decode step: {type(err).__name__}: "
                            f"{str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
                        ) from err
        return tokens, stamps

    return run
