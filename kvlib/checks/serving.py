"""Checks for notebook 07 (kvlib/serving.py): exercises 7.1-7.7 (07a: 7.1-7.3, 7.6; 07b: 7.4, 7.7; 07c: 7.5).

Expectations come first, from kvlib's own model and plain attention (never the code under test):
greedy tokens by full recompute, attention over each sequence's keys laid out contiguously. The
slips named: a block freed while another table holds it, a block released twice, a block per
token, a table half-grown when the pool runs out, padding to the longest row, blocks read in
sorted order, no preemption, a preemption the decode did not need or one too few, a victim other than
victim() names, a copy that forgets the contents, never happens or leaves a block counted by a table
that let it go (the leak 7.5 ships with), a policy that misses its budget or
leaves its memory cap.
The texts a message is built from (what a slip is called, which table) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import functools
import math
import numbers

import torch
import torch.nn.functional as F

from kvlib.checks import check
from kvlib.checks.kv_cache import drift_weights
from kvlib.checks.speculative import CheckCache
from kvlib.core.model import Decoder, ModelConfig
from kvlib.core.weights import load_tiny
from kvlib.course.i18n import tr
from kvlib.measure.bench_serve import BUDGET, budget_trace, serve_by_steps

CONFIG = ModelConfig(vocab_size=31, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=40, max_seq_len=96)


def laid_out(k_layer: torch.Tensor, blocks: list[int], length: int) -> torch.Tensor:
    """The first length tokens of one layer's pool tensor k_layer (n_blocks, H_kv, block_size, D) through a block
    table's blocks, laid out in one piece: (H_kv, length, D)."""
    return torch.cat([k_layer[b] for b in blocks], dim=1)[:, :length]


def laid_out_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, tables: list) -> torch.Tensor:
    """What 7.3's paged_attention is checked against (the checks' yardstick): each row's causal attention over its own
    keys and values of one layer's pool tensors (pool.k[layer], pool.v[layer]), first copied out into one piece. Here,
    with the checks, since the grader's child cannot import them (kvlib.grading.sandbox.NOT_IN_THE_CHILD); refused
    while 7.3 is checked locally too (kvlib.course.exercises.READY_MADE), as laid_out is."""
    rows = []
    for i, t in enumerate(tables):
        k, v = laid_out(k_layer, t.blocks, t.length)[None], laid_out(v_layer, t.blocks, t.length)[None]
        T, n = q.shape[2], t.length
        mask = torch.ones(T, n, dtype=torch.bool).tril(n - T)
        rows.append(F.scaled_dot_product_attention(q[i : i + 1], k, v, attn_mask=mask, enable_gqa=True))
    return torch.cat(rows)


def _model(seed: int = 0, sharp: float = 1.0) -> Decoder:
    """The check's random model. sharp > 1 scales the query, key and value weights: attention then picks out single
    tokens, so a token whose keys and values were overwritten changes the tokens that follow (at 1, this small random
    model's greedy tokens hang mostly on the last token, whatever came before)."""
    torch.manual_seed(seed)
    model = Decoder(CONFIG).eval()
    if sharp != 1.0:
        with torch.no_grad():
            for layer in model.layers:
                for w in (layer.attn.q_proj.weight, layer.attn.k_proj.weight, layer.attn.v_proj.weight):
                    w.mul_(sharp)
    return model


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    """The expected tokens: greedy decoding by full recompute, one request alone."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].tolist()


# ---------------------------------------------------------------------------------------------
# 7.1 BlockPool.release


@check("7.1")
def release_returns_the_block(sv, rng):
    """Check that a released block goes back on the free list and is handed out again."""
    pool = sv.BlockPool(CONFIG, 4, 4)
    a, b = pool.allocate(2)
    pool.release(a)
    assert pool.refs[a] == 0, f"after its only release block {a} should have no reference, refs[{a}] = {pool.refs[a]}"
    assert pool.n_free == 3 and a in pool.free, (
        f"release should put block {a} back on the free list: free = {pool.free}"
    )
    assert a in pool.allocate(3), "a released block should be handed out again"


@check("7.1")
def release_counts_references(sv, rng):
    """Check that a block two tables share stays in use until both have released it."""
    pool = sv.BlockPool(CONFIG, 3, 4)
    b = pool.allocate(1)[0]
    pool.share(b)
    pool.release(b)
    assert b not in pool.free and pool.refs[b] == 1, (
        f"block {b}, which two tables hold, was on the free list or counted {pool.refs[b]} after one release: the "
        "other table still reads it, and the next allocate could hand it to another sequence's tokens"
    )
    pool.release(b)
    assert b in pool.free and pool.refs[b] == 0, "the last release should free the block"


@check("7.1")
def release_twice_is_an_error(sv, rng):
    """Check that releasing a free block raises ValueError, and the free list never holds a block twice."""
    pool = sv.BlockPool(CONFIG, 3, 4)
    b = pool.allocate(1)[0]
    pool.release(b)
    try:
        pool.release(b)
    except ValueError:
        pass
    else:
        raise AssertionError(
            "releasing a free block must raise ValueError: on the free list twice, it would be handed to two sequences"
        )
    assert sorted(pool.free) == [0, 1, 2], f"the free list should hold each block once, got {pool.free}"


# ---------------------------------------------------------------------------------------------
# 7.2 BlockTable.append


@check("7.2")
def append_allocates_at_block_boundaries(sv, rng):
    """Check that appending one token at a time takes a new block only when the last one is full."""
    pool, table = sv.BlockPool(CONFIG, 16, 4), sv.BlockTable(4)
    counts, slots = [], []
    for _ in range(9):
        slots += table.append(pool, 1)
        counts.append(len(table.blocks))
    assert counts == [1, 1, 1, 1, 2, 2, 2, 2, 3], (
        f"blocks held after each of 9 tokens (block_size 4) should be [1, 1, 1, 1, 2, 2, 2, 2, 3], got {counts}"
        + (": a block per token" if counts[1] > 1 else "")
    )
    assert table.length == 9, f"the table should count 9 tokens, got length {table.length}"
    expected = [table.blocks[p // 4] * 4 + p % 4 for p in range(9)]
    assert slots == expected, f"slots of positions 0..8, one at a time, should be {expected}, got {slots}"


@check("7.2")
def append_many_tokens_at_once(sv, rng):
    """Check that a prompt of 6 then 3 more tokens fill blocks in order, tables interleaved in one pool."""
    pool = sv.BlockPool(CONFIG, 8, 4)
    a, b = sv.BlockTable(4), sv.BlockTable(4)
    first = a.append(pool, 6)
    b.append(pool, 1)
    more = a.append(pool, 3)
    assert len(a.blocks) == 3 and a.length == 9, (
        f"9 tokens need 3 blocks of 4: got {len(a.blocks)} blocks, length {a.length}"
    )
    slots = first + more
    expected = [a.blocks[p // 4] * 4 + p % 4 for p in range(9)]
    assert slots == expected, f"slots of positions 0..8 should be {expected}, got {slots}"
    assert not set(a.blocks) & set(b.blocks), "two tables were given the same block"


@check("7.2")
def append_leaves_the_table_alone_when_blocks_run_out(sv, rng):
    """Check that append raises OutOfBlocks when the pool is short, with table and pool as they were."""
    pool, table = sv.BlockPool(CONFIG, 2, 4), sv.BlockTable(4)
    table.append(pool, 3)
    before = (list(table.blocks), table.length, pool.n_free)
    try:
        table.append(pool, 9)  # needs 3 blocks in all, 2 more, and only 1 is free
    except sv.OutOfBlocks:
        pass
    else:
        raise AssertionError("12 tokens in a pool of 2 blocks of 4 should raise OutOfBlocks (pool.allocate raises it)")
    after = (list(table.blocks), table.length, pool.n_free)
    changed = [
        what
        for what, moved in (
            (tr("the table holds blocks for tokens it never got"), after[0] != before[0]),
            (tr("its length counts tokens that got no slot"), after[1] != before[1]),
            (tr("the pool lost free blocks that no token uses"), after[2] != before[2]),
        )
        if moved
    ]
    assert after == before, (
        f"a failed append must change nothing (blocks, length, free): {before} became {after}: {'; '.join(changed)}"
    )


# ---------------------------------------------------------------------------------------------
# 7.6 block_utilisation: a prediction, graded against the blocks BlockTable.append takes


def _utilisation_slips(lengths: list[int], bs: int) -> dict[str, float]:
    tokens, n = sum(lengths), len(lengths)
    whole = sum(-(-x // bs) * bs for x in lengths)
    floor = sum(x // bs * bs for x in lengths)
    return {
        tr("a sequence holds its tokens in whole blocks: round each length up to a block, not down"): (
            tokens / floor if floor else float("inf")
        ),
        tr(
            "a sequence holds its tokens in whole blocks: round each length up to a block, not down (a short "
            "sequence's one block included)"
        ): tokens / sum(max(1, x // bs) * bs for x in lengths),
        tr(
            "the sequences are pooled into one run of blocks: each sequence has blocks of its own, each with its own "
            "part-empty last block"
        ): tokens / (-(-tokens // bs) * bs),
        tr("a share is between 0 and 1, not a percentage"): 100 * tokens / whole,
        tr(
            "a block too many where a length fills its blocks exactly: a sequence of a whole number of blocks has no "
            "empty slot"
        ): tokens / sum((x // bs + 1) * bs for x in lengths),
        tr("count the tokens the sequences hold, not one more each"): tokens
        / sum(-(-(x + 1) // bs) * bs for x in lengths),
        tr(
            "half a block of waste per sequence is an average over many lengths: count each sequence's own last block"
        ): tokens / (tokens + n * (bs - 1) / 2),
        tr("upside down: tokens held / slots held"): whole / tokens,
    }


@check("7.6")
def block_utilisation_counts_each_last_block(kv, rng):
    """Check the predicted share of held slots that hold a token, for lengths that fill their blocks, fall short and
    fit in one block, at block sizes 1 to 512 (a block of max_seq_len is notebook 04's reservation)."""
    cases = [
        ([9, 4, 1, 1], 4),  # every slip below gives another share here: each is named
        ([16, 32, 48], 16),
        ([1, 2, 3], 1),
        ([int(x) for x in rng.integers(1, 300, size=9)], 16),
        ([int(x) for x in rng.integers(1, 300, size=7)] + [64], 64),
        ([int(x) for x in rng.integers(1, 200, size=5)], 512),
    ]
    for lengths, bs in cases:
        expected = sum(lengths) / sum(-(-x // bs) * bs for x in lengths)
        got = kv.block_utilisation(list(lengths), bs)
        assert isinstance(got, numbers.Real) and not isinstance(got, bool), (
            f"block_utilisation should return a share, a float, got {type(got).__name__}"
        )
        if math.isclose(got, expected, rel_tol=1e-9):
            continue
        slip = next((m for m, v in _utilisation_slips(lengths, bs).items() if math.isclose(got, v, rel_tol=1e-9)), None)
        raise AssertionError(
            f"lengths {lengths}, blocks of {bs}: expected {expected:.4f}, got {got:.4f}" + (f": {slip}" if slip else "")
        )


# ---------------------------------------------------------------------------------------------
# 7.3 paged_attention


def _random_kv(rng, n_blocks: int, block_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V for a pool, kept by the check: the pool gets clones, assigned (in the isolated
    grader pool.k reads a copy of the child's, so changing it in place would change nothing there)."""
    shape = (CONFIG.n_layers, n_blocks, CONFIG.n_kv_heads, block_size, CONFIG.head_dim)
    return tuple(torch.randn(shape, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))) for _ in "kv")


def _paged_case(sv, rng, lengths, T=1, block_size=4):
    """A pool with random K/V, tables over shuffled blocks; the expected attention, computed contiguously."""
    pool = sv.BlockPool(CONFIG, 16, block_size)
    K, V = _random_kv(rng, 16, block_size)
    pool.k, pool.v = K.clone(), V.clone()
    order = [int(b) for b in rng.permutation(16)]
    tables = []
    q = torch.from_numpy(rng.normal(size=(len(lengths), CONFIG.n_heads, T, CONFIG.head_dim))).float()
    for n in lengths:
        table = sv.BlockTable(block_size)
        table.blocks, table.length = [order.pop() for _ in range(-(-n // block_size))], n
        tables.append(table)
    return pool, tables, q, laid_out_attention(q, K[1], V[1], tables)  # from the check's own K, V


@check("7.3")
def paged_attention_matches_contiguous(sv, rng):
    """Check one decode step for 3 sequences of 5, 11 and 2 tokens against attention over each one's own keys."""
    pool, tables, q, expected = _paged_case(sv, rng, [5, 11, 2])
    out = sv.paged_attention(q, pool, 1, tables)
    assert isinstance(out, torch.Tensor) and out.shape == expected.shape, (
        f"expected shape {tuple(expected.shape)}, got {getattr(out, 'shape', out)}"
    )
    if torch.allclose(out, expected, atol=1e-5):
        return
    for i, t in enumerate(tables):
        if not torch.allclose(out[i], expected[i], atol=1e-5):
            if t.length % pool.block_size:
                n = len(t.blocks) * pool.block_size
                k, v = laid_out(pool.k[1], t.blocks, n)[None], laid_out(pool.v[1], t.blocks, n)[None]
                whole = F.scaled_dot_product_attention(q[i : i + 1], k, v, enable_gqa=True)
                if torch.allclose(out[i], whole[0], atol=1e-5):
                    raise AssertionError(
                        f"row {i} read all of its last block: only table.length = {t.length} slots hold its tokens"
                    )
            raise AssertionError(
                f"row {i} ({t.length} tokens in blocks {t.blocks}) differs from attention over its own keys, "
                "read in table order (not sorted, not padded to the longest row)"
            )


@check("7.3")
def paged_attention_prefill_is_causal(sv, rng):
    """Check 3 new queries of one sequence of 7 tokens (a prefill chunk): causal, aligned to the last 3 positions."""
    pool, tables, q, expected = _paged_case(sv, rng, [7], T=3)
    out = sv.paged_attention(q, pool, 1, tables)
    assert torch.allclose(out, expected, atol=1e-5), (
        "3 new queries of 7 tokens should attend causally: query t to keys 0 .. 4 + t"
    )


# ---------------------------------------------------------------------------------------------
# 7.4 Scheduler.step


def _trace(rng, n=10):
    return [
        ([int(t) for t in rng.integers(0, CONFIG.vocab_size, size=int(rng.integers(2, 14)))], int(rng.integers(1, 16)))
        for _ in range(n)
    ]


def _step(sv, sched):
    """sched.step(), the engine's refusals named as a check's failure; their text, kvlib.core's (the bottom floor,
    which imports no translation), is quoted as the failure's cause."""
    try:
        sched.step()
    except sv.OutOfBlocks as err:
        if str(err).startswith("admitting"):  # the engine's admit names itself (kvlib.core.paging)
            raise AssertionError(
                f"the pool ran out of blocks inside step ({err}): a request was admitted with fewer free blocks than "
                "admitting it takes"
            ) from err
        raise AssertionError(
            f"the pool ran out of blocks inside step ({err}): a decode ran with fewer free blocks than it takes"
        ) from err
    except ValueError as err:  # the engine refusing a misuse (a request admitted twice): its message names it
        raise AssertionError(f"step() made the engine refuse: {err}") from err


def _serve(sv, model, trace, n_blocks, max_batch=4, share=False):
    pool = sv.BlockPool(CONFIG, n_blocks, 4)
    sched = sv.Scheduler(model, pool, max_batch=max_batch, share_prefixes=share)
    for i, (p, n) in enumerate(trace):
        sched.add(sv.Request(i, list(p), n))
    for _ in range(500):
        if not (sched.waiting or sched.running):
            return sched, pool
        _step(sv, sched)
    raise AssertionError(
        "500 steps did not finish 10 short requests: are finished requests retired, and waiting ones admitted?"
    )


def _drifting_tokens(model, prompt: list[int], steps: int, seed: int, scale: float) -> list[int]:
    """The tokens one request gets from `steps` scheduler steps when the model's key and value weights drift
    (kvlib.checks.kv_cache.drift_weights) between steps: each token's keys and values are computed once, with
    the weights of the step that fed it, and kept (step 1 prefills the prompt and decodes its first token)."""
    keys, values, pos = [None] * CONFIG.n_layers, [None] * CONFIG.n_layers, 0

    def feed(tokens: list[int]) -> int:
        nonlocal pos
        x, T = model.embed(torch.tensor([tokens])), len(tokens)
        cos, sin = model.rope_cos[pos : pos + T], model.rope_sin[pos : pos + T]
        for j, layer in enumerate(model.layers):
            h = layer.attn_norm(x)
            q = layer.attn.project_q(h, cos, sin)
            k, v = layer.attn.project_kv(h, cos, sin)
            keys[j] = k if keys[j] is None else torch.cat([keys[j], k], 2)
            values[j] = v if values[j] is None else torch.cat([values[j], v], 2)
            x = x + layer.attn.o_proj(layer.attn.attend(q, keys[j], values[j]).transpose(1, 2).reshape(1, T, -1))
            x = x + layer.mlp(layer.mlp_norm(x))
        pos += T
        return int(model.lm_head(model.norm(x))[0, -1].argmax())

    with torch.inference_mode():
        out = [feed(prompt)]
        out.append(feed(out[-1:]))
        for step in range(1, steps):
            drift_weights(model, seed, step, scale)
            out.append(feed(out[-1:]))
    return out


def _assert_step_reads_the_cache(sv, rng) -> None:
    """A step's tokens must follow the paged cache: between steps the scheduler gets a model whose key and value
    weights drifted (sched.model = ...), so a decode that reads the cached keys and values of earlier tokens gives
    other tokens than one that recomputes them from the whole sequence with the new weights."""
    seed, steps = int(rng.integers(1 << 20)), 8
    prompt = [int(t) for t in rng.integers(0, CONFIG.vocab_size, size=5)]
    expected = _drifting_tokens(_model(seed % 1000), prompt, steps, seed, 0.2)
    model = _model(seed % 1000)
    sched = sv.Scheduler(model, sv.BlockPool(CONFIG, 16, 4), max_batch=2)
    sched.add(sv.Request(0, list(prompt), steps + 1))
    for step in range(steps):
        if step:
            drift_weights(model, seed, step, 0.2)
            sched.model = model  # the scheduler's own model, in the isolated child too
        _step(sv, sched)
    got = next((r.out for r in sched.finished if r.id == 0), None)
    assert got == expected, (
        "with a model whose key and value weights change between steps, a request's tokens should follow the keys "
        f"and values its blocks hold from earlier steps: expected {expected}, got {got}. The step recomputes "
        "earlier tokens instead of reading them from the paged cache (decode() reads it)"
    )


@check("7.4")
def step_serves_every_request_exactly(sv, rng):
    """Check that 10 requests through the scheduler get the greedy tokens each gets alone, and every block comes back."""
    model, trace = _model(int(rng.integers(1000))), _trace(rng)
    expected = [_greedy(model, p, n) for p, n in trace]
    _assert_step_reads_the_cache(sv, rng)  # after the trace is drawn: the trace stays the one slips are tested on
    sched, pool = _serve(sv, model, trace, n_blocks=32)
    got = {r.id: r.out for r in sched.finished}
    assert len(got) == len(trace), f"{len(trace)} requests went in, {len(got)} finished"
    for i, want in enumerate(expected):
        if len(got[i]) > len(want) and got[i][: len(want)] == want:
            raise AssertionError(
                f"request {i} asked for {len(want)} token(s) and got {len(got[i])}: it was done right after its "
                "prefill (admit gives its first token), and a decode still ran it"
            )
        assert got[i] == want, f"request {i} got {got[i]}, alone it gets {want}"
    assert pool.n_free == pool.n_blocks, (
        f"every block should be free at the end, {pool.n_blocks - pool.n_free} are still held: a finished request "
        "kept its blocks"
    )


@check("7.4")
def step_admits_while_blocks_and_batch_allow(sv, rng):
    """Check the first step: first come first served, at most max_batch running, only as many as blocks allow."""
    _assert_step_reads_the_cache(sv, rng)
    model = _model(1)
    pool = sv.BlockPool(CONFIG, 6, 4)
    sched = sv.Scheduler(model, pool, max_batch=3)
    for i, n in enumerate((5, 5, 9, 2, 2)):  # prompts of n tokens; 5 tokens + the next: 2 blocks
        sched.add(sv.Request(i, [1] * n, 3))
    _step(sv, sched)
    ids = [r.id for r in sched.running]
    assert ids == [0, 1], (
        f"after one step requests [0, 1] should run (request 2 needs 3 more blocks, 2 are left; "
        f"first come, first served: 3 and 4 wait behind it), got {ids}"
    )
    sched = sv.Scheduler(model, sv.BlockPool(CONFIG, 64, 4), max_batch=3)
    for i in range(5):
        sched.add(sv.Request(i, [2, 3], 3))
    _step(sv, sched)
    assert [r.id for r in sched.running] == [0, 1, 2], (
        f"max_batch=3 should admit requests 0, 1, 2, got {[r.id for r in sched.running]}"
    )
    # the edges: exactly enough free blocks admits; a request done after its prefill retires in that step
    pool = sv.BlockPool(CONFIG, 2, 4)
    sched = sv.Scheduler(model, pool, max_batch=3)
    sched.add(sv.Request(0, [1] * 7, 1))  # 7 tokens + the next one: 2 blocks, and 2 are free
    assert sched.blocks_to_admit(sched.waiting[0]) == pool.n_free == 2
    _step(sv, sched)
    assert not sched.waiting, (
        "a request that needs exactly the free blocks (2 of 2) should be admitted: it fits, so compare "
        "blocks_to_admit(request) <= pool.n_free, not <"
    )
    assert [r.id for r in sched.finished] == [0] and not sched.running, (
        "a request with max_new_tokens=1 is done after its prefill (admit gives its first token): retire it in "
        f"the same step, before any decode; running {[r.id for r in sched.running]}, finished {[r.id for r in sched.finished]}"
    )


def _written(r) -> int:
    """Tokens a running request has written to its blocks: its prompt and all it made but the last (not fed yet)."""
    return len(r.prompt) + len(r.out) - 1


def _step_checking_preemption(sv, sched, pool, bs=4):
    """One step, with nobody waiting, held to the preemption invariants whatever the victim policy: the first
    preempted is the request victim() named before the step, each preemption happened while the decode was short
    of blocks, the decode then had its blocks, and every request left running made one token. Returns the ids
    preempted, in order. (No prefix sharing: a running request holds ceil(written / bs) blocks.)"""
    written = {r.id: _written(r) for r in sched.running}  # numbers now: in the kernel these Requests live on
    free, before = pool.n_free, {r.id: len(r.out) for r in sched.running}
    named = sched.victim().id if written else None
    preemptions = sched.stats["preemptions"]
    _step(sv, sched)
    k = sched.stats["preemptions"] - preemptions
    order = [r.id for r in list(sched.waiting)[:k]][::-1]  # preempt() puts each first in line
    if not k:
        return order
    assert order[0] == named, (
        f"the step preempted request {order[0]} first, while self.victim() named request {named}: preempt the "
        "request your victim() policy names, so that the policy you choose is the one that runs"
    )
    left = dict(written)
    for n, rid in enumerate(order):
        need = sum(w % bs == 0 for w in left.values())
        assert need > free, (
            f"preemption {n + 1} of the step (request {rid}) came when the decode needed {need} block(s) and "
            f"{free} were free: that is enough, preempt only while blocks_to_decode() > pool.n_free (one more than "
            "needed throws away work that must be recomputed)"
        )
        free += -(-left.pop(rid) // bs)
    need = sum(w % bs == 0 for w in left.values())
    assert need <= free, (
        f"after {k} preemption(s) the decode still needed {need} block(s) with {free} free: another request must go "
        "too; keep preempting (victim() again) while blocks_to_decode() > pool.n_free, in the same step"
    )
    made = {r.id: len(r.out) - before[r.id] for r in sched.running if r.id in before}
    assert all(v == 1 for v in made.values()), (
        f"after the preemptions the step should decode every request left running once: tokens made {made}"
    )
    return order


@check("7.4")
def step_preempts_the_newest_and_stays_exact(sv, rng):
    """Check preemption under any victim policy: only while the decode is short, as many as needed, the request
    victim() names first, and every request still exact after recompute."""
    _assert_step_reads_the_cache(sv, rng)
    model = _model(2)
    trace = [([1, 2, 3], 14), ([4, 5, 6], 14), ([7, 8, 9], 14)]
    expected = [_greedy(model, p, n) for p, n in trace]
    pool = sv.BlockPool(CONFIG, 10, 4)  # 3 x 17 tokens need 15 blocks: someone must wait
    sched = sv.Scheduler(model, pool, max_batch=3)
    for i, (p, n) in enumerate(trace):
        sched.add(sv.Request(i, list(p), n))
    _step(sv, sched)  # all three admitted: 1 block each
    for _ in range(200):
        if not (sched.waiting or sched.running):
            break
        if sched.waiting or sched.stats["preemptions"]:
            _step(sv, sched)
        else:
            _step_checking_preemption(sv, sched, pool)
    assert sched.stats["preemptions"] > 0, (
        "3 requests of 17 tokens in 10 blocks of 4 should force a preemption (call self.preempt)"
    )
    got = {r.id: r.out for r in sched.finished}
    for i, want in enumerate(expected):
        assert got.get(i) == want, f"after preemption request {i} got {got.get(i)}, alone it gets {want}"
    _preemption_edges(sv, model)
    # exactly enough blocks: all three admitted (2 + 2 + 1 of 5), nothing preempted; the next step needs 3 new
    # blocks with none free: one or two preemptions, as the victims' blocks allow
    trace = [([1] * 7, 12), ([2] * 7, 12), ([3] * 3, 12)]
    expected = [_greedy(model, p, n) for p, n in trace]
    pool = sv.BlockPool(CONFIG, 5, 4)
    sched = sv.Scheduler(model, pool, max_batch=3)
    for i, (p, n) in enumerate(trace):
        sched.add(sv.Request(i, list(p), n))
    _step(sv, sched)
    running, preempted = [r.id for r in sched.running], sched.stats["preemptions"]
    assert running == [0, 1, 2], (
        f"prompts of 7, 7 and 3 tokens need 2 + 2 + 1 blocks, exactly the 5 free: all three should be admitted "
        f"(blocks_to_admit <= n_free, not <), got running {running}"
    )
    assert preempted == 0, f"the first step had every block it needed, yet preempted {preempted} request(s)"
    _step_checking_preemption(sv, sched, pool)
    for _ in range(200):
        if not (sched.waiting or sched.running):
            break
        _step(sv, sched)
    got = {r.id: r.out for r in sched.finished}
    for i, want in enumerate(expected):
        assert got.get(i) == want, f"after preemption request {i} got {got.get(i)}, alone it gets {want}"


def _three_at_a_block_boundary(sv, model, n_blocks):
    """Three requests of 3 tokens after one step each: 4 tokens in 1 block, so the next decode needs 3 blocks."""
    pool = sv.BlockPool(CONFIG, n_blocks, 4)  # the check's own handle: a scheduler's attributes stay in the child
    sched = sv.Scheduler(model, pool, max_batch=3)
    for i in range(3):
        sched.add(sv.Request(i, [1 + i, 2, 3], 5))
    _step(sv, sched)  # admits all three (1 block each), decodes once: each holds 4 tokens, a full block
    assert [r.id for r in sched.running] == [0, 1, 2] and sched.stats["preemptions"] == 0, (
        f"3 requests of 3 tokens in {n_blocks} blocks of 4 should all run after one step, without preemption; "
        f"running {[r.id for r in sched.running]}, {sched.stats['preemptions']} preemption(s)"
    )
    return sched, pool


def _preemption_edges(sv, model):
    # just enough: the decode needs 3 blocks and 3 are free, so nobody is preempted
    sched, pool = _three_at_a_block_boundary(sv, model, 6)
    assert sched.blocks_to_decode() == pool.n_free == 3
    _step(sv, sched)
    assert sched.stats["preemptions"] == 0 and [len(r.out) for r in sched.running] == [3, 3, 3], (
        "the decode needs 3 blocks and 3 are free: that is enough, so nobody is preempted (preempt only while "
        f"blocks_to_decode() > pool.n_free); {sched.stats['preemptions']} preemption(s), tokens {[len(r.out) for r in sched.running]}"
    )
    # short by two: whichever request goes first frees 1 block, the decode then needs 2 with 1 free; a second goes
    sched, pool = _three_at_a_block_boundary(sv, model, 3)
    order = _step_checking_preemption(sv, sched, pool)
    assert len(order) == 2 and len(sched.running) == 1, (
        "the decode needs 3 blocks and none is free: one preemption frees one block, but the other two still need "
        "2; keep preempting in the same step until blocks_to_decode() fits, then decode. "
        f"Got {len(order)} preemption(s), running {[r.id for r in sched.running]} (expected 2, one running)"
    )


# ---------------------------------------------------------------------------------------------
# 7.7 Policy.blocks_to_admit: a design under a budget, any rule that meets it earns the points


@functools.cache
def _budget_case() -> tuple:
    """The tiny model, notebook 07b's budget trace, and each request's tokens alone (greedy, through a plain cache)."""
    model, tokenizer = load_tiny()
    trace = budget_trace(tokenizer)
    alone = []
    with torch.inference_mode():
        for prompt, n in trace:
            cache, ids, out = CheckCache(model.config, len(prompt) + n), torch.tensor([prompt]), []
            for _ in range(n):
                logits, _ = model(ids, past_key_values=cache)
                out.append(int(logits[0, -1].argmax()))
                ids = torch.tensor([out[-1:]])
            alone.append(out)
    return model, trace, alone


@check("7.7")
def policy_meets_the_budget(sv, rng):
    """Check your policy on notebook 07b's trace in its memory cap (kvlib.measure.bench_serve.BUDGET): at most 100
    tokens recomputed, a TTFT p99 of at most 100 steps, every request exact; and its contract: never fewer blocks than
    admitting takes, and a request that fits an idle pool admitted."""
    model = _model(4)
    pool = sv.BlockPool(CONFIG, 8, 4)
    sched = sv.Policy(model, pool, max_batch=4)
    sched.add(sv.Request(0, [1] * 27, 4))  # 27 tokens and the next: 7 of the 8 blocks
    want = -(-28 // 4)
    got = sched.blocks_to_admit(sched.waiting[0])
    assert isinstance(got, int) and not isinstance(got, bool), f"blocks_to_admit should return an int, got {got!r}"
    assert got == want, (
        f"nothing runs, and the request in line takes {want} blocks of the idle pool's 8: your rule asks for {got}. "
        + (
            "Fewer than admitting takes, and admission runs out of blocks"
            if got < want
            else "With nothing running there is no one to keep room for: a request that fits must be admitted"
        )
    )
    sched.step()
    sched.add(sv.Request(1, [2] * 5, 4))
    need, got = -(-6 // 4), sched.blocks_to_admit(sched.waiting[0])
    assert isinstance(got, int) and got >= need, (
        f"with a request running, admitting a prompt of 5 tokens takes {need} blocks, your rule asks for {got!r}: "
        "never fewer than admitting takes"
    )
    model, trace, alone = _budget_case()
    pool = sv.BlockPool(model.config, BUDGET["n_blocks"], BUDGET["block_size"])
    sched = sv.Policy(model, pool, max_batch=BUDGET["max_batch"])
    for i, (p, n) in enumerate(trace):
        sched.add(sv.Request(i, list(p), n))
    run = serve_by_steps(sched, pool, trace)
    wrong = [i for i, want in enumerate(alone) if run["tokens"].get(i) != want]
    assert not wrong, (
        f"requests {wrong} did not get the tokens each gets alone: a policy may change who waits, never a token"
    )
    missed = []
    if run["recomputed"] > BUDGET["recomputed"]:
        missed.append(
            tr(
                "{recomputed} tokens recomputed after preemptions, the budget {budget}: admitting until the pool is "
                "full leaves the running requests no block to grow into, so the next decodes preempt",
                recomputed=run["recomputed"],
                budget=BUDGET["recomputed"],
            )
        )
    if run["ttft_p99_steps"] > BUDGET["ttft_p99_steps"]:
        missed.append(
            tr(
                "TTFT p99 {ttft:.1f} steps, the budget {budget}: your rule holds requests in line longer than the "
                "budget allows; keep fewer blocks back",
                ttft=run["ttft_p99_steps"],
                budget=BUDGET["ttft_p99_steps"],
            )
        )
    assert not missed, f"your policy misses the budget: {'; '.join(missed)}"


# ---------------------------------------------------------------------------------------------
# 7.5 copy_on_write


def _miscounted(pool, tables: dict) -> str:
    """'' when pool.refs[b] is the number of the tables holding b, for every block; else the blocks that differ."""
    holding = [sorted(name for name, t in tables.items() if b in t.blocks) for b in range(pool.n_blocks)]
    wrong = [
        tr(
            "block {block} counts {refs} reference(s) while {n} table(s) hold it ({tables})",
            block=b,
            refs=pool.refs[b],
            n=len(h),
            tables=", ".join(h) or tr("none"),
        )
        for b, h in enumerate(holding)
        if pool.refs[b] != len(h)
    ]
    return "; ".join(wrong)


@check("7.5")
def copy_on_write_copies_a_shared_block(sv, rng):
    """Check that a shared block is copied (every layer's K and V), the table repointed, and every block's
    reference count still the number of tables holding it."""
    pool = sv.BlockPool(CONFIG, 4, 4)
    K, V = _random_kv(rng, 4)
    pool.k, pool.v = K.clone(), V.clone()
    a, b = sv.BlockTable(4), sv.BlockTable(4)
    a.blocks, a.length = pool.allocate(2), 6  # as append (Exercise 7.2) would leave a 6-token table
    b.blocks, b.length = list(a.blocks), a.length
    for blk in a.blocks:
        pool.share(blk)
    old = b.blocks[1]
    k_old, v_old = K[:, old], V[:, old]
    new = sv.copy_on_write(pool, b, 1)
    assert isinstance(new, int) and new != old, (
        f"a block with 2 references should be copied to a new block, got {new!r} (old {old})"
    )
    assert b.blocks == [a.blocks[0], new], (
        f"the table should point at the copy: expected {[a.blocks[0], new]}, got {b.blocks}"
    )
    assert torch.equal(pool.k[:, new], k_old) and torch.equal(pool.v[:, new], v_old), (
        "the copy must hold the old block's K and V, all layers"
    )
    assert a.blocks[1] == old, "the other table must keep the original"
    miscounted = _miscounted(pool, {"a": a, "b": b})
    assert not miscounted, (
        f"after the copy, {miscounted}: when the tables let their blocks go, the pool will not get them all back"
    )


@check("7.5")
def copy_on_write_copies_only_shared_blocks(sv, rng):
    """Check a table holding a block of its own and one another table holds too: the first is returned as it is (no
    copy, no allocation), the second is copied, and the copy, now the table's own, needs no copy on a second call."""
    pool = sv.BlockPool(CONFIG, 6, 4)
    own, shared = pool.allocate(2)
    t, other = sv.BlockTable(4), sv.BlockTable(4)
    t.blocks, t.length = [shared, own], 6
    other.blocks, other.length = [shared], 4
    pool.share(shared)
    free = pool.n_free
    got = sv.copy_on_write(pool, t, 1)
    assert got == own and t.blocks == [shared, own] and pool.n_free == free, (
        f"a block only this table holds (refs 1) needs no copy: expected block {own} back and the table unchanged, "
        f"got {got}, table {t.blocks}"
    )
    got = sv.copy_on_write(pool, t, 0)
    assert isinstance(got, int) and got != shared and t.blocks[0] == got, (
        f"block {shared} is held by another table too (refs 2), yet the table still points at it (got {got!r}, table "
        f"{t.blocks}): a write there would change the other table's tokens"
    )
    assert other.blocks == [shared], f"the other table must keep the original block {shared}, got {other.blocks}"
    miscounted = _miscounted(pool, {tr("this table"): t, tr("the other"): other})
    assert not miscounted, (
        f"after the copy, {miscounted}: when the tables let their blocks go, the pool will not get them all back"
    )
    free = pool.n_free
    again = sv.copy_on_write(pool, t, 0)
    assert again == got and pool.n_free == free, (
        f"the copy (block {got}) is this table's alone: a second call needs no copy, got {again!r}"
    )


@check("7.5")
def shared_prefixes_stay_exact(sv, rng):
    """Check a trace whose prompts extend one another (a chat's next turn extends the last): each shares the blocks
    of an earlier prompt, its part-filled last block included, writes its own next tokens there, and gets exactly the
    tokens it gets alone."""
    model = _model(3, sharp=4.0)  # a token overwritten in a shared block changes what follows (see _model)
    system = [int(t) for t in rng.integers(0, CONFIG.vocab_size, size=10)]  # 2 whole blocks of 4 and half a block
    more = lambda k: [int(t) for t in rng.integers(0, CONFIG.vocab_size, size=k)]  # noqa: E731
    trace = [(system, 6), (system + more(3), 9), (system, 5), (system + more(4), 12)]
    expected = [_greedy(model, p, n) for p, n in trace]
    sched, pool = _serve(sv, model, trace, n_blocks=40, max_batch=4, share=True)
    got = {r.id: r.out for r in sched.finished}
    for i, want in enumerate(expected):
        assert got.get(i) == want, (
            f"with shared prefixes request {i} got {got.get(i)}, alone it gets {want}: requests 1 and 3 extend request "
            "0's prompt, so they share its part-filled last block and write their own next tokens into it, where "
            "request 0 writes its answer"
        )
    assert sched.stats["prefill_skipped"] > 0, "no prefill was skipped: the requests should share the prompt's blocks"
    held = sorted(b for b in range(pool.n_blocks) if b not in pool.free)
    assert not held, (
        f"every request finished and let its blocks go, yet blocks {held} ({len(held)} of {pool.n_blocks}) never came "
        "back to the free list: a server that ran on would run out of blocks"
    )
