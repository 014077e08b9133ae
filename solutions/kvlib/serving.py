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


class BlockPool(BlockStore):
    """K/V blocks of every layer (kvlib.core.paging.BlockStore: k, v, free list, refs, allocate, share), and release."""

    @exercise("7.1", validate=inputs.check_block)
    def release(self, block: int) -> None:
        """One table lets block go. The pool's invariants hold before and after every call: refs[b] is the number of
        tables holding block b, and free lists every block that no table holds, each exactly once.

        Args:    block: a block id, 0 <= block < n_blocks
        Returns: None
        Raises:  ValueError if no table holds block: the call could only break the invariants
        Example:
            >>> from kvlib.core.model import ModelConfig; pool = BlockPool(ModelConfig(vocab_size=50), n_blocks=4, block_size=4)
            >>> b = pool.allocate()[0]; pool.release(b); pool.n_free
            4
        """
        ### BEGIN SOLUTION
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is already free: released twice, or never allocated")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)  # the block's old K/V stay until someone writes over them
        ### END SOLUTION


class BlockTable:
    """One sequence's blocks, in the order its tokens fill them (block_size tokens each), and its length."""

    def __init__(self, block_size: int):
        self.blocks: list[int] = []
        self.length, self.block_size = 0, block_size  # tokens written (or about to be) so far

    @exercise("7.2", validate=inputs.check_append)
    def append(self, pool: BlockPool, n: int = 1) -> list[int]:
        """Make room for n more tokens of this sequence; return their slots, in order.

        A slot numbers a token's place in the pool: block 0's block_size slots first, then block 1's, and so on. The
        table holds no block its tokens do not need.
        Args:    pool: the BlockPool the table's blocks come from;  n: tokens, >= 1
        Returns: list of n int slots, of the sequence's positions length ... length + n - 1; length grows by n
        Raises:  OutOfBlocks (from pool.allocate) if the pool is short, and then the table is exactly as it was
        Example:
            >>> from kvlib.core.model import ModelConfig; pool = BlockPool(ModelConfig(vocab_size=50), n_blocks=4, block_size=4)
            >>> table = BlockTable(4); table.append(pool, 3), table.append(pool, 2), table.blocks
            ([0, 1, 2], [3, 4], [0, 1])
        """
        ### BEGIN SOLUTION
        bs = self.block_size
        missing = -(-(self.length + n) // bs) - len(self.blocks)
        if missing > 0:
            self.blocks += pool.allocate(missing)  # all or nothing: on OutOfBlocks nothing has changed
        slots = [self.blocks[p // bs] * bs + p % bs for p in range(self.length, self.length + n)]
        self.length += n
        return slots
        ### END SOLUTION


@exercise("7.6", validate=inputs.check_utilisation)
def block_utilisation(lengths: list[int], block_size: int) -> float:
    """Predict: the share of the slots in the blocks that sequences of these lengths hold that hold a token.

    Each sequence keeps a block table of its own and holds the blocks BlockTable.append (7.2) takes for its tokens.
    Args:    lengths: tokens each sequence holds, each >= 1;  block_size: slots per block, >= 1
    Returns: float in (0, 1]: tokens held / slots of the blocks held
    Raises:  ValueError if lengths is empty or holds a length < 1, or block_size is not a positive int
    Example:
        >>> block_utilisation([4, 4], block_size=4), block_utilisation([3], block_size=1)
        (1.0, 1.0)
    """
    ### BEGIN SOLUTION
    slots = sum(-(-n // block_size) * block_size for n in lengths)  # each sequence's last block partly empty
    return sum(lengths) / slots
    ### END SOLUTION


@exercise("7.3", validate=inputs.check_paged)
def paged_attention(q: torch.Tensor, pool: BlockPool, layer: int, tables: list[BlockTable]) -> torch.Tensor:
    """Attention for a batch of sequences of different lengths, reading K/V through their block tables.

    Args:    q: (batch, n_heads, seq_len, head_dim): each row's seq_len NEW queries (1 in a decode step),
                whose keys and values are already written to the pool; tables[i].length counts them
             pool: the BlockPool;  layer: which layer's K/V;  tables: one BlockTable per row of q
    Returns: (batch, n_heads, seq_len, head_dim), q's dtype: row i attends causally to its own
             tables[i].length keys and values, in the order of its table, each group of query heads reading its
             key/value head as in notebook 06
    Raises:  ValueError if there is not one table per row, layer is out of range, or a table is shorter than seq_len
    Example:
        >>> from kvlib.core.model import ModelConfig; pool = BlockPool(ModelConfig(vocab_size=50), n_blocks=4, block_size=4)
        >>> tables = [BlockTable(4), BlockTable(4)]; slots = tables[0].append(pool, 3), tables[1].append(pool, 6)
        >>> paged_attention(torch.randn(2, 8, 1, 16), pool, 0, tables).shape
        torch.Size([2, 8, 1, 16])
    """
    ### BEGIN SOLUTION
    from kvlib.gqa import grouped_attention  # noqa: PLC0415 (kept from the stub: your 6.2)

    rows = []
    for i, table in enumerate(tables):
        # one block at a time, each (H_kv, block_size, D), in table order, joined along the token axis and cut to the
        # row's length: one copy, where gathering the blocks first (pool.k[layer, blocks]) and moving heads copies twice
        k = torch.cat([pool.k[layer, b] for b in table.blocks], dim=1)[:, : table.length]  # (H_kv, S_i, D)
        v = torch.cat([pool.v[layer, b] for b in table.blocks], dim=1)[:, : table.length]
        rows.append(grouped_attention(q[i : i + 1], k[None], v[None]))  # (1, H, T, D)
    return torch.cat(rows)
    ### END SOLUTION


@exercise("7.5", validate=inputs.check_copy_on_write)
def copy_on_write(pool: BlockPool, table: BlockTable, index: int) -> int:
    """Make table.blocks[index] this table's own before it is written into, so that no other table sees the write.

    Shipped with a bug (Exercise 7.5 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Args:    pool: the BlockPool;  table: a BlockTable;  index: 0 <= index < len(table.blocks)
    Returns: int, the block table.blocks[index] holds afterwards, one that a write by this table changes for this
             table alone. Every table, this one included, reads what it read before the call; pool.refs still counts
             the tables holding each block; no block is copied that did not need it.
    Raises:  ValueError if index is out of range; OutOfBlocks if a copy is needed and no block is free
    Example:
        >>> from kvlib.core.model import ModelConfig; pool = BlockPool(ModelConfig(vocab_size=50), n_blocks=4, block_size=4)
        >>> table = BlockTable(4); _ = table.append(pool, 2); pool.share(table.blocks[0])  # another table holds it too
        >>> copy_on_write(pool, table, 0) != 0, pool.refs[0]
        (True, 1)
    """
    ### BEGIN SOLUTION
    old = table.blocks[index]
    if pool.refs[old] == 1:
        return old
    new = pool.allocate(1)[0]
    pool.k[:, new], pool.v[:, new] = pool.k[:, old], pool.v[:, old]
    table.blocks[index] = new
    pool.release(old)
    return new
    ### END SOLUTION
    ### BEGIN SHIPPED
    # block = table.blocks[index]
    # if pool.refs[block] > 1:  # another table holds it too: this table writes into a copy
    #     copy = pool.allocate(1)[0]
    #     pool.k[:, copy], pool.v[:, copy] = pool.k[:, block], pool.v[:, block]  # every layer's K and V
    #     table.blocks[index] = block = copy
    # return block
    ### END SHIPPED


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

    def victim(self) -> Request:
        """The running request step() preempts while a decode is short of blocks: the one admitted last (vLLM's
        rule). A Policy (Exercise 7.7) may name another; any choice keeps every request exact."""
        return self.running[-1]

    @exercise("7.4")
    def step(self) -> None:
        """One iteration of continuous batching. The contract, held by the checks whatever victim() you choose, as
        it stands when the step returns:
          - admission went first come, first served: the requests that left the line were its first ones, and when
            it stopped, max_batch requests ran or the first still waiting needed more free blocks than it found;
          - every request still running got one more token in this step's decode, and the pool never ran out of
            blocks; the requests that went back to the front of the line were the ones self.victim() named, no
            more of them than the decode needed;
          - no request that is done still runs, and none got more tokens than it asked for.
        Returns: None. Raises: nothing of its own (an engine method's error passes through)
        Example:
            >>> from kvlib.core.weights import load_tiny; model, _ = load_tiny()
            >>> s = Scheduler(model, BlockPool(model.config, n_blocks=8, block_size=4))
            >>> s.add(Request(0, [5, 6, 7], max_new_tokens=2)); s.step(); s.step()
            >>> len(s.running), len(s.finished), len(s.finished[0].out)
            (0, 1, 2)
        """
        ### BEGIN SOLUTION
        while (
            self.waiting
            and len(self.running) < self.max_batch
            and self.blocks_to_admit(self.waiting[0]) <= self.pool.n_free
        ):
            self.admit(self.waiting.popleft())
        self.retire()
        while self.running and self.blocks_to_decode() > self.pool.n_free:
            self.preempt(self.victim())
        if self.running:
            self.decode()
            self.retire()
        ### END SOLUTION


class Policy(Scheduler):
    """Your scheduling policy (Exercise 7.7): a Scheduler that admits by your rule (and preempts by your victim(),
    should you write one), graded on a budget in notebook 07b."""

    @exercise("7.7")
    def blocks_to_admit(self, r: Request) -> int:
        """Your admission rule: the free blocks step() must see before it admits r, the first request in line.

        The budget (kvlib.measure.bench_serve.BUDGET, graded): notebook 07b's 32 requests, answers cut to 24
        tokens, in 24 blocks of 16 with at most 16 running: at most 100 tokens fed again after preemptions, and
        a TTFT p99 of at most 100 steps. Any rule that meets both earns the points.
        Args:    r: a waiting Request (r.prompt, r.out, r.max_new_tokens); self.running, self.pool as step() sees them
        Returns: int, at least Scheduler.blocks_to_admit(self, r) (the blocks admitting r takes now); with nothing
                 running, no more than that (a request that fits an idle pool is admitted)
        Raises:  nothing of its own
        Example:
            >>> from kvlib.core.weights import load_tiny; model, _ = load_tiny()
            >>> s = Policy(model, BlockPool(model.config, n_blocks=8, block_size=4)); s.add(Request(0, [5, 6, 7], 2))
            >>> s.blocks_to_admit(s.waiting[0])  # nothing runs: what admitting takes, 4 tokens in 1 block
            1
        """
        ### BEGIN SOLUTION
        need = Scheduler.blocks_to_admit(self, r)
        return need + 2 if self.running else need  # 2 blocks kept back for the running requests' next tokens
        ### END SOLUTION


__all__ = [
    "BlockPool",
    "BlockTable",
    "OutOfBlocks",
    "Policy",
    "Request",
    "Scheduler",
    "block_utilisation",
    "copy_on_write",
    "paged_attention",
]
