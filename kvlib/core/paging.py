"""The machinery of notebook 07's serving engine, below the learner's kvlib/serving.py.

A pool of fixed-size K/V blocks (BlockStore: the storage, the free list, allocate and share; the
learner's BlockPool adds release), requests, the cache view a Decoder runs one step through, and
Engine: admit (prefill, with shared prompt blocks), decode, preempt, retire. The learner's
Scheduler is an Engine whose step() (Exercise 7.4) decides what runs; the block table, paged
attention and copy-on-write it uses are handed in, since core imports no learner module.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvlib.core.cache import attention_through_cache


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than asked for."""


class BlockStore:
    """K and V of every layer in n_blocks blocks of block_size tokens: k, v (n_layers, n_blocks, n_kv_heads, block_size, head_dim).

    free: the free list (allocate pops from its end); refs[b]: how many block tables hold block b.
    """

    def __init__(self, config, n_blocks: int, block_size: int = 16, dtype: torch.dtype = torch.float32):
        for name, n in (("n_blocks", n_blocks), ("block_size", block_size)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        if block_size & (block_size - 1):
            raise ValueError(
                f"block_size must be a power of two (slot = block * block_size + offset), got {block_size}"
            )
        self.k = torch.zeros(config.n_layers, n_blocks, config.n_kv_heads, block_size, config.head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.n_blocks, self.block_size = n_blocks, block_size
        self.refs, self.free = [0] * n_blocks, list(range(n_blocks - 1, -1, -1))  # block 0 is handed out first

    @property
    def n_free(self) -> int:
        return len(self.free)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def allocate(self, n: int = 1) -> list[int]:
        """n free blocks, each with one reference; all or none (OutOfBlocks names what is missing)."""
        if n > len(self.free):
            raise OutOfBlocks(f"{n} blocks wanted, {len(self.free)} of {self.n_blocks} free")
        blocks = [self.free.pop() for _ in range(n)]
        for b in blocks:
            self.refs[b] = 1
        return blocks

    def share(self, block: int) -> None:
        """One more table holds block (a shared prefix)."""
        if not 0 <= block < self.n_blocks or self.refs[block] < 1:
            raise ValueError(f"block {block} is not in use: only a block a table holds can be shared")
        self.refs[block] += 1

    def owners(self, tables: dict) -> list[int]:
        """Who holds each block: a request id from tables {id: block table}, -1 free, -2 shared by several."""
        out = [-1] * self.n_blocks
        for rid, table in tables.items():
            for b in table.blocks:
                out[b] = rid if out[b] == -1 else -2
        return out


@dataclass
class Request:
    """A prompt (token ids) to continue by exactly max_new_tokens greedy tokens; out collects them."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    out: list[int] = field(default_factory=list)
    table: object | None = None  # its block table while it runs, None while it waits
    times: dict = field(default_factory=dict)  # "first_token", "done", "tokens" (one per token): the engine's clock

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new_tokens


class PagedView:
    """What Decoder.forward takes as its cache for one step: the rows' block tables, positions and new slots.

    It keeps the cache contract (kvlib.core.cache) with one position per row: update writes each new
    token's key and value into its slot, attention runs paged attention through the tables. The view
    owns no tokens, their block tables do: reset and truncate (forgetting or rewinding a request) are
    the tables' work, so the view refuses them.
    """

    def __init__(self, pool, tables, positions: torch.Tensor, slots: torch.Tensor, attend: Callable):
        self.pool, self.tables, self.positions, self.slots, self.attend = pool, tables, positions, slots, attend
        self.pos = int(positions.max())  # Decoder.check_input checks the furthest row against max_seq_len

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple:
        """Write one layer's new keys and values (batch, n_kv_heads, seq_len, head_dim) into their slots.

        Returns what paged attention reads besides the queries: (pool, layer, tables).
        """
        B, H_kv, T, D = k_new.shape
        b, o = self.slots // self.pool.block_size, self.slots % self.pool.block_size  # (B*T,) block, offset
        self.pool.k[layer, b, :, o] = k_new.transpose(1, 2).reshape(B * T, H_kv, D)  # row by row, as slots are
        self.pool.v[layer, b, :, o] = v_new.transpose(1, 2).reshape(B * T, H_kv, D)
        return self.pool, layer, self.tables

    def advance(self, n: int) -> None:  # the tables counted the new tokens when append made room for them
        pass

    def reset(self) -> None:
        raise ValueError("a PagedView is one step's view of the pool: free a request's blocks to forget its tokens")

    def truncate(self, pos: int) -> None:
        if pos != self.pos:
            raise ValueError(
                f"a PagedView is one step's view of the pool: it cannot rewind from {self.pos} to {pos!r}; "
                "shorten a request's block table instead"
            )

    @staticmethod
    def attention(attn, x, view, layer, rope_cos, rope_sin):
        """One layer: the new tokens projected at their own rows' positions, written to their slots, attended through the tables."""
        at = view.positions[:, None] + torch.arange(x.shape[1])  # (B, T): row i's tokens from its own position
        return attention_through_cache(attn, x, view, layer, rope_cos, rope_sin, view.attend, positions=at)


class Engine:
    """Continuous batching over one pool: waiting (first come, first served), running, finished.

    new_table(block_size) makes a block table (append(pool, n) -> slots); attend(q, pool, layer,
    tables) is paged attention; copy_on_write(pool, table, index) makes a shared block private.
    """

    def __init__(
        self,
        model,
        pool,
        *,
        new_table: Callable,
        attend: Callable,
        copy_on_write: Callable,
        max_batch: int = 16,
        share_prefixes: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        self.model, self.pool, self.max_batch, self.clock = model, pool, max_batch, clock
        self.new_table, self.attend, self.copy_on_write = new_table, attend, copy_on_write
        self.waiting, self.running, self.finished = deque(), [], []
        self.prefixes = {} if share_prefixes else None  # prompt prefix (whole blocks) -> block
        self._prefix_of: dict[int, tuple] = {}
        self.stats = {"prefill_tokens": 0, "prefill_skipped": 0, "preemptions": 0, "decode_steps": 0}

    def add(self, request: Request) -> None:
        """Queue a request; one that could never fit in the pool, or the model, is refused here."""
        total = len(request.prompt) + request.max_new_tokens
        need = -(-total // self.pool.block_size)
        if need > self.pool.n_blocks:
            raise ValueError(
                f"request {request.id} needs {need} blocks at its longest ({total} tokens), more than the pool's {self.pool.n_blocks}"
            )
        if total > self.model.config.max_seq_len:
            raise ValueError(
                f"request {request.id} runs to {total} tokens, past the model's max_seq_len={self.model.config.max_seq_len}"
            )
        if not request.prompt or request.max_new_tokens < 1:
            raise ValueError(f"request {request.id} needs a prompt and max_new_tokens >= 1")
        self.waiting.append(request)

    def _forward(self, requests: list[Request], ids: list[list[int]]) -> None:
        """Run new tokens ids[i] of each request (all the same length); append each one's greedy next token."""
        positions, slots, bs = torch.tensor([r.table.length for r in requests]), [], self.pool.block_size
        for r, new in zip(requests, ids):
            if r.table.length % bs and self.pool.refs[r.table.blocks[-1]] > 1:
                self.copy_on_write(
                    self.pool, r.table, len(r.table.blocks) - 1
                )  # the next token lands in a shared block
            slots += r.table.append(self.pool, len(new))
        view = PagedView(self.pool, [r.table for r in requests], positions, torch.tensor(slots), self.attend)
        with torch.inference_mode():
            logits, _ = self.model(torch.tensor(ids), past_key_values=view)
        now = self.clock()
        for r, token in zip(requests, logits[:, -1].argmax(-1).tolist()):
            r.out.append(token)
            r.times.setdefault("first_token", now)
            r.times.setdefault("tokens", []).append(now)  # one time per token: the gaps are inter-token latency

    def _match(self, tokens: list[int]) -> tuple[list[int], int]:
        """The blocks of the longest prefix of tokens that a running request's prompt holds, and how many of tokens
        they hold: whole blocks first, then one part-filled block whose first tokens a prompt ended with (a
        prompt that extends another's, as a chat's next turn extends the last: RadixAttention matches by token)."""
        bs, blocks = self.pool.block_size, []
        if self.prefixes is None:
            return blocks, 0
        while (len(blocks) + 1) * bs <= len(tokens):
            b = self.prefixes.get(tuple(tokens[: (len(blocks) + 1) * bs]))
            if b is None:
                break
            blocks.append(b)
        whole = len(blocks) * bs
        for n in range(min(bs - 1, len(tokens) - whole), 0, -1):  # the longest part-filled block that matches
            b = self.prefixes.get(tuple(tokens[: whole + n]))
            if b is not None:
                return blocks + [b], whole + n
        return blocks, whole

    def blocks_to_admit(self, r: Request) -> int:
        """Blocks admitting r takes now: its tokens so far and the next one, less the prompt blocks it shares
        (plus one, for a copy, if it shares any: its last shared block may be written)."""
        shared = len(self._match(r.prompt + r.out)[0])
        return -(-(len(r.prompt) + len(r.out) + 1) // self.pool.block_size) - shared + (shared > 0)

    def admit(self, r: Request) -> None:
        """Prefill r (its prompt and, after a preemption, what it had generated: recompute) and run it. A request
        already running is refused (ValueError): admitting it again would drop its blocks and run it twice."""
        if r.table is not None or any(x is r for x in self.running):
            where = " and is still first in the waiting line" if self.waiting and self.waiting[0] is r else ""
            raise ValueError(
                f"request {r.id} is admitted twice: it is already running{where}. A request admitted stays in the "
                "waiting line unless it is taken off it, and then it is admitted again"
            )
        tokens, r.table, bs = r.prompt + r.out, self.new_table(self.pool.block_size), self.pool.block_size
        blocks, held = self._match(tokens)
        for b in blocks:
            self.pool.share(b)
            r.table.blocks.append(b)
        r.table.length = min(held, len(tokens) - 1)  # the last token runs, for its logits
        self.stats["prefill_skipped"] += r.table.length
        self.stats["prefill_tokens"] += len(tokens) - r.table.length
        try:
            self._forward([r], [tokens[r.table.length :]])  # a write into a shared block copies it first (_forward)
        except OutOfBlocks as err:
            raise OutOfBlocks(f"admitting request {r.id}: {err}") from None
        ends = [(i + 1) * bs for i in range(len(r.prompt) // bs)] + [len(r.prompt)] * (len(r.prompt) % bs > 0)
        for end in ends if self.prefixes is not None else ():  # its prompt's blocks, the part-filled last one too
            key, b = tuple(r.prompt[:end]), r.table.blocks[(end - 1) // bs]
            if key not in self.prefixes and b not in self._prefix_of:
                self.prefixes[key], self._prefix_of[b] = b, key
        self.running.append(r)

    def blocks_to_decode(self) -> int:
        """Blocks the next decode step takes: one per running request at a block boundary or in a shared block."""
        bs = self.pool.block_size
        return sum(r.table.length % bs == 0 or self.pool.refs[r.table.blocks[-1]] > 1 for r in self.running)

    def decode(self) -> None:
        """One batched decode step: every running request's last token, one forward pass."""
        if not self.running:  # a forward pass over no request would fail inside torch, naming nothing
            raise ValueError("decode() with no request running: decode only while self.running holds a request")
        try:
            self._forward(self.running, [[r.out[-1]] for r in self.running])
        except OutOfBlocks as err:
            raise OutOfBlocks(f"decoding {len(self.running)} request(s): {err}") from None
        self.stats["decode_steps"] += 1

    def _free(self, r: Request) -> None:
        for b in r.table.blocks:
            self.pool.release(b)
            if self.pool.refs[b] == 0 and b in self._prefix_of:
                del self.prefixes[self._prefix_of.pop(b)]  # its K/V may be written over from now on
        r.table = None

    def preempt(self, r: Request) -> None:
        """Take r off the batch: free its blocks, put it first in line; admit() recomputes its tokens."""
        self.running.remove(r)
        self._free(r)
        self.waiting.appendleft(r)
        self.stats["preemptions"] += 1

    def retire(self) -> None:
        """Free the blocks of every finished request and move it to finished."""
        for r in [r for r in self.running if r.done]:
            self.running.remove(r)
            self._free(r)
            r.times["done"] = self.clock()
            self.finished.append(r)

    def step(self) -> None:
        raise NotImplementedError("an Engine's subclass decides what runs at each step")

    def run(self, on_step: Callable[["Engine"], None] | None = None, max_steps: int = 100_000) -> list[Request]:
        """Step until every request is finished; on_step(self) after each step. Returns them in the order they finished."""
        for _ in range(max_steps):
            if not (self.waiting or self.running):
                return self.finished
            self.step()
            if on_step is not None:
                on_step(self)
        raise RuntimeError(
            f"{len(self.waiting) + len(self.running)} requests still unfinished after {max_steps} steps: "
            "step() admits nothing, or preempts forever"
        )
