"""Serving many requests (notebook 07-serving): a paged KV cache, continuous batching, shared prefixes.

Notebook 04's KVCache reserves max_seq_len slots per sequence. Here the cache is one pool of
fixed-size blocks, and each sequence keeps a block table of the blocks it holds (PagedAttention,
Kwon et al., SOSP 2023, arXiv 2309.06180). A scheduler admits, decodes and retires requests at
every step (iteration-level batching: Orca, Yu et al., OSDI 2022). Requests whose prompts begin
alike share those blocks by reference count (SGLang's RadixAttention, arXiv 2312.07104, keeps them
in a radix tree; here a dict, alive while a request holds them). The trace, static batching and
timing are kvlib.measure.bench_serve's. Left out: chunked prefill, eviction, swapping to the CPU.
"""

from __future__ import annotations

import time

import torch

from kvlib.core.paging import BlockStore, Engine, OutOfBlocks, Request
from kvlib.course import inputs
from kvlib.course.exercises import exercise
from kvlib.gqa import grouped_attention


class BlockPool(BlockStore):
    """K/V blocks of every layer (kvlib.core.paging.BlockStore: k, v, free list, refs, allocate, share, read), and release."""

    @exercise("7.1", validate=inputs.check_block)
    def release(self, block: int) -> None:
        """Drop one reference to block; when none is left, put it back on the free list.

        Raises ValueError if block is already free: a block released twice would sit twice on the
        free list, and two sequences would one day write into the same block.
        Example: b = pool.allocate()[0]; pool.share(b); pool.release(b) -> still in use; release again -> free

        Hints (reference solution: 5 lines):
          1. self.refs[block] counts the tables that hold it; 0 means free.
          2. Only the last release frees it: self.free.append(block).
        """
        raise NotImplementedError("Exercise 7.1 (notebooks/07-serving): BlockPool.release")


class BlockTable:
    """One sequence's blocks, in order: token p sits in blocks[p // block_size] at offset p % block_size."""

    def __init__(self, block_size: int):
        self.blocks: list[int] = []
        self.length, self.block_size = 0, block_size  # tokens written (or about to be) so far

    @exercise("7.2", validate=inputs.check_append)
    def append(self, pool: BlockPool, n: int = 1) -> list[int]:
        """Make room for n more tokens; return their slots (block * block_size + offset), in order.

        A new block is allocated only when a token crosses a block boundary; if the pool is short,
        pool.allocate raises OutOfBlocks and the table must be left exactly as it was.
        Example: block_size 4, length 3, append(pool, 2) -> one new block; slots [b0*4 + 3, b1*4 + 0]

        Hints (reference solution: 7 lines):
          1. ceil((length + n) / block_size) blocks are needed: -(-a // b) is ceil(a / b).
          2. Allocate what is missing in one call, before changing anything.
        """
        raise NotImplementedError("Exercise 7.2 (notebooks/07-serving): BlockTable.append")


@exercise("7.3", validate=inputs.check_paged)
def paged_attention(q: torch.Tensor, pool: BlockPool, layer: int, tables: list[BlockTable]) -> torch.Tensor:
    """Attention for a batch of sequences of different lengths, reading K/V through their block tables.

    Args:    q: (batch, n_heads, seq_len, head_dim): each row's seq_len NEW queries (1 in a decode step),
             already written to the pool; tables[i].length counts them. layer: which layer's K/V.
    Returns: (batch, n_heads, seq_len, head_dim); row i attends causally to its own tables[i].length keys,
             never padded to the longest row.

    Hints (reference solution: 5 lines):
      1. pool.read(layer, table.blocks, table.length) gives one row's keys and values, (n_kv_heads, S, D).
      2. grouped_attention (Exercise 6.2) on q[i:i + 1] and those keys with a batch axis ([None]); torch.cat the rows.
    """
    raise NotImplementedError("Exercise 7.3 (notebooks/07-serving): paged_attention")


@exercise("7.5", validate=inputs.check_copy_on_write)
def copy_on_write(pool: BlockPool, table: BlockTable, index: int) -> int:
    """Make table.blocks[index] this table's own before it is written: copy a shared block, keep a private one.

    If the block's reference count is 1, return it unchanged. Otherwise allocate a new block, copy
    the K and V of every layer into it, point the table at it, release the shared one; return the new block.

    Hints (reference solution: 8 lines):
      1. pool.k[:, new] = pool.k[:, old] copies all layers of one block (and the same for pool.v).
      2. The other tables still hold the old block: release it once, for this table only.
    """
    raise NotImplementedError("Exercise 7.5 (notebooks/07-serving): copy_on_write")


class Scheduler(Engine):
    """Continuous batching (kvlib.core.paging.Engine: add, admit, decode, preempt, retire, run) with your pieces."""

    def __init__(
        self, model, pool: BlockPool, max_batch: int = 16, share_prefixes: bool = False, clock=time.perf_counter
    ):
        super().__init__(
            model,
            pool,
            new_table=BlockTable,
            attend=paged_attention,
            copy_on_write=copy_on_write,
            max_batch=max_batch,
            share_prefixes=share_prefixes,
            clock=clock,
        )

    @exercise("7.4")
    def step(self) -> None:
        """One iteration of continuous batching.

        1. Admit waiting requests, first come first served, while fewer than max_batch run and
           self.blocks_to_admit(first waiting) <= self.pool.n_free (admit() prefills: a first token).
        2. Retire: a request may be done after its prefill.
        3. While self.blocks_to_decode() > free blocks: preempt the most recently admitted running
           request (the last of self.running: it has made the fewest tokens, as vLLM chooses).
        4. If any run: decode() once for all of them, then retire again.

        Hints (reference solution: 8 lines):
          1. self.waiting is a deque: [0] is the first in line, popleft() takes it.
        """
        raise NotImplementedError("Exercise 7.4 (notebooks/07-serving): Scheduler.step")


__all__ = ["BlockPool", "BlockTable", "OutOfBlocks", "Request", "Scheduler", "copy_on_write", "paged_attention"]
