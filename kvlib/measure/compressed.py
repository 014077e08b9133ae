"""The smaller caches of notebook 08 as the model runs them, around the learner's exercises (kvlib.compress).

Int8KVCache stores keys per channel per group of tokens and values per token in int8 (KIVI's axes,
arXiv 2402.02750) with quantize (8.1) and attends with int8_attention (8.2); sink_attention runs a layer
through the learner's SinkCache (8.3) at the places cache_positions (8.4) gives. Either plugs into the
model's one forward pass: model(ids, past_key_values=Int8KVCache(...)), or
model(ids, past_key_values=SinkCache(...), attention=sink_attention). The learner's functions are looked
up when they run, so nothing here imports a learner module at import time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlib.core.model import ModelConfig, apply_rotary, causal_mask_tensor

GROUP = 32  # tokens that share a key scale per channel: KIVI's group size (arXiv 2402.02750, section 4)

# ---------------------------------------------------------------------------------------------
# The int8 cache: keys per channel in groups of GROUP tokens, values per token (KIVI's axes, 8 bits)


class Int8KVCache:
    """Keys and values of every layer stored as int8 with float32 scales.

    k: int8 (n_layers, batch, n_kv_heads, n_groups, group, head_dim), k_scale (..., n_groups, 1, head_dim):
    one scale per channel per group of `group` tokens. v: int8 (n_layers, batch, n_kv_heads, max_seq_len,
    head_dim), v_scale (..., max_seq_len, 1): one per token. The group still filling keeps its float keys
    too (k_open), so each new key requantises it from exact values (KIVI keeps such a float residual).
    """

    def __init__(
        self, config: ModelConfig, batch: int = 1, max_seq_len: int | None = None, group: int = GROUP, device="cpu"
    ):
        max_seq_len = config.max_seq_len if max_seq_len is None else max_seq_len
        if not 1 <= max_seq_len <= config.max_seq_len or group < 1:
            raise ValueError(
                f"max_seq_len must be in [1, {config.max_seq_len}] and group >= 1, got {max_seq_len}, {group}"
            )
        L, H_kv, D, n_groups = config.n_layers, config.n_kv_heads, config.head_dim, -(-max_seq_len // group)
        self.k = torch.zeros(L, batch, H_kv, n_groups, group, D, dtype=torch.int8, device=device)
        self.k_scale = torch.ones(L, batch, H_kv, n_groups, 1, D, device=device)
        self.k_open = torch.zeros(L, batch, H_kv, group, D, device=device)  # float keys of the group still filling
        self.v = torch.zeros(L, batch, H_kv, max_seq_len, D, dtype=torch.int8, device=device)
        self.v_scale = torch.ones(L, batch, H_kv, max_seq_len, 1, device=device)
        self.n_layers, self.max_seq_len, self.group, self.pos = L, max_seq_len, group, 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.k_scale, self.k_open, self.v, self.v_scale))

    def reset(self) -> None:
        self.pos = 0

    def advance(self, seq_len: int) -> None:
        if self.pos + seq_len > self.max_seq_len:
            raise ValueError(f"advancing by {seq_len} from {self.pos} runs past max_seq_len={self.max_seq_len}")
        self.pos += seq_len

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Quantise and store one layer's new keys and values (batch, n_kv_heads, seq_len, head_dim) at pos."""
        from kvlib.compress import quantize  # noqa: PLC0415 (late binding: runs the learner's code)

        start, T, G = self.pos, k_new.shape[2], self.group
        if start + T > self.max_seq_len:
            raise ValueError(f"{T} more tokens do not fit: the cache holds {self.max_seq_len} and has {start}")
        self.v[layer, :, :, start : start + T], self.v_scale[layer, :, :, start : start + T] = quantize(
            v_new, dim=-1
        )  # per token
        for g in range(start // G, (start + T - 1) // G + 1):  # every group the new keys touch
            lo, hi = max(g * G, start), min((g + 1) * G, start + T)  # absolute positions written in group g
            self.k_open[layer, :, :, lo - g * G : hi - g * G] = k_new[:, :, lo - start : hi - start].float()
            values, scale = quantize(
                self.k_open[layer, :, :, : hi - g * G], dim=-2
            )  # per channel, over the group's tokens
            self.k[layer, :, :, g, : hi - g * G], self.k_scale[layer, :, :, g] = values, scale

    def layer_view(self, layer: int, kv_len: int) -> tuple[torch.Tensor, ...]:
        """(k_values, k_scale, v_values, v_scale) of one layer covering kv_len tokens: 8.2's arguments."""
        n_groups = -(-kv_len // self.group)
        return (
            self.k[layer, :, :, :n_groups],
            self.k_scale[layer, :, :, :n_groups],
            self.v[layer, :, :, :kv_len],
            self.v_scale[layer, :, :, :kv_len],
        )

    @staticmethod
    def attention(attn, x, cache, layer, rope_cos, rope_sin):
        return int8_cached_attention(attn, x, cache, layer, rope_cos, rope_sin)


def int8_cached_attention(attn, x: torch.Tensor, cache: Int8KVCache, layer: int, rope_cos, rope_sin) -> torch.Tensor:
    """One layer's attention through an Int8KVCache: quantise the new keys and values, attend with 8.2."""
    from kvlib.compress import int8_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]  # absolute positions
    q = attn.project_q(x, cos, sin)  # (B, H, T, D)
    cache.update(layer, *attn.project_kv(x, cos, sin))
    out = int8_attention(q, *cache.layer_view(layer, cache.pos + T), cache.pos + T)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


# ---------------------------------------------------------------------------------------------
# The rolling cache's attention (SinkCache is the learner's: kvlib.compress)


def sink_attention(attn, x: torch.Tensor, cache, layer: int, rope_cos, rope_sin) -> torch.Tensor:
    """One layer's attention through a SinkCache: keys stored unrotated, rotated at their cache positions (8.4)."""
    from kvlib.compress import cache_positions  # noqa: PLC0415 (late binding: runs the learner's code)

    B, T, _ = x.shape
    still = torch.ones(T, attn.head_dim, device=x.device), torch.zeros(T, attn.head_dim, device=x.device)  # rotate by 0
    q = attn.project_q(x, *still)  # (B, H, T, D), rotated below
    k, v = cache.update(layer, *attn.project_kv(x, *still))  # (B, H_kv, S, D) in slot order (8.3)
    positions = cache_positions(cache.pos + T, cache.n_sink, cache.window).to(x.device)  # (S,)
    k = apply_rotary(k, rope_cos[positions], rope_sin[positions])
    newest = positions.max() - T + 1 + torch.arange(T, device=x.device)  # the new tokens' own places
    q = apply_rotary(q, rope_cos[newest], rope_sin[newest])
    mask = None if T == 1 else causal_mask_tensor(T, k.shape[2], device=x.device)  # T > 1 only before any eviction
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
