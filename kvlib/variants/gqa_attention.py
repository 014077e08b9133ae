"""Notebook 06's ways of attention for grouped heads, and the bytes a decode step moves with each.

materialised (repeat_kv, Exercise 6.1, then MHA attention), grouped (the learner's Exercise 6.2,
looked up when it runs) and torch's SDPA with enable_gqa: ATTENTION, what notebook 06 compares; and
split_k_attention (flash-decoding's split-K), which `kvlib bench gqa` times beside them. decode_bytes
counts what each way reads and writes in a decode step: it lives with the ways because the copying
way's extra traffic is a property of that way, not of the model (`kvlib bench gqa` divides it by bandwidth).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kvlib.core.cache import causal_attend
from kvlib.core.model import Decoder, causal_mask_tensor

# ---------------------------------------------------------------------------------------------
# Attention two ways: copy the shared heads out to every query head, or read them in place


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v with one key/value head per query head (MHA), bottom-right causal.

    q (batch, n_heads, seq_len, head_dim), k and v (batch, n_heads, kv_len, head_dim) -> like q.
    The T queries are the last T of the S positions (a decode step: T = 1 against the whole cache).
    """
    assert q.shape[1] == k.shape[1], (
        f"causal_attention needs as many key heads as query heads: q {tuple(q.shape)}, k {tuple(k.shape)}"
    )
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    scores = (k @ q.transpose(-2, -1)).transpose(-2, -1)  # = q @ k^T, (B, H, T, S); see grouped_attention
    scores = scores / math.sqrt(D)
    if T > 1:  # one query (a decode step) may attend to every key: no mask to build or apply
        scores = scores.masked_fill(
            ~causal_mask_tensor(T, S, device=q.device), float("-inf")
        )  # (T, S), True = may attend
    return scores.softmax(dim=-1) @ v  # (B, H, T, S) @ (B, H, S, D)


def materialised_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """GQA the copying way: repeat_kv (Exercise 6.1) the cached heads out to n_heads, then MHA attention.

    Right answer, but every decode step writes and reads n_heads heads of keys and values again:
    the cache is small, the traffic is MHA's and more.
    """
    from kvlib.gqa import repeat_kv  # noqa: PLC0415 (late binding: runs the learner's code)

    group_size = q.shape[1] // k.shape[1]
    # .contiguous(): for batch 1 and one KV head reshape can hand back a view; copying code copies always
    k, v = repeat_kv(k, group_size).contiguous(), repeat_kv(v, group_size).contiguous()  # (B, H, S, D) each
    return causal_attention(q, k, v)  # (B, H, T, D)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The library's way, for comparison: scaled_dot_product_attention with enable_gqa (torch >= 2.5)."""
    return causal_attend(q, k, v)  # a decode step (one query) runs unmasked, so a GPU may pick its fused kernels


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The learner's grouped_attention (Exercise 6.2), looked up when it runs."""
    from kvlib.gqa import grouped_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    return grouped_attention(q, k, v)


ATTENTION: dict[str, Callable] = {  # the three ways notebook 06 and `kvlib bench gqa` time
    "materialised": materialised_attention,
    "grouped": grouped_attention,
    "sdpa": sdpa_attention,
}


def split_k_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Grouped attention for one decode step, the cache read in chunks merged by the online softmax.

    What flash-decoding (split-K) does (notebook 09 builds it): each chunk of `chunk` cached tokens
    (1,024 x 64 numbers of keys and as many of values per KV head: about 1 MB for GQA-2, one core's L2
    here) is attended on its own, and the chunks' results merged exactly. Same result as
    grouped_attention up to rounding. On a GPU the point is
    parallelism, chunks on different processors when batch x heads is too small to fill the chip;
    on one CPU core it can only gain from locality. `kvlib bench gqa` times it beside the others.
    q (batch, n_heads, 1, head_dim): one query per head; k, v (batch, n_kv_heads, kv_len, head_dim).
    """
    (B, H, T, D), (H_kv, S) = q.shape, k.shape[1:3]
    if T != 1:
        raise ValueError(f"split_k_attention is for a decode step, one query per head: got q of shape {tuple(q.shape)}")
    if H % H_kv or chunk < 1:
        raise ValueError(f"n_heads {H} must be a multiple of n_kv_heads {H_kv}, and chunk ({chunk}) at least 1")
    q = q.reshape(B, H_kv, H // H_kv, D) / math.sqrt(D)
    m = l = o = None
    for a in range(0, S, chunk):
        s = (k[:, :, a : a + chunk] @ q.transpose(-2, -1)).transpose(-2, -1)
        m_c = s.amax(dim=-1, keepdim=True)  # (B, H_kv, G, 1)
        p = (s - m_c).exp_()
        l_c, o_c = p.sum(dim=-1, keepdim=True), p @ v[:, :, a : a + chunk]  # (B, H_kv, G, 1), (B, H_kv, G, D)
        if m is None:
            m, l, o = m_c, l_c, o_c
        else:  # rescale both to the larger max, then add
            new = torch.maximum(m, m_c)
            old_scale, chunk_scale = (m - new).exp_(), (m_c - new).exp_()
            m, l, o = new, l * old_scale + l_c * chunk_scale, o * old_scale + o_c * chunk_scale
    return (o / l).view(B, H, 1, D)


BENCH_ATTENTION = {**ATTENTION, "split-k": split_k_attention}  # `kvlib bench gqa` also times split-K, for GQA


# ---------------------------------------------------------------------------------------------
# The bytes a decode step moves


def decode_bytes(model: Decoder, kv_len: int, batch: int = 1, method: str = "grouped") -> int:
    """Bytes a decode step of model moves with attention `method` (a key of ATTENTION), batch sequences attending to
    kv_len cached tokens each: `kvlib bench gqa`'s count, which it divides by the bandwidth. Exercise 6.5 counts its
    own from a config: its checks refuse this one."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]  # the embedding: one row, left out
    per_token = 0  # numbers each cached token brings into the step: what k_proj and v_proj wrote for it
    for layer in model.layers:
        q_out, k_out, v_out = (
            layer.attn.q_proj.out_features,
            layer.attn.k_proj.out_features,
            layer.attn.v_proj.out_features,
        )
        per_token += k_out + v_out
        if method == "materialised" and k_out != q_out:  # copies out to every query head: written, then read back
            per_token += 2 * 2 * q_out
    return model.embed.weight.element_size() * (sum(m.weight.numel() for m in linears) + batch * kv_len * per_token)
