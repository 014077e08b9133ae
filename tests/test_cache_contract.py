"""kvlib/core/cache.py: every cache the model runs through keeps one contract (pos, update, advance,
reset, truncate, nbytes, attention); the exact ones give KVCache's logits, and truncate then decode
equals decoding without the rejected tokens, cache contents included."""

import pytest
import torch

from kvlib.checks.kv_cache import CONFIG, _model
from kvlib.compress import SinkCache
from kvlib.core.cache import Cache, CacheBase
from kvlib.core.paging import PagedView
from kvlib.kv_cache import KVCache
from kvlib.serving import BlockPool, BlockTable, paged_attention
from kvlib.variants.compressed import Int8KVCache

IDS = torch.randint(0, CONFIG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))

# name -> a fresh cache for CONFIG, batch 2, room for 24 tokens
CACHES = {
    "KVCache": lambda: KVCache(CONFIG, batch=2, max_seq_len=24),
    "Int8KVCache": lambda: Int8KVCache(CONFIG, batch=2, max_seq_len=24, group=16),  # the drafts in one group
    "SinkCache": lambda: SinkCache(CONFIG, n_sink=2, window=22, batch=2),  # room for every token: no eviction
}
EXACT = ["KVCache", "SinkCache"]  # the caches whose logits equal KVCache's (int8 approximates them)


def _run(model, cache, chunks):
    """Feed IDS[:, a:b] for each (a, b) through the cache; ("truncate", p) rewinds, ("reset",) starts again.
    Returns the last-position logits of every chunk fed."""
    out = []
    with torch.inference_mode():
        for step in chunks:
            if step[0] == "truncate":
                cache.truncate(step[1])
            elif step[0] == "reset":
                cache.reset()
            else:
                logits, same = model(IDS[:, step[0] : step[1]], past_key_values=cache)
                assert same is cache and cache.pos == step[1]
                out.append(logits[:, -1])
    return out


@pytest.mark.parametrize("name", CACHES)
def test_every_cache_keeps_the_contract(name):
    """Check that each cache is a kvlib.core.cache.Cache (the runtime-checkable Protocol) and has an attention."""
    cache = CACHES[name]()
    assert isinstance(cache, Cache), f"{name} lacks part of the contract"
    assert callable(cache.attention) and cache.pos == 0 and cache.nbytes > 0


def test_an_object_without_truncate_is_no_cache():
    """Check that the Protocol tells: an object with pos, update, advance, reset and nbytes but no truncate fails it."""

    class Old:
        pos, nbytes = 0, 0

        def update(self, layer, k_new, v_new): ...
        def advance(self, seq_len): ...
        def reset(self): ...

    assert not isinstance(Old(), Cache)


SEQUENCE = [
    (0, 6),
    (6, 7),
    (7, 8),
    (8, 11),
    ("truncate", 9),
    (9, 10),
    ("reset",),
    (0, 4),
    (4, 5),
    ("truncate", 0),
    (0, 3),
]


@pytest.mark.parametrize("name", EXACT)
def test_exact_caches_give_kvcache_logits(name):
    """Check that prefill, decode steps, a verification chunk, truncate, reset give KVCache's logits exactly."""
    model = _model(1)
    expected = _run(model, KVCache(CONFIG, batch=2, max_seq_len=24), SEQUENCE)
    got = _run(model, CACHES[name](), SEQUENCE)
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, msg=lambda m, i=i: f"chunk {i} of {SEQUENCE}: {m}")


def _stored(cache, n):
    """What a cache holds for positions 0 ... n - 1 (slots past them may keep a rejected token's numbers)."""
    if isinstance(cache, Int8KVCache):
        tokens = cache.k.flatten(3, 4)  # (L, B, H_kv, n_groups * group, D): keys by position
        return tokens[:, :, :, :n], cache.k_scale[:, :, :, : -(-n // cache.group)], *_stored_kv(cache, n, "v")
    return cache.k[:, :, :, :n], cache.v[:, :, :, :n]


def _stored_kv(cache, n, name):
    return getattr(cache, name)[:, :, :, :n], getattr(cache, f"{name}_scale")[:, :, :, :n]


@pytest.mark.parametrize("name", CACHES)
def test_truncate_then_decode_equals_decoding_without_the_rejected_tokens(name):
    """Check that 3 drafts decoded one by one, 2 rejected (truncate), then the next token leave the cache and the
    logits exactly as decoding the kept tokens alone (speculative decoding's rewind)."""
    model = _model(2)
    rewound, plain = CACHES[name](), CACHES[name]()
    # the rejected drafts are other tokens than the ones decoded after the rewind
    drafts = torch.stack([IDS[:, 6], IDS[:, 15], IDS[:, 16]], dim=1)
    with torch.inference_mode():
        model(IDS[:, :6], past_key_values=rewound)
        for t in range(3):
            model(drafts[:, t : t + 1], past_key_values=rewound)
        rewound.truncate(7)  # keep the first draft (IDS[:, 6]), drop two
        got = model(IDS[:, 7:8], past_key_values=rewound)[0]
        model(IDS[:, :6], past_key_values=plain)
        model(IDS[:, 6:7], past_key_values=plain)
        expected = model(IDS[:, 7:8], past_key_values=plain)[0]
    assert rewound.pos == plain.pos == 8
    assert torch.equal(got, expected), "logits after truncate differ from plain decoding"
    for a, b in zip(_stored(rewound, 8), _stored(plain, 8)):
        assert torch.equal(a, b), "the rewound cache holds other keys or values than plain decoding left"


@pytest.mark.parametrize("name", EXACT)  # int8: rounding flips a quantum; exact one by one above
def test_truncate_after_a_verification_chunk_matches_plain_decoding(name):
    """Check that a chunk of drafts fed at once (verification), then truncate, then one more token match plain
    decoding of the kept tokens, logits and cache contents (to rounding: the chunk's products have other shapes)."""
    model = _model(3)
    rewound, plain = CACHES[name](), CACHES[name]()
    with torch.inference_mode():
        model(IDS[:, :6], past_key_values=rewound)
        model(torch.cat([IDS[:, 6:8], IDS[:, 17:19]], dim=1), past_key_values=rewound)  # 2 kept, 2 rejected
        rewound.truncate(8)
        got = model(IDS[:, 8:9], past_key_values=rewound)[0]
        model(IDS[:, :6], past_key_values=plain)
        for t in (6, 7):
            model(IDS[:, t : t + 1], past_key_values=plain)
        expected = model(IDS[:, 8:9], past_key_values=plain)[0]
    torch.testing.assert_close(got, expected)
    for a, b in zip(_stored(rewound, 9), _stored(plain, 9)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", CACHES)
@pytest.mark.parametrize("bad", [-1, 5, 2.0, True, "3"])
def test_truncate_names_a_position_it_cannot_rewind_to(name, bad):
    """Check that truncate refuses a position below 0, past pos, or not an int, with a ValueError naming both."""
    cache = CACHES[name]()
    with torch.inference_mode():
        _model()(IDS[:, :4], past_key_values=cache)
    with pytest.raises(ValueError, match=r"\[0, 4\]") as err:
        cache.truncate(bad)
    assert repr(bad) in str(err.value) and cache.pos == 4


@pytest.mark.parametrize("name", CACHES)
def test_truncate_to_pos_or_0_is_allowed(name):
    """Check that truncate(pos) changes nothing and truncate(0) empties the cache, as reset does."""
    cache = CACHES[name]()
    with torch.inference_mode():
        _model()(IDS[:, :4], past_key_values=cache)
    cache.truncate(4)
    assert cache.pos == 4
    cache.truncate(0)
    assert cache.pos == 0


def test_cache_base_counts_the_bytes_of_the_tensors_it_names_and_bounds_advance():
    """Check that CacheBase's nbytes sums the tensors named in `tensors`, and advance refuses to run past max_seq_len."""

    class Two(CacheBase):
        tensors = ("a", "b")

        def __init__(self):
            super().__init__(CONFIG, batch=1, max_seq_len=5)
            self.a, self.b = torch.zeros(3, dtype=torch.int8), torch.zeros(2, 4)

        def update(self, layer, k_new, v_new):
            return k_new, v_new

    cache = Two()
    assert cache.nbytes == 3 + 2 * 4 * 4 and isinstance(cache, Cache)
    cache.advance(5)
    with pytest.raises(ValueError, match="advancing by 1 from 5 runs past max_seq_len=5"):
        cache.advance(1)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 48\]"):
        KVCache(CONFIG, max_seq_len=49)
    with pytest.raises(ValueError, match="batch must be at least 1"):
        KVCache(CONFIG, batch=0)


def test_int8_cache_gives_kvcache_logits_to_int8_rounding():
    """Check that the int8 cache runs the same sequence (truncate and reset included) close to KVCache's logits."""
    model = _model(1)
    expected = _run(model, KVCache(CONFIG, batch=2, max_seq_len=24), SEQUENCE)
    got = _run(model, Int8KVCache(CONFIG, batch=2, max_seq_len=24, group=4), SEQUENCE)
    torch.testing.assert_close(torch.stack(got), torch.stack(expected), atol=0.05, rtol=0.05)


def test_int8_cache_rewinds_to_a_group_start_exactly_and_refuses_a_closed_group():
    """Check that an int8 cache (groups of 4) rewound from 10 to 8, a group's start, then fed on holds what plain
    decoding leaves; and that rewinding to 6, inside the closed group 4 ... 7, is a ValueError naming both."""
    model = _model(4)
    rewound, plain = (Int8KVCache(CONFIG, batch=2, max_seq_len=24, group=4) for _ in range(2))
    with torch.inference_mode():
        _run(model, rewound, [(0, 6), (6, 10)])
        with pytest.raises(ValueError, match=r"at 10 cannot rewind to 6: group 1 \(positions 4 ... 7\)"):
            rewound.truncate(6)
        assert rewound.pos == 10
        rewound.truncate(8)
        got = _run(model, rewound, [(8, 11)])
        expected = _run(model, plain, [(0, 6), (6, 8), (8, 11)])
    assert torch.equal(got[0], expected[-1])
    for a, b in zip(_stored(rewound, 11), _stored(plain, 11)):
        assert torch.equal(a, b)


def test_sink_cache_rewinds_before_it_fills_and_refuses_once_it_has_evicted():
    """Check that a SinkCache (2 sinks, window 6) rewound before the ring wraps, then fed past capacity, holds what
    plain decoding leaves; once it has overwritten a token, truncate below pos is a ValueError naming the tokens."""
    model = _model(5)
    rewound, plain = (SinkCache(CONFIG, n_sink=2, window=6, batch=2) for _ in range(2))
    with torch.inference_mode():
        _run(model, rewound, [(0, 6), (6, 7)])
        model(IDS[:, 15:16], past_key_values=rewound)  # a draft at position 7, rejected
        rewound.truncate(7)
        got = _run(model, rewound, [(7, 8), (8, 9), (9, 10), (10, 11), (11, 12)])
        expected = _run(model, plain, [(0, 6), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11), (11, 12)])
    assert torch.equal(got[-1], expected[-1])
    assert torch.equal(rewound.k, plain.k) and torch.equal(rewound.v, plain.v)
    with pytest.raises(ValueError, match=r"at 12 cannot rewind to 10: .* overwritten tokens 2 ... 5"):
        rewound.truncate(10)
    rewound.truncate(12)  # where it is: nothing to drop
    rewound.truncate(2)  # only the sinks, which a ring never overwrites
    assert rewound.pos == 2


def test_paged_view_keeps_the_contract_and_gives_kvcache_logits():
    """Check that one step's PagedView is a Cache, that prefill and a decode step through it give KVCache's logits,
    and that it refuses to reset or rewind (the block tables own the tokens)."""
    model, pool = _model(6), BlockPool(CONFIG, n_blocks=8, block_size=4)
    tables, full = [BlockTable(4), BlockTable(4)], KVCache(CONFIG, batch=2, max_seq_len=24)
    with torch.inference_mode():
        for a, b in ((0, 6), (6, 7)):
            positions = torch.tensor([t.length for t in tables])
            slots = torch.tensor([s for t in tables for s in t.append(pool, b - a)])
            view = PagedView(pool, tables, positions, slots, paged_attention)
            assert isinstance(view, Cache) and view.nbytes == pool.nbytes
            got = model(IDS[:, a:b], past_key_values=view)[0]
            torch.testing.assert_close(got, model(IDS[:, a:b], past_key_values=full)[0])
    with pytest.raises(ValueError, match="block table"):
        view.truncate(3)
    with pytest.raises(ValueError, match="free a request's blocks"):
        view.reset()


def test_a_cache_without_attention_is_a_clear_error():
    """Check that model(ids, past_key_values=cache) names the missing piece when a cache has no attention."""

    class Bare:
        pos, nbytes = 0, 0

        def update(self, layer, k_new, v_new): ...
        def advance(self, seq_len): ...
        def reset(self): ...
        def truncate(self, pos): ...

    assert isinstance(Bare(), Cache)
    with pytest.raises(ValueError, match="Bare has no attention method: pass .*attention="):
        _model()(IDS[:, :3], past_key_values=Bare())
