"""kvlib/kv_cache.py (notebook 04): the reference passes every check, each check names the
mistake it exists for, cached generation equals full recompute, and the edges fail clearly."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import handed_in

from kvlib import kv_cache
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.kv_cache import CONFIG, _model
from kvlib.course.exercises import BY_ID

KV_CHECKS = [c for i in range(1, 6) for c in checks_for(BY_ID[f"4.{i}"])]


@pytest.mark.parametrize("check", KV_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 04."""
    check.fn(kv_cache, np.random.default_rng(0))


def test_cached_decode_matches_full_recompute_for_200_tokens():
    """Check that cached and uncached greedy generation agree token for token over 200 new tokens."""
    from kvlib.generation import generate

    torch.manual_seed(0)
    from kvlib.core.model import Decoder, ModelConfig

    model = Decoder(
        ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=48, max_seq_len=256)
    ).eval()
    ids = torch.randint(0, 40, (1, 8))
    assert torch.equal(kv_cache.generate_cached(model, ids, 200), generate(model, ids, 200))


def test_kv_cache_bytes_match_the_formula_and_what_the_cache_allocates():
    """Check that the cache occupies 2 * n_layers * n_kv_heads * head_dim * bytes * tokens (x batch), and that
    Exercise 4.4's kv_cache_bytes counts exactly what a KVCache allocates."""
    for dtype, size in ((torch.float32, 4), (torch.float16, 2)):
        cache = kv_cache.KVCache(CONFIG, batch=3, max_seq_len=20, dtype=dtype)
        assert cache.nbytes == 2 * CONFIG.n_layers * CONFIG.n_kv_heads * CONFIG.head_dim * size * 20 * 3
        assert kv_cache.kv_cache_bytes(CONFIG, 20, 3, dtype) == cache.nbytes


def test_running_past_max_seq_len_is_a_clear_error():
    """Check that a cache that is full refuses more tokens with a ValueError, instead of wrapping."""
    model = _model()
    cache = kv_cache.KVCache(CONFIG, batch=1, max_seq_len=6)
    kv_cache.prefill(model, torch.zeros(1, 5, dtype=torch.long), cache)
    kv_cache.decode_step(model, torch.zeros(1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_seq_len=6"):
        kv_cache.decode_step(model, torch.zeros(1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_seq_len"):
        kv_cache.generate_cached(model, torch.zeros(1, 40, dtype=torch.long), 20)


def test_decode_step_before_prefill_names_the_exercise():
    """Check that decode_step on an empty cache says to run prefill first."""
    cache = kv_cache.KVCache(CONFIG)
    with pytest.raises(ValueError, match=r"run prefill \(Exercise 4.3\)"):
        kv_cache.decode_step(_model(), torch.zeros(1, dtype=torch.long), cache)


def test_cached_forward_equals_the_models_own_cached_call():
    """Check that Exercise 4.3's layer loop and model(ids, past_key_values=cache) give the same logits and cache."""
    ids = torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    mine, theirs = kv_cache.KVCache(CONFIG, batch=2), kv_cache.KVCache(CONFIG, batch=2)
    model = _model(3)
    with torch.inference_mode():
        for a, b in ((0, 6), (6, 7), (7, 9)):
            ours = kv_cache.cached_forward(model, ids[:, a:b], mine)
            logits, _ = model(ids[:, a:b], past_key_values=theirs)
            assert torch.allclose(ours, logits[:, -1], atol=1e-5) and mine.pos == theirs.pos == b
    assert torch.equal(mine.k, theirs.k) and torch.equal(mine.v, theirs.v)


def test_llama_2_7b_on_80_gb_holds_30_sequences_of_4096_tokens():
    """Check notebook 04's server sum with kv_cache_bytes: Llama-2-7B in float16 beside its weights on 80 GB holds
    30 sequences of 4,096 tokens (3 of 32,768), and its cache is 512 KiB per token (the docstring's example)."""
    from kvlib.core.configs import real_model
    from kvlib.core.model import num_params

    config = real_model("Llama-2-7B").config
    assert kv_cache.kv_cache_bytes(config, 1) == 512 * 1024
    free = 80 * 10**9 - num_params(config) * 2  # 80 GB less 13.5 GB of float16 weights
    assert free // kv_cache.kv_cache_bytes(config, 4096) == 30 and free // kv_cache.kv_cache_bytes(config, 32768) == 3


def test_kv_cache_bytes_rejects_bad_input():
    """Check that kv_cache_bytes names a bad argument: a negative length, no batch, a dtype given as a string, no config."""
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache.kv_cache_bytes(CONFIG, -1)
    with pytest.raises(ValueError, match="batch"):
        kv_cache.kv_cache_bytes(CONFIG, 4, 0)
    with pytest.raises(ValueError, match="torch.dtype"):
        kv_cache.kv_cache_bytes(CONFIG, 4, 1, "fp16")
    with pytest.raises(ValueError, match="kvlib ModelConfig"):
        kv_cache.kv_cache_bytes({"n_layers": 2}, 4)


def test_model_call_mirrors_the_seed_pseudo_code():
    """Check that logits, cache = model(ids, past_key_values=cache) runs and grows the cache."""
    model, cache = _model(), kv_cache.KVCache(CONFIG, batch=2)
    logits, same = model(torch.zeros(2, 4, dtype=torch.long), past_key_values=cache)
    assert same is cache and cache.pos == 4 and logits.shape == (2, 4, CONFIG.vocab_size)


# ---------------------------------------------------------------------------------------------
# Known mistakes, each caught and named


class _CatCache(kv_cache.KVCache):
    def update(self, layer, k_new, v_new):  # reallocates: torch.cat into a new tensor every call
        end = self.pos + k_new.shape[2]
        self.k = torch.cat([self.k[:, :, :, : self.pos], self.k[:, :, :, self.pos :]], dim=3).clone()
        self.k[layer, :, :, self.pos : end] = k_new
        self.v[layer, :, :, self.pos : end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class _AdvancingCache(kv_cache.KVCache):
    def update(self, layer, k_new, v_new):
        out = kv_cache.KVCache.update(self, layer, k_new, v_new)
        self.pos += k_new.shape[2]
        return out


def _attention_rope_from_zero(attn, x, cache, layer, rope_cos, rope_sin):
    B, T, _ = x.shape
    cos, sin = rope_cos[:T], rope_sin[:T]  # the slip: positions restart at 0
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    mask = torch.tril(torch.ones(T, k.shape[2], dtype=torch.bool), k.shape[2] - T)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _attention_is_causal(attn, x, cache, layer, rope_cos, rope_sin):
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # the slip: top-left
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _generate_without_reset(
    model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None
):
    if cache is None:
        cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0])
    logits, tokens = kv_cache.prefill(model, input_ids, cache), []
    for _ in range(max_new_tokens):
        tokens.append(logits.argmax(-1))
        logits = kv_cache.decode_step(model, tokens[-1], cache) if len(tokens) < max_new_tokens else logits
    return torch.cat([input_ids, torch.stack(tokens, 1)], 1)


def _kv_without_two(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) // 2


def _kv_without_layers(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) // config.n_layers


def _kv_with_query_heads(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) * config.n_heads // config.n_kv_heads


def _kv_in_bits(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) * 8


def _kv_without_batch(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, 1, dtype)


MISTAKES = [
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_without_two}, "factor 2"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_without_layers}, "n_layers"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_with_query_heads}, "n_kv_heads heads, not n_heads"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_in_bits}, "bytes, not bits"),
    ("kv_cache_bytes_scales_with_tokens_batch_and_dtype", {"kv_cache_bytes": _kv_without_batch}, "multiply by batch"),
    ("kv_cache_update_writes_in_place", {"KVCache": _CatCache}, "reallocated"),
    ("kv_cache_update_writes_in_place", {"KVCache": _AdvancingCache}, "must not move pos"),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_rope_from_zero}, "restart at 0"),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_is_causal}, "aligned top-left"),
    ("cached_attention_one_token_sees_every_key", {"cached_attention": _attention_is_causal}, "key 0 only"),
    ("generate_cached_resets_between_prompts", {"generate_cached": _generate_without_reset}, "reset the cache"),
]


@pytest.mark.parametrize(
    "name, fake, words", MISTAKES, ids=[f"{m[0]}-{next(iter(m[1].values())).__name__}" for m in MISTAKES]
)
def test_check_names_the_known_mistake(name, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    names = ("KVCache", "cached_attention", "cached_forward", "kv_cache_bytes", "generate_cached")
    with pytest.raises(AssertionError) as info:
        CHECKS[name].fn(handed_in(kv_cache, names, **fake), np.random.default_rng(0))
    assert words in str(info.value)


def test_generate_cached_matches_transformers_cached_generation():
    """Check that kvlib's cached greedy tokens equal transformers' generate(use_cache=True) on the same weights."""
    pytest.importorskip("transformers")
    from kvlib.core.weights import to_transformers

    model = _model(7)
    hf = to_transformers(model)
    ids = torch.randint(0, CONFIG.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        theirs = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, use_cache=True, pad_token_id=0
        )  # pad is unused: one unpadded prompt
    assert torch.equal(kv_cache.generate_cached(model, ids, 30), theirs)


# ---------------------------------------------------------------------------------------------
# In the isolated grading child, as nbgrader runs them


def _sandboxed_checks(kv_source: str) -> dict[str, str]:
    """Every 4.x check on a kv_cache.py run in the isolated child: check name -> "pass" or its message."""
    from conftest import ROOT

    from kvlib.grading.sandbox import Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    for module in ("attention", "generation"):  # 4.x use 1.3's mask and 2.1's sampling
        files[f"kvlib/{module}.py"] = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_bytes()
    files["kvlib/kv_cache.py"] = kv_source.encode()
    functions = [
        "kv_cache.KVCache",
        "kv_cache.cached_attention",
        "kv_cache.cached_forward",
        "kv_cache.kv_cache_bytes",
        "kv_cache.generate_cached",
    ]
    verdicts = {}
    with Sandbox(
        files, ["attention", "generation", "kv_cache"], functions, mode="plain", torch=True, call_timeout=60, budget=300
    ) as sandbox:
        for check in KV_CHECKS:
            try:
                check.fn(sandbox.module("kv_cache"), np.random.default_rng(0))
                verdicts[check.name] = "pass"
            except AssertionError as err:
                verdicts[check.name] = str(err)
    return verdicts


def test_checks_count_flops_and_read_the_cache_in_the_isolated_child():
    """Check that the reference passes every 4.x check in the grading child, and a cached_forward that reruns the
    model over the ids seen (only moving cache.pos) fails the cache-use check there, saying why."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    assert set(_sandboxed_checks(source).values()) == {"pass"}
    body = source[
        source.index("    ### BEGIN SOLUTION\n    x = model.embed") : source.index(
            "    ### END SOLUTION\n\n\ndef prefill"
        )
    ]
    recompute = (
        "    seen = input_ids if cache.pos == 0 else torch.cat([cache.seen, input_ids], 1)\n"
        "    cache.seen = seen\n    cache.advance(input_ids.shape[1])\n    return model(seen)[:, -1]\n"
    )
    verdicts = _sandboxed_checks(source.replace(body, recompute))
    assert verdicts["cached_forward_matches_full_forward"] == "pass"
    assert "recomputes from the token ids" in verdicts["cached_forward_decode_uses_the_cache"]
    assert "reruns earlier tokens" in verdicts["generate_cached_uses_the_cache"]


def test_a_submission_that_zeroes_the_model_it_is_given_scores_nothing_in_the_isolated_child():
    """Check the attack of issue 15: a cached_forward and generate_cached that zero the model's weights and the ids they
    are given (copied back into the grader's objects) and return zeros fail every check of 4.3 and 4.5."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    wreck = "    with torch.no_grad():\n        for p in model.parameters():\n            p.zero_()\n    input_ids.zero_()\n"
    forward = source[
        source.index("    ### BEGIN SOLUTION\n    x = model.embed") : source.index(
            "    ### END SOLUTION\n\n\ndef prefill"
        )
    ]
    source = source.replace(
        forward,
        wreck
        + "    cache.advance(input_ids.shape[1])\n    return torch.zeros(input_ids.shape[0], model.config.vocab_size)\n",
    )
    generate = source[
        source.index("    ### BEGIN SOLUTION\n    if cache is None:") : source.rindex("    ### END SOLUTION")
    ]
    source = source.replace(
        generate,
        wreck + "    return torch.zeros(input_ids.shape[0], input_ids.shape[1] + max_new_tokens, dtype=torch.long)\n",
    )
    verdicts = _sandboxed_checks(source)
    wrecked = [c.name for c in KV_CHECKS if c.exercise.id in ("4.3", "4.5")]
    assert all(verdicts[name] != "pass" for name in wrecked), {n: verdicts[n] for n in wrecked}
