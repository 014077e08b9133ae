"""kvlib/serving.py (notebook 07): the reference passes every check; for each exercise three other
correct implementations pass and three likely wrong ones fail, named; a 32-request trace on the
tiny model gets exactly the tokens each request gets alone with notebook 04's cache, also under
preemption and with shared prefixes; bad input fails clearly; `kvlib bench serve` reports.

The check tests go under two names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip)."""

import inspect
import json
import re
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import case_ids, check_failures, handed_in, on_a_terminal, shown_progress

from kvlib import serving
from kvlib.checks import checks_for
from kvlib.checks.serving import CONFIG, laid_out
from kvlib.core.model import ModelConfig
from kvlib.core.paging import BlockStore, Engine
from kvlib.course.exercises import BY_ID

SERVING_CHECKS = [c for i in range(1, 7) for c in checks_for(BY_ID[f"7.{i}"])]
NAMES = tuple(serving.__all__)


def _module(**over):
    """kvlib.serving with some pieces replaced; its Scheduler uses the replaced table, attention and copy."""
    ns = handed_in(serving, NAMES, **over)
    base = over.get("Scheduler", serving.Scheduler)

    class Scheduler(base):
        def __init__(self, model, pool, max_batch=16, share_prefixes=False, clock=time.perf_counter):
            Engine.__init__(
                self,
                model,
                pool,
                new_table=ns.BlockTable,
                attend=ns.paged_attention,
                copy_on_write=ns.copy_on_write,
                max_batch=max_batch,
                share_prefixes=share_prefixes,
                clock=clock,
            )

    ns.Scheduler = Scheduler
    return ns


def test_the_yardsticks_layout_is_a_tables_tokens_in_table_order():
    """Check that kvlib.checks.serving.laid_out (what 7.3 is checked against reads through) gives a table's first
    length tokens, token t from slot t % block_size of its (t // block_size)-th block, for lengths 1 to all its slots."""
    store = BlockStore(ModelConfig(vocab_size=50), n_blocks=8, block_size=4)
    store.k.normal_()
    blocks = [5, 0, 7]
    for length in range(1, 13):
        k = laid_out(store.k[1], blocks, length)
        assert k.shape == (store.k.shape[2], length, store.k.shape[4]), (length, k.shape)
        for t in range(length):
            assert torch.equal(k[:, t], store.k[1, blocks[t // 4], :, t % 4]), (length, t)


def _read(pool, layer, blocks, length):
    """A learner's gather (tests only): the first length tokens' K and V of one layer through blocks."""
    k = torch.cat([pool.k[layer, b] for b in blocks], dim=1)[:, :length]
    return k, torch.cat([pool.v[layer, b] for b in blocks], dim=1)[:, :length]


@pytest.mark.parametrize("check", SERVING_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 07."""
    check.fn(serving, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that each exercise of notebook 07 is todo in a fresh clone, naming itself or Exercise 6.2; 7.5, which
    ships a broken body (find and fix), fails its checks instead."""
    from kvlib.checks import run

    for r in run("07"):
        assert r.status == ("fail" if r.id == "7.5" else "todo"), (r.id, r.status, r.message)


# ---------------------------------------------------------------------------------------------
# Three other right answers per exercise pass


class _ReleaseFifo(serving.BlockPool):
    def release(self, block):
        if self.refs[block] == 0:
            raise ValueError(f"block {block} is free")
        self.refs[block] -= 1
        if not self.refs[block]:
            self.free.insert(0, block)  # a queue instead of a stack: any order is right


class _ReleaseByFreeList(serving.BlockPool):
    def release(self, block):
        if block in self.free:
            raise ValueError("released twice")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)


class _ReleaseSubclassError(serving.BlockPool):
    class DoubleFree(ValueError):
        pass

    def release(self, block):
        left = self.refs[block] - 1
        if left < 0:
            raise self.DoubleFree(block)
        self.refs[block] = left
        self.free += [block] if left == 0 else []


class _AppendCheckFirst(serving.BlockTable):
    def append(self, pool, n=1):
        bs = self.block_size
        need = (self.length + n + bs - 1) // bs - len(self.blocks)
        if need > pool.n_free:
            raise serving.OutOfBlocks("short")
        for _ in range(max(need, 0)):
            self.blocks.append(pool.allocate(1)[0])
        start, self.length = self.length, self.length + n
        return [self.blocks[p // bs] * bs + p % bs for p in range(start, self.length)]


class _AppendWhile(serving.BlockTable):
    def append(self, pool, n=1):
        count = 0
        while (len(self.blocks) + count) * self.block_size < self.length + n:
            count += 1
        self.blocks.extend(pool.allocate(count) if count else [])
        out = []
        for p in range(self.length, self.length + n):
            b, o = divmod(p, self.block_size)
            out.append(self.blocks[b] * self.block_size + o)
        self.length += n
        return out


class _AppendMath(serving.BlockTable):
    def append(self, pool, n=1):
        import math

        new = pool.allocate(max(0, math.ceil((self.length + n) / self.block_size) - len(self.blocks)))
        self.blocks = self.blocks + new
        slots = [
            self.blocks[p // self.block_size] * self.block_size + p % self.block_size
            for p in range(self.length, self.length + n)
        ]
        self.length = self.length + n
        return slots


def _paged_repeat(q, pool, layer, tables):
    rows = []
    for i, t in enumerate(tables):
        k, v = _read(pool, layer, t.blocks, t.length)
        G = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(G, 0)[None], v.repeat_interleave(G, 0)[None]
        T, S = q.shape[2], k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        rows.append(F.scaled_dot_product_attention(q[i : i + 1], k, v, attn_mask=mask))
    return torch.cat(rows)


def _paged_cat_blocks(q, pool, layer, tables):
    from kvlib.gqa import grouped_attention

    out = torch.empty_like(q)
    for i, t in enumerate(tables):
        k = torch.cat([pool.k[layer, b] for b in t.blocks], dim=1)[:, : t.length]
        v = torch.cat([pool.v[layer, b] for b in t.blocks], dim=1)[:, : t.length]
        out[i] = grouped_attention(q[i : i + 1], k[None], v[None])[0]
    return out


def _paged_sdpa(q, pool, layer, tables):
    outs = []
    for i, t in enumerate(tables):
        k, v = _read(pool, layer, t.blocks, t.length)
        mask = torch.ones(q.shape[2], t.length, dtype=torch.bool).tril(t.length - q.shape[2])
        outs.append(F.scaled_dot_product_attention(q[i : i + 1], k[None], v[None], attn_mask=mask, enable_gqa=True))
    return torch.cat(outs)


class _StepLenFree(serving.Scheduler):
    def step(self):
        while self.waiting and len(self.running) < self.max_batch:
            if self.blocks_to_admit(self.waiting[0]) > len(self.pool.free):
                break
            self.admit(self.waiting.popleft())
        self.retire()
        while self.running and self.blocks_to_decode() > len(self.pool.free):
            self.preempt(self.running[len(self.running) - 1])
        if self.running:
            self.decode()
        self.retire()


class _StepRetireFirst(serving.Scheduler):
    def step(self):
        self.retire()
        while (
            self.waiting
            and len(self.running) < self.max_batch
            and self.blocks_to_admit(self.waiting[0]) <= self.pool.n_free
        ):
            self.admit(self.waiting.popleft())
        self.retire()
        while self.running and self.blocks_to_decode() > self.pool.n_free:
            self.preempt(self.running[-1])
        if self.running:
            self.decode()
            self.retire()


class _StepNewestByOrder(serving.Scheduler):
    def step(self):
        order = getattr(self, "_order", {})
        self._order = order
        while (
            self.waiting
            and len(self.running) < self.max_batch
            and self.blocks_to_admit(self.waiting[0]) <= self.pool.n_free
        ):
            r = self.waiting.popleft()
            self.admit(r)
            order[r.id] = len(order)
        self.retire()
        while self.running and self.blocks_to_decode() > self.pool.n_free:
            self.preempt(max(self.running, key=lambda r: (self.running.index(r), order[r.id])))
        if self.running:
            self.decode()
            self.retire()


class _VictimOldest(serving.Scheduler):
    def victim(self):
        return self.running[0]  # the longest running: its recompute is the costliest, but it frees the most


class _VictimMostBlocks(serving.Scheduler):
    def victim(self):
        return max(self.running, key=lambda r: (len(r.table.blocks), -self.running.index(r)))


def _cow_index_copy(pool, table, index):
    old = table.blocks[index]
    if pool.refs[old] < 2:
        return old
    (new,) = pool.allocate(1)
    pool.k.index_copy_(1, torch.tensor([new]), pool.k[:, [old]])
    pool.v.index_copy_(1, torch.tensor([new]), pool.v[:, [old]])
    pool.release(old)
    table.blocks[index] = new
    return new


def _cow_copy_(pool, table, index):
    old = table.blocks[index]
    if pool.refs[old] == 1:
        return old
    new = pool.allocate()[0]
    pool.k[:, new].copy_(pool.k[:, old])
    pool.v[:, new].copy_(pool.v[:, old])
    table.blocks = table.blocks[:index] + [new] + table.blocks[index + 1 :]
    pool.release(old)
    return new


def _cow_clone(pool, table, index):
    old = table.blocks[index]
    if pool.refs[old] > 1:
        new = pool.allocate(1)[0]
        pool.k[:, new], pool.v[:, new] = pool.k[:, old].clone(), pool.v[:, old].clone()
        pool.release(old)
        table.blocks[index] = new
    return table.blocks[index]


def _utilisation_by_tables(lengths, block_size):  # measured, not predicted: tables in a pool, its held blocks counted
    pool = serving.BlockPool(CONFIG, 1 + 2 * sum(lengths) // block_size + len(lengths), block_size)
    for n in lengths:
        serving.BlockTable(block_size).append(pool, n)
    return sum(lengths) / ((pool.n_blocks - pool.n_free) * block_size)


def _utilisation_empty_slots(lengths, block_size):  # 1 - the empty slots of each last block / all slots held
    empty = sum((-n) % block_size for n in lengths)
    return 1 - empty / (sum(lengths) + empty)


def _utilisation_numpy(lengths, block_size):  # numpy's ceil, a numpy float back
    lengths = np.asarray(lengths)
    return lengths.sum() / (np.ceil(lengths / block_size) * block_size).sum()


class _PolicyMarginThree(serving.Policy):  # another margin inside the budget's window
    def blocks_to_admit(self, r):
        need = serving.Scheduler.blocks_to_admit(self, r)
        return need + 3 if self.running else need


class _PolicyOldestVictim(serving.Policy):  # a margin of 2, and the oldest preempted instead of the newest
    def blocks_to_admit(self, r):
        need = serving.Scheduler.blocks_to_admit(self, r)
        return need + (2 if self.running else 0)

    def victim(self):
        return self.running[0]


class _PolicyRoomToGrow(serving.Policy):  # room for every running request's next block, at most 2 kept back
    def blocks_to_admit(self, r):
        need = serving.Scheduler.blocks_to_admit(self, r)
        return need + min(2, len(self.running))


ALTERNATIVES = [
    ("7.1", {"BlockPool": _ReleaseFifo}),
    ("7.1", {"BlockPool": _ReleaseByFreeList}),
    ("7.1", {"BlockPool": _ReleaseSubclassError}),
    ("7.2", {"BlockTable": _AppendCheckFirst}),
    ("7.2", {"BlockTable": _AppendWhile}),
    ("7.2", {"BlockTable": _AppendMath}),
    ("7.3", {"paged_attention": _paged_repeat}),
    ("7.3", {"paged_attention": _paged_cat_blocks}),
    ("7.3", {"paged_attention": _paged_sdpa}),
    ("7.4", {"Scheduler": _StepLenFree}),
    ("7.4", {"Scheduler": _StepRetireFirst}),
    ("7.4", {"Scheduler": _StepNewestByOrder}),
    ("7.4", {"Scheduler": _VictimOldest}),  # another policy: the checks hold invariants, not vLLM's choice
    ("7.4", {"Scheduler": _VictimMostBlocks}),
    ("7.5", {"copy_on_write": _cow_index_copy}),
    ("7.5", {"copy_on_write": _cow_copy_}),
    ("7.5", {"copy_on_write": _cow_clone}),
    ("7.6", {"block_utilisation": _utilisation_empty_slots}),
    ("7.6", {"block_utilisation": _utilisation_numpy}),
    ("7.7", {"Policy": _PolicyMarginThree}),
    ("7.7", {"Policy": _PolicyOldestVictim}),
    ("7.7", {"Policy": _PolicyRoomToGrow}),
]


@pytest.mark.parametrize("exercise_id, over", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(exercise_id, over):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = check_failures(exercise_id, _module(**over))
    assert not failures, failures


# ---------------------------------------------------------------------------------------------
# Three likely wrong answers per exercise fail, with the slip named


class _ReleaseNoRefcount(serving.BlockPool):
    def release(self, block):
        if self.refs[block] == 0:
            raise ValueError("free")
        self.refs[block] = 0
        self.free.append(block)


class _ReleaseNoDoubleCheck(serving.BlockPool):
    def release(self, block):
        self.refs[block] = max(0, self.refs[block] - 1)
        if self.refs[block] == 0:
            self.free.append(block)


class _ReleaseLeaks(serving.BlockPool):
    def release(self, block):
        if self.refs[block] == 0:
            raise ValueError("free")
        self.refs[block] -= 1


class _AppendBlockPerToken(serving.BlockTable):
    def append(self, pool, n=1):
        self.blocks += pool.allocate(-(-n // self.block_size))  # forgets the room left in the last block
        slots = [
            self.blocks[p // self.block_size] * self.block_size + p % self.block_size
            for p in range(self.length, self.length + n)
        ]
        self.length += n
        return slots


class _AppendHalfGrown(serving.BlockTable):
    def append(self, pool, n=1):
        bs, slots = self.block_size, []
        for p in range(self.length, self.length + n):
            if p // bs >= len(self.blocks):
                self.blocks += pool.allocate(1)  # raises halfway, leaving blocks taken
            self.length += 1
            slots.append(self.blocks[p // bs] * bs + p % bs)
        return slots


class _AppendLengthFirst(serving.BlockTable):
    def append(self, pool, n=1):
        bs, start = self.block_size, self.length
        self.length += n  # counted before the blocks are there: a failed allocate leaves it counted
        missing = -(-self.length // bs) - len(self.blocks)
        if missing > 0:
            self.blocks += pool.allocate(missing)
        return [self.blocks[p // bs] * bs + p % bs for p in range(start, self.length)]


class _AppendOffByOne(serving.BlockTable):
    def append(self, pool, n=1):
        bs = self.block_size
        missing = (self.length + n) // bs + 1 - len(self.blocks)  # one block too many at every exact boundary
        if missing > 0:
            self.blocks += pool.allocate(missing)
        slots = [self.blocks[p // bs] * bs + p % bs for p in range(self.length, self.length + n)]
        self.length += n
        return slots


def _paged_padded(q, pool, layer, tables):
    from kvlib.gqa import grouped_attention

    longest = max(t.length for t in tables)
    rows = []
    for i, t in enumerate(tables):
        k, v = _read(pool, layer, t.blocks, t.length)
        k, v = (
            F.pad(k, (0, 0, 0, longest - t.length)),
            F.pad(v, (0, 0, 0, longest - t.length)),
        )  # zeros up to the longest
        rows.append(grouped_attention(q[i : i + 1], k[None], v[None]))
    return torch.cat(rows)


def _paged_sorted(q, pool, layer, tables):
    from kvlib.gqa import grouped_attention

    rows = []
    for i, t in enumerate(tables):
        k, v = _read(pool, layer, sorted(t.blocks), t.length)
        rows.append(grouped_attention(q[i : i + 1], k[None], v[None]))
    return torch.cat(rows)


def _paged_whole_blocks(q, pool, layer, tables):
    from kvlib.gqa import grouped_attention

    rows = []
    for i, t in enumerate(tables):
        k, v = _read(pool, layer, t.blocks, len(t.blocks) * pool.block_size)
        rows.append(grouped_attention(q[i : i + 1], k[None], v[None]))
    return torch.cat(rows)


class _StepNoPreempt(serving.Scheduler):
    def step(self):
        while (
            self.waiting
            and len(self.running) < self.max_batch
            and self.blocks_to_admit(self.waiting[0]) <= self.pool.n_free
        ):
            self.admit(self.waiting.popleft())
        self.retire()
        if self.running:
            self.decode()
            self.retire()


class _StepDecodesNobody(serving.Scheduler):  # decodes with nobody running (here: once the step left none)
    def step(self):
        super().step()
        if not self.running:
            self.decode()


class _StepPreemptOldest(serving.Scheduler):
    def step(self):
        while (
            self.waiting
            and len(self.running) < self.max_batch
            and self.blocks_to_admit(self.waiting[0]) <= self.pool.n_free
        ):
            self.admit(self.waiting.popleft())
        self.retire()
        while self.running and self.blocks_to_decode() > self.pool.n_free:
            self.preempt(self.running[0])
        if self.running:
            self.decode()
            self.retire()


class _StepSkipsAhead(serving.Scheduler):
    def step(self):
        for r in list(self.waiting):  # admits any that fits, past an earlier one that does not
            if len(self.running) < self.max_batch and self.blocks_to_admit(r) <= self.pool.n_free:
                self.waiting.remove(r)
                self.admit(r)
        self.retire()
        while self.running and self.blocks_to_decode() > self.pool.n_free:
            self.preempt(self.victim())
        if self.running:
            self.decode()
            self.retire()


class _StepIgnoresBlocks(serving.Scheduler):
    def step(self):
        while self.waiting and len(self.running) < self.max_batch:
            self.admit(self.waiting.popleft())
        self.retire()
        while self.running and self.blocks_to_decode() > self.pool.n_free:
            self.preempt(self.running[-1])
        if self.running:
            self.decode()
            self.retire()


def _cow_no_copy(pool, table, index):
    old = table.blocks[index]
    if pool.refs[old] == 1:
        return old
    new = pool.allocate(1)[0]  # a fresh block, its contents never copied
    table.blocks[index] = new
    pool.release(old)
    return new


def _cow_keeps_reference(pool, table, index):
    old = table.blocks[index]
    if pool.refs[old] == 1:
        return old
    new = pool.allocate(1)[0]
    pool.k[:, new], pool.v[:, new] = pool.k[:, old], pool.v[:, old]
    table.blocks[index] = new
    return new


def _cow_nothing(pool, table, index):  # the table keeps the shared block: its write lands in the other's tokens
    return table.blocks[index]


def _cow_always(pool, table, index):
    old = table.blocks[index]
    new = pool.allocate(1)[0]
    pool.k[:, new], pool.v[:, new] = pool.k[:, old], pool.v[:, old]
    table.blocks[index] = new
    pool.release(old)
    return new


class _StepPolicy(serving.Scheduler):
    """The reference step with one comparison or loop changed: the boundary slips of 7.4."""

    admit_when_equal, preempt_when_equal, preempt_at_most_once, retire_after_prefill = True, False, False, True
    leaves_the_line = True  # False: issue 46's slip, a request admitted but left first in the waiting line

    def step(self):
        def fits(need, free):
            return need <= free if self.admit_when_equal else need < free

        while (
            self.waiting
            and len(self.running) < self.max_batch
            and fits(self.blocks_to_admit(self.waiting[0]), self.pool.n_free)
        ):
            self.admit(self.waiting.popleft() if self.leaves_the_line else self.waiting[0])
        if self.retire_after_prefill:
            self.retire()
        for _ in range(1 if self.preempt_at_most_once else len(self.running)):
            short = (
                self.blocks_to_decode() >= self.pool.n_free
                if self.preempt_when_equal
                else self.blocks_to_decode() > self.pool.n_free
            )
            if not (self.running and short):
                break
            self.preempt(self.running[-1])
        if self.running and self.blocks_to_decode() <= self.pool.n_free:
            self.decode()
            self.retire()


class _StepAdmitsStrictly(_StepPolicy):
    admit_when_equal = False


class _StepPreemptsWhenJustEnough(_StepPolicy):
    preempt_when_equal = True


class _StepPreemptsOnce(_StepPolicy):
    preempt_at_most_once = True


class _StepNoRetireAfterPrefill(_StepPolicy):
    retire_after_prefill = False


class _StepAdmitsWithoutLeavingTheLine(_StepPolicy):
    leaves_the_line = False


def _utilisation_floor(lengths, block_size):
    return sum(lengths) / max(1, sum(n // block_size * block_size for n in lengths))


def _utilisation_floor_one_block(lengths, block_size):  # rounded down, but a short sequence keeps its one block
    return sum(lengths) / sum(max(1, n // block_size) * block_size for n in lengths)


def _utilisation_pooled(lengths, block_size):
    return sum(lengths) / (-(-sum(lengths) // block_size) * block_size)


def _utilisation_extra_block(lengths, block_size):
    return sum(lengths) / sum((n // block_size + 1) * block_size for n in lengths)


def _utilisation_half_block(lengths, block_size):
    return sum(lengths) / (sum(lengths) + len(lengths) * (block_size - 1) / 2)


class _PolicyNoMargin(serving.Policy):  # the engine's own number: admits until the pool is full
    def blocks_to_admit(self, r):
        return serving.Scheduler.blocks_to_admit(self, r)


class _PolicyWideMargin(serving.Policy):  # so many blocks kept back that requests wait past the TTFT budget
    def blocks_to_admit(self, r):
        need = serving.Scheduler.blocks_to_admit(self, r)
        return need + 6 if self.running else need


class _PolicyMarginWhenIdle(serving.Policy):  # keeps room back even with nothing running
    def blocks_to_admit(self, r):
        return serving.Scheduler.blocks_to_admit(self, r) + 2


class _PolicyFewer(serving.Policy):  # asks for fewer blocks than admitting takes
    def blocks_to_admit(self, r):
        need = serving.Scheduler.blocks_to_admit(self, r)
        return need - 1 if self.running else need


SLIPS = [  # (check, replaced pieces, words its failure must contain)
    ("release_counts_references", {"BlockPool": _ReleaseNoRefcount}, "other table still reads it"),
    ("release_twice_is_an_error", {"BlockPool": _ReleaseNoDoubleCheck}, "must raise ValueError"),
    ("release_returns_the_block", {"BlockPool": _ReleaseLeaks}, "back on the free list"),
    ("append_allocates_at_block_boundaries", {"BlockTable": _AppendBlockPerToken}, "a block per token"),
    (
        "append_leaves_the_table_alone_when_blocks_run_out",
        {"BlockTable": _AppendHalfGrown},
        "the table holds blocks for tokens it never got",
    ),
    (
        "append_leaves_the_table_alone_when_blocks_run_out",
        {"BlockTable": _AppendLengthFirst},
        "its length counts tokens that got no slot",
    ),
    ("append_allocates_at_block_boundaries", {"BlockTable": _AppendOffByOne}, "[1, 1, 1, 1, 2, 2, 2, 2, 3]"),
    ("paged_attention_matches_contiguous", {"paged_attention": _paged_padded}, "not padded to the longest row"),
    ("paged_attention_matches_contiguous", {"paged_attention": _paged_sorted}, "not sorted"),
    ("paged_attention_matches_contiguous", {"paged_attention": _paged_whole_blocks}, "read all of its last block"),
    ("step_preempts_the_newest_and_stays_exact", {"Scheduler": _StepNoPreempt}, "a decode ran with fewer free blocks"),
    ("step_preempts_the_newest_and_stays_exact", {"Scheduler": _StepPreemptOldest}, "while self.victim() named"),
    ("step_serves_every_request_exactly", {"Scheduler": _StepDecodesNobody}, "decode() with no request running"),
    ("step_admits_while_blocks_and_batch_allow", {"Scheduler": _StepSkipsAhead}, "first come, first served"),
    (
        "step_admits_while_blocks_and_batch_allow",
        {"Scheduler": _StepIgnoresBlocks},
        "admitted with fewer free blocks than admitting it takes",
    ),
    ("copy_on_write_copies_a_shared_block", {"copy_on_write": _cow_no_copy}, "must hold the old block's K and V"),
    ("copy_on_write_copies_a_shared_block", {"copy_on_write": _cow_keeps_reference}, "counts 2 reference(s) while 1"),
    ("copy_on_write_copies_only_shared_blocks", {"copy_on_write": _cow_always}, "needs no copy"),
    ("copy_on_write_copies_a_shared_block", {"copy_on_write": _cow_nothing}, "should be copied"),
    ("copy_on_write_copies_only_shared_blocks", {"copy_on_write": _cow_nothing}, "a write there would change"),
    ("shared_prefixes_stay_exact", {"copy_on_write": _cow_nothing}, "where request 0 writes its answer"),
    ("policy_meets_the_budget", {"Policy": _PolicyNoMargin}, "leaves the running requests no block to grow into"),
    ("policy_meets_the_budget", {"Policy": _PolicyWideMargin}, "keep fewer blocks back"),
    ("policy_meets_the_budget", {"Policy": _PolicyMarginWhenIdle}, "no one to keep room for"),
    ("policy_meets_the_budget", {"Policy": _PolicyFewer}, "never fewer than admitting takes"),
    ("step_admits_while_blocks_and_batch_allow", {"Scheduler": _StepAdmitsStrictly}, "exactly the free blocks"),
    ("step_preempts_the_newest_and_stays_exact", {"Scheduler": _StepPreemptsWhenJustEnough}, "that is enough"),
    ("step_preempts_the_newest_and_stays_exact", {"Scheduler": _StepPreemptsOnce}, "keep preempting"),
    ("step_serves_every_request_exactly", {"Scheduler": _StepNoRetireAfterPrefill}, "done right after its prefill"),
    ("step_serves_every_request_exactly", {"Scheduler": _StepAdmitsWithoutLeavingTheLine}, "admitted twice"),
    ("block_utilisation_counts_each_last_block", {"block_utilisation": _utilisation_floor}, "round each length up"),
    ("block_utilisation_counts_each_last_block", {"block_utilisation": _utilisation_pooled}, "pooled"),
    (
        "block_utilisation_counts_each_last_block",
        {"block_utilisation": _utilisation_floor_one_block},
        "a short sequence's one block included",
    ),
    ("block_utilisation_counts_each_last_block", {"block_utilisation": _utilisation_extra_block}, "a block too many"),
    ("block_utilisation_counts_each_last_block", {"block_utilisation": _utilisation_half_block}, "an average"),
]


SHIPPED_7_5 = {  # check -> the symptom its failure shows for the copy_on_write 7.5 ships (the stub's own body)
    "copy_on_write_copies_a_shared_block": "counts 2 reference(s) while 1 table(s) hold it",
    "copy_on_write_copies_only_shared_blocks": "the pool will not get them all back",
    "shared_prefixes_stay_exact": "never came back to the free list",
}


def test_the_copy_on_write_7_5_ships_fails_its_checks_showing_the_symptom():
    """Check that the learner stub's copy_on_write (7.5 is find-and-fix: the stub ships a body that copies a shared
    block and never lets the old one go) fails each of 7.5's checks with the symptom (a block counted by a table that
    let it go, blocks that never come back to the free list), never the cause's fix (release)."""
    shipped = serving.copy_on_write.__wrapped__  # the stub's body, not the reference this mode would call
    assert "pool.release" not in inspect.getsource(shipped)
    failures = dict(check_failures("7.5", _module(copy_on_write=shipped)))
    assert set(failures) == set(SHIPPED_7_5), failures
    for name, words in SHIPPED_7_5.items():
        assert isinstance(failures[name], AssertionError) and words in str(failures[name]), (name, failures[name])
        assert "release" not in str(failures[name]), failures[name]


@pytest.mark.parametrize("name, over, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(name, over, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    failures = check_failures(name, _module(**over))
    assert failures, f"{name} passed a wrong implementation"
    ((_, err),) = failures
    assert isinstance(err, AssertionError), err
    assert words in str(err), str(err)


# ---------------------------------------------------------------------------------------------
# Exact on the tiny model: every request of a trace, as it is decoded alone with notebook 04's cache


@pytest.fixture(scope="module")
def tiny():
    from kvlib.core.weights import load_tiny

    return load_tiny()


def _alone(model, trace):
    from kvlib.kv_cache import generate_cached  # notebook 04, reference mode (tests/conftest.py)

    return [generate_cached(model, torch.tensor([p]), n)[0, len(p) :].tolist() for p, n in trace]


@pytest.mark.parametrize("case", ["roomy", "preempting", "shared-prefix"])
def test_scheduler_is_exact_on_a_32_request_trace(tiny, case):
    """Check that 32 requests of different prompt and output lengths, served together, get exactly their tokens alone."""
    from kvlib.measure.bench_serve import SYSTEM_PROMPT, make_trace

    model, tokenizer = tiny
    trace = make_trace(
        tokenizer, 32, seed=1, system_prompt=SYSTEM_PROMPT if case == "shared-prefix" else "", max_new=(2, 48)
    )
    assert len({len(p) for p, _ in trace}) > 10 and len({n for _, n in trace}) > 10, (
        "the trace should vary prompt and output lengths"
    )
    n_blocks = {"roomy": 256, "preempting": 24, "shared-prefix": 64}[case]
    pool = serving.BlockPool(model.config, n_blocks, 16)
    sched = serving.Scheduler(model, pool, max_batch=16, share_prefixes=case == "shared-prefix")
    for i, (p, n) in enumerate(trace):
        sched.add(serving.Request(i, list(p), n))
    cow = []
    if case == "shared-prefix":
        original = sched.copy_on_write
        sched.copy_on_write = lambda *a: cow.append(a[2]) or original(*a)
    sched.run()
    got = {r.id: r.out for r in sched.finished}
    assert [got[i] for i in range(len(trace))] == _alone(model, trace)
    assert pool.n_free == pool.n_blocks
    if case == "preempting":
        assert sched.stats["preemptions"] > 0, "24 blocks should force preemptions"
    if case == "shared-prefix":
        assert sched.stats["prefill_skipped"] >= 31 * 64, (
            sched.stats
        )  # every later request skips the system prompt's 4 whole blocks


def test_copy_on_write_runs_when_a_whole_prompt_is_shared(tiny):
    """Check that a prompt identical to a running one (whole blocks) shares every block, then copies the last before writing."""
    model, tokenizer = tiny
    prompt = tokenizer.encode("Q: What is the capital of France?\nA: Paris\nQ: What is the")[:32]
    assert len(prompt) == 32
    pool = serving.BlockPool(model.config, 16, 16)
    sched = serving.Scheduler(model, pool, max_batch=4, share_prefixes=True)
    copies = []
    original = sched.copy_on_write
    sched.copy_on_write = lambda *a: copies.append(a[2]) or original(*a)
    for i in range(2):
        sched.add(serving.Request(i, list(prompt), 6))
    sched.run()
    assert copies == [1], copies
    assert sched.finished[0].out == sched.finished[1].out == _alone(model, [(prompt, 6)])[0]


def test_iteration_level_arm_and_inter_token_gaps(tiny):
    """Check the arms bench serve compares, on 8 short requests: iteration-level batching never runs more than
    contiguous reservation allows and never preempts, every arm gets the same tokens, static takes at least as many
    steps, and each request's gaps between tokens number one less than its tokens."""
    from kvlib.measure import bench_serve

    model, tokenizer = tiny
    trace = bench_serve.make_trace(tokenizer, 8, seed=2, max_new=(2, 12))
    budget = 32  # blocks of 16: 512 slots, one contiguous reservation of max_seq_len = 512
    running = []
    original = bench_serve.serve_continuous

    def watching(*args, **kwargs):
        return original(*args, **kwargs, on_step=lambda s: running.append(len(s.running)))

    bench_serve.serve_continuous = watching
    try:
        iteration = bench_serve.serve_iteration_level(model, trace, budget)
    finally:
        bench_serve.serve_continuous = original
    static = bench_serve.serve_static(model, trace, budget)
    paged = bench_serve.serve_continuous(model, trace, budget, keep_tokens=True)
    assert iteration["batch"] == 1 and max(running) == 1 and iteration["preemptions"] == 0
    assert (
        static["generated_tokens"]
        == iteration["generated_tokens"]
        == paged["generated_tokens"]
        == sum(n for _, n in trace)
    )
    assert paged["tokens"] == {i: out for i, out in enumerate(_alone(model, trace))}
    assert static["steps"] >= iteration["steps"] >= paged["steps"]
    assert paged["recomputed_tokens"] == 0 and paged["steps_with_prefill"] >= 1
    for r in (static, iteration, paged):
        assert r["itl_p50_s"] <= r["itl_p99_s"]
        assert 0 < r["tpot_mean_s"] < r["seconds"]  # TPOT: each request's mean gap, averaged over the requests


def test_serve_rounds_interleaves_the_ways_and_pairs_their_rounds(tiny):
    """Check that serve_rounds runs every way once per round, in the given order within each round, that the
    deterministic counts repeat round after round, and that paired ratios are taken round by round."""
    from kvlib.measure import bench_serve

    model, tokenizer = tiny
    trace, order = bench_serve.make_trace(tokenizer, 4, seed=3, max_new=(2, 6)), []

    def way(name, fn):
        return lambda m, t: order.append(name) or fn(m, t)

    ways = {n: way(n, fn) for n, fn in bench_serve.equal_memory_ways(n_blocks=64).items()}
    runs = bench_serve.serve_rounds(model, trace, ways, rounds=3)
    assert order == list(ways) * 3 and all(len(rs) == 3 for rs in runs.values())
    for rs in runs.values():
        assert len({(r["steps"], r["generated_tokens"], r["kv_utilisation"]) for r in rs}) == 1
    ratios = bench_serve.paired(runs, "continuous, paged", "static, reserved")
    assert ratios == [
        a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["continuous, paged"], runs["static, reserved"])
    ]
    assert "medians of 3 rounds" in bench_serve.format_rounds(runs)
    with pytest.raises(ValueError, match="rounds must be a positive int"):
        bench_serve.serve_rounds(model, trace, ways, rounds=0)


# ---------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_names_the_problem(tiny):
    """Check that a block size not a power of two, a request longer than the pool, and a freed block used again fail clearly."""
    model, _ = tiny
    with pytest.raises(ValueError, match="power of two"):
        serving.BlockPool(CONFIG, 8, 12)
    with pytest.raises(ValueError, match="n_blocks must be a positive"):
        serving.BlockPool(CONFIG, 0, 4)
    sched = serving.Scheduler(model, serving.BlockPool(model.config, 4, 16))
    with pytest.raises(ValueError, match="more than the pool's 4"):
        sched.add(serving.Request(0, [1] * 60, 20))
    pool = serving.BlockPool(CONFIG, 4, 4)
    b = pool.allocate(1)[0]
    pool.release(b)
    with pytest.raises(ValueError, match="already free"):
        pool.release(b)
    with pytest.raises(ValueError, match="not in use"):
        pool.share(b)
    with pytest.raises(ValueError, match=r"block must be an int in \[0, 4\)"):
        pool.release(9)
    with pytest.raises(serving.OutOfBlocks, match="5 blocks wanted, 4 of 4 free"):
        pool.allocate(5)
    with pytest.raises(ValueError, match="one block table per row"):
        serving.paged_attention(torch.zeros(2, CONFIG.n_heads, 1, CONFIG.head_dim), pool, 0, [])
    with pytest.raises(ValueError, match="every length must be a positive integer"):
        serving.block_utilisation([3, 0], 4)
    sched = serving.Scheduler(model, serving.BlockPool(model.config, 8, 16))
    sched.add(serving.Request(0, [1, 2, 3], 2))
    sched.admit(sched.waiting[0])
    with pytest.raises(ValueError, match="request 0 is admitted twice: it is already running and is still first"):
        sched.admit(sched.waiting[0])


# ---------------------------------------------------------------------------------------------
# The benchmark (no assertion on time: only on what the trace and the memory accounting fix)


SHOWN = {}  # what the module fixture's run showed on stderr, a terminal


@pytest.fixture(scope="module")
def quick_serve_report():
    """One `kvlib bench serve --json --quick` run, in this process (its record as the JSON it prints)."""
    from kvlib.measure import bench_serve

    with on_a_terminal() as err:
        report = bench_serve.bench_serve(quick=True)
    SHOWN["serve"] = err.getvalue()
    return json.loads(json.dumps(report))


@pytest.mark.slow
def test_bench_serve_shows_the_requests_served_on_a_terminal(quick_serve_report):
    """Check that `kvlib bench serve` shows one progress bar, counting the requests its runs have served."""
    assert shown_progress(SHOWN["serve"], "kvlib bench serve")
    assert re.search(r"\d+/\d+ \[[^\]]*request", SHOWN["serve"])


@pytest.mark.slow
def test_bench_serve_reports_every_measure(quick_serve_report):
    """Check that `kvlib bench serve --json --quick` reports both batchings, prefix sharing and step times, at one budget."""
    r = quick_serve_report
    assert r["trace"]["requests"] == 32
    for way in ("static", "iteration_level", "continuous"):
        assert r[way]["requests"] == 32 and r[way]["generated_tokens"] == r["static"]["generated_tokens"]
        assert r[way]["ttft_p50_s"] <= r[way]["ttft_p99_s"] and r[way]["itl_p50_s"] <= r[way]["itl_p99_s"]
    assert r["static"]["steps"] >= r["iteration_level"]["steps"] >= r["continuous"]["steps"]  # steps, not time
    assert r["iteration_level"]["preemptions"] == 0 and r["iteration_level"]["batch"] == r["static"]["batch"]
    assert (
        r["continuous"]["kv_utilisation"] >= 0.9 and r["static"]["kv_utilisation"] <= 0.4
    )  # token accounting, not time
    p = r["prefix"]
    assert p["shared"]["prefill_skipped"] > 0 and p["shared"]["prefill_tokens"] < p["unshared"]["prefill_tokens"]
    assert p["shared"]["blocks_per_running_request"] < p["unshared"]["blocks_per_running_request"]
    assert p["n_blocks"] == 96 and p["unshared"]["peak_blocks_held"] == 96  # blocks bind where sharing is measured
    assert [s["batch"] for s in r["decode_steps"]] == [1, 4, 16, 32]


# ---------------------------------------------------------------------------------------------
# kvlib's own pool, used as 7.6's answer: refused while 7.6 is checked (kvlib.course.exercises.READY_MADE)


def test_a_pool_made_and_counted_fails_7_6_naming_it():
    """Check that 7.6 answered by the notebook's own measurement (a BlockPool made, its held blocks counted) fails the
    exercise's checks, each failure naming the pool it made."""
    failures = check_failures("7.6", _module(block_utilisation=_utilisation_by_tables))
    assert failures and all("made a block pool" in str(err) for _, err in failures), failures


# the checks' yardstick, used as 7.3's answer: refused while 7.3 is checked (kvlib.course.exercises.READY_MADE)


def _paged_by_yardstick(q, pool, layer, tables):
    from kvlib.checks.serving import laid_out_attention

    return laid_out_attention(q, pool.k[layer], pool.v[layer], tables)


def _paged_by_yardsticks_gather(q, pool, layer, tables):
    from kvlib.gqa import grouped_attention

    rows = []
    for i, t in enumerate(tables):
        k, v = laid_out(pool.k[layer], t.blocks, t.length), laid_out(pool.v[layer], t.blocks, t.length)
        rows.append(grouped_attention(q[i : i + 1], k[None], v[None]))
    return torch.cat(rows)


@pytest.mark.parametrize(
    ("shortcut", "words"),
    [(_paged_by_yardstick, "laid_out_attention"), (_paged_by_yardsticks_gather, "(laid_out)")],
    ids=["attention", "gather"],
)
def test_the_checks_yardstick_fails_7_3_naming_it(shortcut, words):
    """Check that 7.3 answered by the checks' yardstick (kvlib.checks.serving.laid_out_attention, or its gather
    laid_out) fails every check of the exercise run locally, each failure naming it; the same code passes with it
    open. (Graded, the child cannot import kvlib.checks at all.)"""
    failures = check_failures("7.3", _module(paged_attention=shortcut))
    assert len(failures) == len(checks_for(BY_ID["7.3"])), failures
    assert all(words in str(err) for _, err in failures), failures
    for check in checks_for(BY_ID["7.3"]):
        check.fn(_module(paged_attention=shortcut), np.random.default_rng(0))  # open: the yardstick is right


def test_a_ready_made_target_in_the_checks_is_skipped_where_the_checks_cannot_be_imported(monkeypatch):
    """Check that close_ready_made skips 7.3's yardstick (kvlib.checks.serving) in a process without kvlib.checks, as
    the grader's child is (kvlib.grading.sandbox.NOT_IN_THE_CHILD), closing the rest; a missing module outside the
    checks is still an error."""
    import importlib

    from kvlib.course import exercises

    real = importlib.import_module

    def without_checks(name, *args):
        if name.startswith("kvlib.checks"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args)

    monkeypatch.setattr(exercises.importlib, "import_module", without_checks)
    entries = [*exercises.ready_made("serving.paged_attention"), ["kvlib.core.paging:Engine.decode", "closed"]]
    assert [e for e in entries if e[0].startswith("kvlib.checks.serving:")], entries
    reopen = exercises.close_ready_made(entries)
    try:
        with pytest.raises(RuntimeError, match="closed"):
            Engine.decode(None)
    finally:
        reopen()
    with pytest.raises(ModuleNotFoundError):
        exercises.close_ready_made([["kvlib.no_such_module:f", "closed"]])
