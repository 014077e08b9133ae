"""The int8 cache of notebook 08 as the model runs it, around the learner's exercises (kvlib.compress).

Int8KVCache stores keys per channel per group of tokens and values per token in int8 (KIVI's axes,
arXiv 2402.02750) with quantize (8.1) and attends with int8_attention (8.2); it keeps the cache
contract (kvlib.core.cache), so model(ids, past_key_values=Int8KVCache(...)) runs through it. The
rolling cache (SinkCache, 8.3 and 8.4) is the learner's own, in kvlib/compress.py. The learner's
functions are looked up when they run, so nothing here imports a learner module at import time.
"""

from __future__ import annotations

import torch

from kvlib.core.cache import CacheBase, attention_through_cache
from kvlib.core.model import ModelConfig

GROUP = 32  # tokens that share a key scale per channel: KIVI's group size (arXiv 2402.02750, section 4)

# ---------------------------------------------------------------------------------------------
# The int8 cache: keys per channel in groups of GROUP tokens, values per token (KIVI's axes, 8 bits)


class Int8KVCache(CacheBase):
    """Keys and values of every layer stored as int8 with float32 scales.

    k: int8 (n_layers, batch, n_kv_heads, n_groups, group, head_dim), k_scale (..., n_groups, 1, head_dim):
    one scale per channel per group of `group` tokens. v: int8 (n_layers, batch, n_kv_heads, max_seq_len,
    head_dim), v_scale (..., max_seq_len, 1): one per token. The group still filling keeps its float keys
    too (k_open), so each new key requantises it from exact values (KIVI keeps such a float residual).
    truncate rewinds to the start of any group, or inside the group still filling (requantised without
    the dropped tokens); inside a closed group it cannot: that group's float keys are gone.
    """

    tensors = ("k", "k_scale", "k_open", "v", "v_scale")

    def __init__(
        self, config: ModelConfig, batch: int = 1, max_seq_len: int | None = None, group: int = GROUP, device="cpu"
    ):
        super().__init__(config, batch, max_seq_len)  # checks batch and max_seq_len; pos = 0
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be a positive int (tokens that share a key scale), got {group!r}")
        L, H_kv, D, S = config.n_layers, config.n_kv_heads, config.head_dim, self.max_seq_len
        n_groups = -(-S // group)
        self.k = torch.zeros(L, batch, H_kv, n_groups, group, D, dtype=torch.int8, device=device)
        self.k_scale = torch.ones(L, batch, H_kv, n_groups, 1, D, device=device)
        self.k_open = torch.zeros(L, batch, H_kv, group, D, device=device)  # float keys of the group still filling
        self.v = torch.zeros(L, batch, H_kv, S, D, dtype=torch.int8, device=device)
        self.v_scale = torch.ones(L, batch, H_kv, S, 1, device=device)
        self.group = group

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Quantise and store one layer's new keys and values (batch, n_kv_heads, seq_len, head_dim) at pos.

        Returns what int8_attention (8.2) reads: layer_view(layer, pos + seq_len).
        """
        from kvlib.compress import quantize  # noqa: PLC0415 (late binding: runs the learner's code)

        start, T, G = self.pos, k_new.shape[2], self.group
        if start + T > self.max_seq_len:
            raise ValueError(f"{T} more tokens do not fit: the cache holds {self.max_seq_len} and has {start}")
        values, scale = quantize(v_new, dim=-1)  # per token
        self.v[layer, :, :, start : start + T], self.v_scale[layer, :, :, start : start + T] = values, scale
        for g in range(start // G, (start + T - 1) // G + 1):  # every group the new keys touch
            lo, hi = max(g * G, start), min((g + 1) * G, start + T)  # absolute positions written in group g
            self.k_open[layer, :, :, lo - g * G : hi - g * G] = k_new[:, :, lo - start : hi - start].float()
            self._quantize_keys(layer, g, hi)
        return self.layer_view(layer, start + T)

    def _quantize_keys(self, layer: int, g: int, end: int) -> None:
        """Quantise group g of one layer from the float keys (k_open) of its positions before end, per channel."""
        from kvlib.compress import quantize  # noqa: PLC0415 (late binding: runs the learner's code)

        n = end - g * self.group
        self.k[layer, :, :, g, :n], self.k_scale[layer, :, :, g] = quantize(self.k_open[layer, :, :, :n], dim=-2)

    def truncate(self, pos: int) -> None:
        """Drop every token at positions >= pos (kvlib.core.cache); ValueError inside a group already closed."""
        self.check_truncate(pos)
        G = self.group
        filling = max(self.pos - 1, 0) // G * G  # first position of the group still filling: k_open holds it
        if pos % G and pos < filling:
            raise ValueError(
                f"an Int8KVCache at {self.pos} cannot rewind to {pos}: group {pos // G} (positions {pos // G * G} ... "
                f"{pos // G * G + G - 1}) was quantised with later tokens and its float keys are gone; rewind to a "
                f"multiple of {G} or to {filling} ... {self.pos}"
            )
        if pos % G:  # the open group again, without the dropped tokens: as plain decoding left it
            for layer in range(self.n_layers):
                self._quantize_keys(layer, pos // G, pos)
        self.pos = pos

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
    def attention(attn, x: torch.Tensor, cache: Int8KVCache, layer: int, rope_cos, rope_sin) -> torch.Tensor:
        """One layer's attention through the int8 cache: quantise the new keys and values, attend with 8.2."""
        from kvlib.compress import int8_attention  # noqa: PLC0415 (late binding: runs the learner's code)

        kv_len = cache.pos + x.shape[1]
        attend = lambda q, *stored: int8_attention(q, *stored, kv_len)  # stored: layer_view(layer, kv_len)
        return attention_through_cache(attn, x, cache, layer, rope_cos, rope_sin, attend)
