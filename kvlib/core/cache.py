"""The cache contract: what model(ids, past_key_values=cache) needs of a cache, written once.

Decoder.forward (kvlib.core.model) reads cache.pos (the position of ids[:, 0]), runs each layer's
attention through the cache (the cache's own `attention`, or one passed as attention=...), in which
the layer writes its new keys and values with cache.update(layer, k_new, v_new); after the last
layer it calls cache.advance(seq_len) once. Around a forward pass a caller may reset() the cache
(a new prompt), truncate(pos) it (drop every token at positions >= pos: speculative decoding rewinds
the drafts the model rejected) and read nbytes (what it occupies).

  Cache            the contract as a typing.Protocol: isinstance(obj, Cache) checks an object has it all
  CacheBase        pos, reset, advance (bounded by max_seq_len), truncate (a ring refuses to rewind past
                   what it overwrote), nbytes and a default attention, for a cache that only writes its
                   storage and update: notebook 04's KVCache, notebook 08's caches
  attention_through_cache  one layer's attention through any cache (the infrastructure's caches all use
                   it; closed while notebook 04's cached_attention is checked)

The caches that keep the contract: KVCache (kvlib/kv_cache.py, notebook 04), Int8KVCache
(kvlib/variants/compressed.py) and SinkCache (kvlib/compress.py, notebook 08), PagedView
(kvlib/core/paging.py, notebook 07: one position per row, the block tables own the tokens). Left
out: a batch whose rows sit at different positions in one contiguous cache, caches across devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from kvlib.core.model import apply_rotary, causal_mask_tensor


@runtime_checkable
class Cache(Protocol):
    """What Decoder.forward(ids, past_key_values=cache) needs of a cache.

    Optional beyond these: attention(attn, x, cache, layer, rope_cos, rope_sin), how the model runs a
    layer's attention through this cache when the caller passes no attention=... (kvlib.core.model's
    CacheAttention); every cache here has one.
    """

    pos: int  # tokens stored so far: the position of the next token written

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write one layer's new keys and values (batch, n_kv_heads, seq_len, head_dim) at positions pos ...
        pos + seq_len - 1; return what that layer's attention reads (KVCache: every key and value so far).
        pos stays: advance moves it."""

    def advance(self, seq_len: int) -> None:
        """Move pos past seq_len new tokens; ValueError past the cache's room."""

    def reset(self) -> None:
        """Forget every stored token: the next one is written at position 0."""

    def truncate(self, pos: int) -> None:
        """Drop every token at positions >= pos, so the next one is written at pos.

        Raises ValueError, naming the numbers, when pos < 0 or pos > self.pos, and when the cache cannot
        rewind there (a rolling cache that has already overwritten a token it would need again).
        """

    @property
    def nbytes(self) -> int:
        """Bytes the cache's storage occupies (allocated, whether filled or not)."""


class CacheBase:
    """Position, reset, advance, truncate and nbytes, for a cache that only writes its storage and update.

    A subclass calls CacheBase.__init__ (it checks batch and max_seq_len and sets n_layers, batch,
    max_seq_len and pos = 0), allocates its tensors, names them in `tensors` (nbytes counts them) and
    writes update(layer, k_new, v_new). Rewinding keeps what is stored and moves pos back: the slots
    at positions >= pos are written again before anything reads them.
    """

    tensors: tuple[str, ...] = ("k", "v")  # the attributes that hold the storage
    # A ring (a rolling cache) has `capacity` token slots and reuses all but the first n_sink of them:
    # once it has seen more than capacity tokens it has overwritten some, and truncate refuses to
    # rewind to a position whose past it no longer holds. None: a slot for every position.
    capacity: int | None = None
    n_sink: int = 0

    def __init__(self, config, batch: int = 1, max_seq_len: int | None = None):
        max_seq_len = config.max_seq_len if max_seq_len is None else max_seq_len
        if (
            isinstance(max_seq_len, bool)
            or not isinstance(max_seq_len, int)
            or not 1 <= max_seq_len <= config.max_seq_len
        ):
            raise ValueError(
                f"max_seq_len must be in [1, {config.max_seq_len}] (the model's rotary table), got {max_seq_len!r}"
            )
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch!r}")
        self.n_layers, self.batch, self.max_seq_len, self.pos = config.n_layers, batch, max_seq_len, 0

    @property
    def nbytes(self) -> int:
        """Bytes the cache occupies (allocated, whether filled or not)."""
        return sum(t.numel() * t.element_size() for t in (getattr(self, name) for name in self.tensors))

    def reset(self) -> None:
        """Forget every stored token: the next prompt starts at position 0."""
        self.pos = 0

    def advance(self, seq_len: int) -> None:
        """Move pos past seq_len new tokens (ValueError past max_seq_len)."""
        if self.pos + seq_len > self.max_seq_len:
            raise ValueError(f"advancing by {seq_len} from {self.pos} runs past max_seq_len={self.max_seq_len}")
        self.pos += seq_len

    def truncate(self, pos: int) -> None:
        """Drop every token at positions >= pos (rejected drafts): the next token is written at pos.

        Example: cache.pos == 7; cache.truncate(5) -> cache.pos == 5, positions 0 ... 4 kept as they were
        """
        self.check_truncate(pos)
        self.pos = pos

    def check_truncate(self, pos: int) -> None:
        """ValueError unless pos is an int in [0, self.pos] whose past the cache still holds."""
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= self.pos:
            raise ValueError(
                f"truncate to {pos!r}: a position in [0, {self.pos}] is needed (this cache holds {self.pos} tokens)"
            )
        if self.capacity is not None and self.pos > self.capacity and self.n_sink < pos < self.pos:
            raise ValueError(
                f"a {type(self).__name__} at {self.pos} cannot rewind to {pos}: its ring of {self.capacity} slots has "
                f"overwritten tokens {self.n_sink} ... {self.pos - self.capacity + self.n_sink - 1}, and tokens from "
                f"{max(self.n_sink, pos - self.capacity + self.n_sink)} on would be needed again"
            )

    def key_positions(self, kv_len: int) -> torch.Tensor | None:
        """None: keys are stored rotated at their own positions. A cache that stores them before rotary returns
        the position to turn each filled slot's key at, once kv_len tokens went in (attention_through_cache)."""
        return None

    @staticmethod
    def attention(attn, x: torch.Tensor, cache: CacheBase, layer: int, rope_cos, rope_sin) -> torch.Tensor:
        """How model(ids, past_key_values=cache) runs a layer: attention_through_cache with causal SDPA."""
        kept = cache.key_positions(cache.pos + x.shape[1])
        return attention_through_cache(attn, x, cache, layer, rope_cos, rope_sin, key_positions=kept)


# ---------------------------------------------------------------------------------------------
# One layer's attention through a cache


def causal_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D), causal) v with SDPA: q (B, H, T, D), the last T of k, v's S positions (B, H_kv, S, D).

    One query per head (a decode step) attends to every key: no mask, a faster kernel. Returns (B, H, T, D).
    """
    T, S = q.shape[2], k.shape[2]
    mask = None if T == 1 else causal_mask_tensor(T, S, device=q.device)  # (T, S), True = may attend; bottom-right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def attention_through_cache(
    attn,
    x: torch.Tensor,
    cache,
    layer: int,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    attend: Callable[..., torch.Tensor] = causal_attend,
    *,
    positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's attention for the new tokens x (batch, seq_len, d_model) through cache; returns the same shape.

    The skeleton: queries and keys rotated at the new tokens' positions, keys and values written with
    cache.update(layer, k, v), out = attend(q, *what update returned) (batch, n_heads, seq_len, head_dim),
    then attn.o_proj. How the keys are stored is a parameter:
      positions: (seq_len,) or per row (batch, seq_len), the new tokens' absolute positions; default
                 cache.pos + i (a paged batch gives each row its own)
      key_positions: None, keys are stored rotated at their own positions; or (kv_len,), keys are stored
                 before rotary and turned at these positions when read, one per slot that update returns
                 (a rolling cache: places in the cache, not in the text); the queries then sit at the newest
                 seq_len of those places unless positions says otherwise
    """
    B, T, C = x.shape
    H, D = attn.n_heads, attn.head_dim
    if positions is None:
        last = cache.pos + T if key_positions is None else int(key_positions.max()) + 1
        positions = torch.arange(last - T, last, device=x.device)  # (T,): new token i at last - T + i
    if positions.dim() == 2:  # a position per row and token: project every token as one row of a batch of 1
        at = positions.to(x.device).reshape(-1)  # (B*T,)
        flat = x.reshape(1, B * T, C)
        q, k, v = attn.project_q(flat, rope_cos[at], rope_sin[at]), *attn.project_kv(flat, rope_cos[at], rope_sin[at])
        q, k, v = (t[0].unflatten(1, (B, T)).transpose(0, 1) for t in (q, k, v))  # (h, B*T, D) -> (B, h, T, D)
    else:  # every row at the same positions
        cos, sin = rope_cos[positions], rope_sin[positions]  # (T, D)
        q = attn.project_q(x, cos, sin)  # (B, H, T, D)
        if key_positions is not None:  # a turn by 0: stored as projected, rotated when read
            cos, sin = torch.ones_like(cos), torch.zeros_like(sin)
        k, v = attn.project_kv(x, cos, sin)  # (B, H_kv, T, D)
    stored = cache.update(layer, k, v)
    if key_positions is not None:
        kept = key_positions.to(x.device)  # (S,)
        stored = (apply_rotary(stored[0], rope_cos[kept], rope_sin[kept]), *stored[1:])
    out = attend(q, *stored)  # (B, H, T, D)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * D))  # (B, H, T, D) -> (B, T, H*D) -> (B, T, C)
