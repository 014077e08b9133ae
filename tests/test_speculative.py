"""kvlib/speculative.py (notebook 10): greedy speculative decoding equals greedy decoding with its cache rewound
right, the tokens a pass makes (a prediction), exact sampling, prompt lookup; other correct ways passing the checks, likely slips named, bad input,
the benchmark's shape of report.

Runs in reference mode (conftest). No test asserts on time."""

import json
import re

import numpy as np
import pytest
import torch
from conftest import check_failures, handed_in, on_a_terminal, shown_progress

from kvlib import speculative
from kvlib.checks import checks_for
from kvlib.checks.speculative import CheckCache, counted, plain_cache
from kvlib.core.model import Decoder, ModelConfig
from kvlib.core.weights import load_draft, load_tiny
from kvlib.course.exercises import BY_ID, ExerciseNotDone
from kvlib.kv_cache import KVCache
from kvlib.measure import bench_spec
from kvlib.study import corpus

torch.set_num_threads(1)

CHECKS_10 = [c for i in range(1, 6) for c in checks_for(BY_ID[f"10.{i}"])]
NAMES = ("verify_greedy", "speculative_generate", "tokens_per_pass", "accept_sampled", "prompt_lookup")


@pytest.mark.parametrize("check", CHECKS_10, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 10."""
    check.fn(speculative, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 10.x exercise raises ExerciseNotDone naming itself, but 10.1, a find-and-fix
    exercise, whose shipped body runs (and fails its checks: tests/test_exercise.py)."""
    config = ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=16, max_seq_len=16)
    model = Decoder(config)
    p, q = torch.full((2, 3), 1 / 3), torch.full((1, 3), 1 / 3)
    n, next_token = speculative.verify_greedy(model, CheckCache(config, 8), 1, [2])
    assert n in (0, 1) and 0 <= next_token < config.vocab_size
    for ex_id, call in (
        (
            "10.2",
            lambda: speculative.speculative_generate(model, speculative.LookupDrafter(), torch.tensor([[1, 2]]), 3, 2),
        ),
        ("10.3", lambda: speculative.accept_sampled(p, q, [0])),
        ("10.4", lambda: speculative.prompt_lookup([1, 2, 1], 1, 2)),
        ("10.5", lambda: speculative.tokens_per_pass(0.5, 4)),
    ):
        with pytest.raises(ExerciseNotDone, match=f"Exercise {ex_id}"):
            call()


# ---------------------------------------------------------------------------------------------
# Exact: the tokens of greedy decoding, the cache of plain decoding


@pytest.fixture(scope="module")
def models():
    return load_tiny(), load_draft()[0]


def _plain(model, ids, n):
    return bench_spec.plain_greedy(model, ids, n, KVCache(model.config, max_seq_len=ids.shape[1] + n))


def test_speculative_equals_greedy_on_every_held_out_template_and_a_counting_prompt(models):
    """Check that greedy speculative decoding with the drafter model returns greedy decoding's tokens, for several gamma,
    on one prompt of every held-out template and on a counting prompt, and leaves the cache plain decoding leaves."""
    (model, tokenizer), draft = models
    prompts = [it.prompt for it in corpus.eval_prompts("held_out", stride=137)]  # every held-out template once
    prompts.append("a b c d e f g h i j k")  # counting
    assert len(prompts) == len(corpus.templates("held_out")) + 1
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([tokenizer.encode(prompt)])
        n = 12
        want = _plain(model, ids, n)
        for gamma in (1, 3, 5) if i % 8 == 0 or i == len(prompts) - 1 else (2 + i % 5,):
            cache = CheckCache(model.config, ids.shape[1] + n)
            counter, calls = counted(model)
            drafter = speculative.ModelDrafter(draft, max_seq_len=ids.shape[1] + n + gamma)
            got = speculative.speculative_generate(counter, drafter, ids, n, gamma, cache=cache)
            assert torch.equal(got, want), (prompt, gamma)
            assert len(calls) < n, (prompt, gamma, len(calls))
            reference = plain_cache(model, want[0, :-1].tolist(), ids.shape[1] + n)
            assert cache.pos == want.shape[1] - 1
            torch.testing.assert_close(cache.k[..., : cache.pos, :], reference.k[..., : cache.pos, :])
            torch.testing.assert_close(cache.v[..., : cache.pos, :], reference.v[..., : cache.pos, :])


def test_prompt_lookup_speculation_equals_greedy_on_a_repeating_prompt(models):
    """Check that speculative decoding with prompt lookup returns greedy decoding's tokens and saves passes."""
    (model, tokenizer), _ = models
    ids = bench_spec.repeating_prompt(tokenizer)
    want = _plain(model, ids, 40)
    for gamma in (1, 4, 8):
        counter, calls = counted(model)
        got = speculative.speculative_generate(counter, speculative.LookupDrafter(3), ids, 40, gamma)
        assert torch.equal(got, want)
        assert len(calls) < 40


# ---------------------------------------------------------------------------------------------
# Prompt lookup: where it finds little, where the continuation copies, and the choices it makes


@pytest.fixture(scope="module")
def lookup_prompts(models):
    (model, tokenizer), _ = models
    return {
        "repeating_prompt": bench_spec.repeating_prompt(tokenizer),
        "own_document_prompt": bench_spec.own_document_prompt(model, tokenizer),
    }


@pytest.fixture(scope="module")
def lookup_counted(models, lookup_prompts):
    (model, _), _ = models
    return bench_spec.lookup_counts(model, lookup_prompts, 64, gammas=(4, 8))


def test_own_document_prompt_gives_the_models_text_back_with_its_beginning_again(models, lookup_prompts):
    """Check that the prompt is the model's own greedy text after the anchor, cut after a full line, then the anchor,
    and that the model's continuation repeats that context where repeating_prompt's does not (counted, no clock)."""
    (model, tokenizer), _ = models
    anchor = corpus.ANCHORS[1][0]
    ids = lookup_prompts["own_document_prompt"]
    text = tokenizer.decode(ids[0].tolist())
    document = text[: -len(anchor)]
    assert text.startswith(anchor) and text.endswith("\n" + anchor)
    written = tokenizer.decode(_plain(model, torch.tensor([tokenizer.encode(anchor)]), 200)[0].tolist())
    assert written.startswith(document), "the document is what greedy decoding writes after the anchor"
    shares = {}
    for name, prompt in lookup_prompts.items():
        want = _plain(model, prompt, 64)[0].tolist()
        shares[name] = bench_spec.copied_share(want, prompt.shape[1])[0]
    assert shares["own_document_prompt"] > 0.9 > 0.6 > shares["repeating_prompt"], shares


def test_no_lookup_policy_keeps_one_draft_a_pass_on_repeating_prompt(lookup_counted):
    """Check the docs' reading of repeating_prompt: whatever n-gram, occurrence or source, no lookup policy keeps
    one draft per verify pass, so 1 + accepted per pass, which caps the speedup, stays below 2x for any lookup
    there; on the model's own document 10.4's lookup makes 3+ tokens a pass."""
    for policy, per_gamma in lookup_counted["repeating_prompt"].items():
        assert all(r["accepted_per_pass"] < 1 for r in per_gamma.values()), (policy, per_gamma)
    ours = lookup_counted["own_document_prompt"]["n=3, latest (exercise 10.4)"]
    assert ours[8]["tokens_per_pass"] > 3 and ours[8]["alpha"] > 0.8, ours
    for per_gamma in lookup_counted["repeating_prompt"].values():
        assert all(r["accepted_per_pass"] <= r["proposed_per_pass"] for r in per_gamma.values())


def test_lookup_policy_defaults_to_the_earliest_match_and_makes_each_published_choice():
    """Check that lookup_policy with its defaults takes the earliest match (not exercise 10.4's answer), with
    latest=True is prompt_lookup (n=3, latest), and each choice it offers: shorter n-grams, k whole tokens or none,
    the prompt alone as source."""
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(200):
        tokens = [int(t) for t in rng.integers(4, size=int(rng.integers(1, 30)))]
        assert bench_spec.lookup_policy(tokens, 4, latest=True) == speculative.prompt_lookup(tokens, 3, 4), tokens
        differ += bench_spec.lookup_policy(tokens, 4) != speculative.prompt_lookup(tokens, 3, 4)
    assert differ, differ  # the defaults are not the exercise's answer
    text = [5, 1, 2, 7, 8, 1, 2, 9, 1, 2]
    assert bench_spec.lookup_policy(text, 2, n=2, latest=True) == [9, 1]
    assert bench_spec.lookup_policy(text, 2, n=2) == [7, 8]
    assert bench_spec.lookup_policy([1, 2, 3, 1, 2, 3, 1, 2, 3], 2, n=3, n_min=1, whole=True) == [1, 2]
    assert bench_spec.lookup_policy([1, 2, 3, 4, 5, 6, 7, 8, 9], 2, n=3, n_min=1) == []
    assert bench_spec.lookup_policy([4, 6, 1, 2, 3, 9, 5, 3], 2, n=3) == []  # no 3-gram match
    assert bench_spec.lookup_policy([4, 6, 1, 2, 3, 9, 5, 3], 2, n=3, n_min=1, latest=True) == [9, 5]  # the 1-gram [3]
    assert bench_spec.lookup_policy([3, 1, 2, 3], 4, n=1) == [1, 2, 3]  # what there is, up to k
    assert bench_spec.lookup_policy([3, 1, 2, 3], 4, n=1, whole=True) == []  # k whole tokens or none
    prompt_then_text = [1, 2, 3, 6, 1, 2, 4, 1, 2]  # the prompt is the first 4
    assert bench_spec.lookup_policy(prompt_then_text, 3, n=2, source=4, latest=True) == [3, 6]
    assert bench_spec.lookup_policy(prompt_then_text, 3, n=2, latest=True) == [4, 1, 2]


def test_speedup_sweep_counts_tokens_per_pass(models):
    """Check that speedup_sweep reports alpha and tokens per model pass as counts: a drafter that knows the text
    (alpha 1) at gamma 3 makes 8 tokens in 3 passes (the prefill's 1, then 4, then 3 cut at the 8th)."""
    (model, tokenizer), _ = models
    ids = torch.tensor([tokenizer.encode(corpus.ANCHORS[1][0])])
    truth = _plain(model, ids, 8)[0].tolist()
    out = bench_spec.speedup_sweep(model, {"oracle": lambda: bench_spec.NoisyOracle(truth, 1.0)}, ids, 8, (3,), 1)
    assert out["oracle"]["alpha"] == 1.0
    assert out["oracle"]["tokens_per_pass"] == [8 / 3]
    assert out["oracle"]["speedup_cap"] == [7 / 2]  # 7 tokens after the prefill's, in 2 verify passes
    assert len(out["oracle"]["speedup"]) == 1


def test_copied_share_counts_runs_found_earlier():
    """Check copied_share on a copy, a copy of a copy (overlapping), new tokens and runs below min_span."""
    assert bench_spec.copied_share([1, 2, 3, 4, 5, 1, 2, 3, 4, 5], 5) == (1.0, [5])
    assert bench_spec.copied_share([1, 2, 1, 2, 1, 2, 1, 2], 2) == (1.0, [6])
    assert bench_spec.copied_share([1, 2, 3, 4, 9, 8, 7, 6], 4) == (0.0, [])
    assert bench_spec.copied_share([1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 7, 0], 4, min_span=3) == (0.375, [3])


def test_drafter_model_shares_the_vocabulary_and_is_smaller(models):
    """Check that the shipped drafter is smaller than the tiny model and speaks its vocabulary."""
    (model, _), draft = models
    assert draft.config.vocab_size == model.config.vocab_size
    assert draft.num_params() * 4 < model.num_params()


def test_drafter_ships_with_its_checksum_and_the_manifest_of_its_training_preset():
    """Check that assets/draft records, as assets/tiny does, its checksum, settings and evaluation, and that its
    config is what `python -m kvlib.study.train --preset draft` trains, for DRAFT_STEPS steps."""
    from kvlib.core.weights import DRAFT_DIR, TINY_DIR, sha256_of  # noqa: PLC0415
    from kvlib.study.train import DRAFT_STEPS, draft_config  # noqa: PLC0415

    manifest = json.loads((DRAFT_DIR / "manifest.json").read_text(encoding="utf-8"))
    tiny = json.loads((TINY_DIR / "manifest.json").read_text(encoding="utf-8"))
    assert set(tiny) <= set(manifest)
    assert manifest["weights_sha256"] == sha256_of(DRAFT_DIR / "model.pt")
    assert manifest["config"] == draft_config(manifest["config"]["vocab_size"]).to_dict()
    assert manifest["settings"]["steps"] == DRAFT_STEPS
    assert manifest["corpus"]["train_text_sha256"] == tiny["corpus"]["train_text_sha256"]  # the same corpus


def test_bad_inputs_name_the_problem(models):
    """Check that gamma < 1, another vocabulary, a cache without room, an alpha outside [0, 1] and a negative gamma
    fail with a message naming them."""
    (model, tokenizer), draft = models
    ids = torch.tensor([tokenizer.encode("Q: What is")])
    lookup = speculative.LookupDrafter()
    with pytest.raises(ValueError, match="gamma"):
        speculative.speculative_generate(model, lookup, ids, 4, 0)
    other = Decoder(ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=16))
    with pytest.raises(ValueError, match="vocabulary"):
        speculative.speculative_generate(model, speculative.ModelDrafter(other), ids, 4, 2)
    with pytest.raises(ValueError, match="room|holds"):
        speculative.speculative_generate(model, lookup, ids, 20, 2, cache=KVCache(model.config, max_seq_len=16))
    cache = CheckCache(model.config, 12)
    cache.pos = 10
    with pytest.raises(ValueError, match="room for 2 more"):
        speculative.verify_greedy(model, cache, 1, [2, 3, 4])
    with pytest.raises(ValueError, match="probability"):
        speculative.accept_sampled(torch.ones(2, 3), torch.full((1, 3), 1 / 3), [0])
    with pytest.raises(ValueError, match="n must"):
        speculative.prompt_lookup([1, 2], 0, 2)
    with pytest.raises(ValueError, match=r"alpha .* in \[0, 1\]"):
        speculative.tokens_per_pass(1.5, 4)
    with pytest.raises(ValueError, match="gamma .* int >= 0"):
        speculative.tokens_per_pass(0.5, -1)


# ---------------------------------------------------------------------------------------------
# Other correct ways pass every check; likely slips fail, with their names


def _module(**replaced):
    return handed_in(speculative, NAMES, **replaced)


def _messages(ex_id: str, **replaced) -> list[str]:
    out = []
    for check in checks_for(BY_ID[ex_id]):
        try:
            check.fn(_module(**replaced), np.random.default_rng(0))
            out.append("")
        except AssertionError as err:
            out.append(str(err) or "assertion")
        except Exception as err:  # a crash in the code under test is a failure too
            out.append(f"{type(err).__name__}: {err}")
    return out


def _verify(model, cache, last_token, draft, *, rewind=1, bonus=True, one_pass=True, cut=True):
    """verify_greedy with knobs for its slips."""
    start = cache.pos
    if one_pass:
        logits, _ = model(torch.tensor([[last_token, *draft]]), past_key_values=cache)
        greedy = logits[0].argmax(-1).tolist()
    else:
        greedy = []
        for t in [last_token, *draft]:
            logits, _ = model(torch.tensor([[t]]), past_key_values=cache)
            greedy.append(int(logits[0, -1].argmax()))
    n = 0
    while n < len(draft) and draft[n] == greedy[n]:
        n += 1
    if cut:
        cache.truncate(min(cache.pos, start + n + rewind))
    return n, greedy[n] if bonus or n < len(draft) else draft[-1]


def verify_per_draft(model, cache, last_token, draft):
    return _verify(model, cache, last_token, draft, one_pass=False)


def verify_no_bonus(model, cache, last_token, draft):
    return _verify(model, cache, last_token, draft, bonus=False)


def verify_rewind_one_too_few(model, cache, last_token, draft):
    return _verify(model, cache, last_token, draft, rewind=2)


def verify_rewind_one_too_many(model, cache, last_token, draft):
    return _verify(model, cache, last_token, draft, rewind=0)


def verify_never_rewinds(model, cache, last_token, draft):
    return _verify(model, cache, last_token, draft, cut=False)


def verify_counts_every_agreement(model, cache, last_token, draft):  # the shipped bug's first half, rewound right
    start = cache.pos
    logits, _ = model(torch.tensor([[last_token, *draft]]), past_key_values=cache)
    greedy = logits[0].argmax(-1).tolist()
    n = sum(d == g for d, g in zip(draft, greedy))
    cache.truncate(start + n + 1)
    return n, greedy[n]


def verify_cumprod(model, cache, last_token, draft):
    start = cache.pos
    logits, _ = model(torch.tensor([[last_token, *draft]]), past_key_values=cache)
    greedy = logits[0].argmax(-1)  # (k + 1,)
    agree = (greedy[: len(draft)] == torch.tensor(draft, dtype=torch.long)).long().cumprod(0)
    n = int(agree.sum())
    cache.truncate(cache.pos - (len(draft) - n))
    assert cache.pos == start + n + 1
    return n, int(greedy[n])


def _generate(model, drafter, input_ids, max_new_tokens, gamma, eos_token=None, cache=None, *, mode="right"):
    """speculative_generate with knobs for its slips and other shapes."""
    cache = (
        cache if cache is not None else KVCache(model.config, max_seq_len=input_ids.shape[1] + max_new_tokens + gamma)
    )
    if mode != "no_reset":
        cache.reset()
    prompt = input_ids[0].tolist()
    if mode == "prefill_all_but_last":  # the prompt's last token goes with the first drafts (10.1's try-it cell)
        if len(prompt) > 1:
            model(input_ids[:, :-1], past_key_values=cache)
        new, last = [], prompt[-1]
        while len(new) < max_new_tokens and eos_token not in new:
            k = min(gamma, max_new_tokens - len(new) - 1)
            draft = drafter.propose(prompt + new, k)[:k] if k else []
            n, nxt = speculative.verify_greedy(model, cache, last, draft)
            new += draft[:n] + [nxt]
            last = new[-1]
        if eos_token in new:
            new = new[: new.index(eos_token) + 1]
            cache.truncate(len(prompt) + len(new) - 1)
        return torch.tensor([prompt + new])
    logits, _ = model(input_ids, past_key_values=cache)
    new = [int(logits[0, -1].argmax())]
    seen = prompt + new if mode == "eos_in_prompt" else new  # the slip: an end token in the prompt counts
    while len(new) < max_new_tokens and (mode == "eos_inside" or eos_token not in seen):
        if mode == "plain":
            logits, _ = model(torch.tensor([[new[-1]]]), past_key_values=cache)
            new.append(int(logits[0, -1].argmax()))
            continue
        k = (
            gamma
            if mode in ("no_clip", "no_clip_cache_kept", "too_many")
            else min(gamma, max_new_tokens - len(new) - 1)
        )
        draft = drafter.propose(prompt + new, k)[:k] if k else []
        if mode == "no_cache":
            logits = model(torch.tensor([prompt + new + draft]))
            greedy = logits[0, -len(draft) - 1 :].argmax(-1).tolist()
            n = 0
            while n < len(draft) and draft[n] == greedy[n]:
                n += 1
            new += draft[:n] + [greedy[n]]
            continue
        n, nxt = speculative.verify_greedy(model, cache, new[-1], draft)
        if mode == "no_bonus" and n == len(draft) and draft:
            cache.truncate(cache.pos - 1)
            new += draft
            continue
        new += draft[:n] + [nxt]
        seen = prompt + new if mode == "eos_in_prompt" else new
    if mode == "eos_inside":
        new = new[:max_new_tokens]
        if eos_token in new:
            new = new[: new.index(eos_token) + 2]
    elif eos_token in new:
        new = new[: new.index(eos_token) + 1]
        if mode != "eos_cache_kept":
            cache.truncate(len(prompt) + len(new) - 1)
    if mode in ("no_clip", "no_clip_cache_kept") and len(new) > max_new_tokens:
        new = new[:max_new_tokens]
        if mode == "no_clip":
            cache.truncate(len(prompt) + len(new) - 1)
    return torch.tensor([prompt + new])


def generate_prefill_all_but_last(model, drafter, input_ids, max_new_tokens, gamma, eos_token=None, cache=None):
    """Prefill all the prompt but its last token, which the first verify pass carries with the first drafts."""
    return _generate(model, drafter, input_ids, max_new_tokens, gamma, eos_token, cache, mode="prefill_all_but_last")


def _mode(mode):
    def generate(*args, **kwargs):
        return _generate(*args, **kwargs, mode=mode)

    generate.__name__ = f"generate_{mode}"
    return generate


def _accept(p, q, draft, generator=None, *, rule="exact", residual="exact", bonus=True, shared=False):
    shared_u = float(torch.rand((), generator=generator)) if shared else None
    for i, token in enumerate(draft):
        u = shared_u if shared else float(torch.rand((), generator=generator))
        if rule == "topk":
            ok = token in p[i].topk(2).indices.tolist()
        elif rule == "q_over_p":
            ok = u * float(p[i, token]) < float(q[i, token])
        else:
            ok = u * float(q[i, token]) < float(p[i, token])
        if ok:
            continue
        rest = p[i] if residual == "p" else (p[i] - q[i]).clamp(min=0)
        return draft[:i] + [int(torch.multinomial(rest / rest.sum(), 1, generator=generator))]
    return list(draft) + ([int(torch.multinomial(p[len(draft)], 1, generator=generator))] if bonus else [])


def accept_topk(p, q, draft, generator=None):
    return _accept(p, q, draft, generator, rule="topk")


def accept_resample_from_p(p, q, draft, generator=None):
    return _accept(p, q, draft, generator, residual="p")


def accept_no_bonus(p, q, draft, generator=None):
    return _accept(p, q, draft, generator, bonus=False) or [int(torch.multinomial(p[0], 1, generator=generator))]


def accept_q_over_p(p, q, draft, generator=None):
    return _accept(p, q, draft, generator, rule="q_over_p")


def accept_global_rng(p, q, draft, generator=None):  # the generator ignored: torch's global RNG draws
    return _accept(p, q, draft, None)


def accept_shared_uniform(p, q, draft, generator=None):  # one u for every draft of the round
    return _accept(p, q, draft, generator, shared=True)


_SEEN = {"rounds": 0, "kept": 0.0}


def accept_balanced(p, q, draft, generator=None):  # no randomness: acceptances spread evenly over the calls so far
    out = []
    for i, token in enumerate(draft):
        _SEEN["kept"] += min(1.0, float(p[i, token]) / float(q[i, token]))
        _SEEN["rounds"] += 1
        if _SEEN["kept"] >= 1:
            _SEEN["kept"] -= 1
            out.append(token)
            continue
        rest = (p[i] - q[i]).clamp(min=0)
        return out + [int(torch.multinomial(rest / rest.sum(), 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(draft)], 1, generator=generator))]


def accept_uniforms_first(p, q, draft, generator=None):
    u = torch.rand(len(draft), generator=generator, dtype=torch.float64)
    idx = torch.arange(len(draft))
    d = torch.tensor(draft, dtype=torch.long)
    ratio = (p[idx, d].double() / q[idx, d].double()).clamp(max=1.0)
    rejected = (u >= ratio).nonzero()
    if len(rejected) == 0:
        return list(draft) + [int(torch.multinomial(p[-1], 1, generator=generator))]
    i = int(rejected[0])
    rest = torch.relu(p[i] - q[i])
    return list(draft[:i]) + [int(torch.multinomial(rest, 1, generator=generator))]


def lookup_first(tokens, n, k):
    tail = tokens[-n:]
    for s in range(len(tokens) - n):
        if tokens[s : s + n] == tail:
            return tokens[s + n : s + n + k]
    return []


def lookup_matches_itself(tokens, n, k):
    tail = tokens[-n:]
    for s in range(len(tokens) - n, -1, -1):
        if tokens[s : s + n] == tail:
            return tokens[s + n : s + n + k]
    return []


def lookup_no_clip(tokens, n, k):
    tail = tokens[-n:]
    for s in range(len(tokens) - n - 1, -1, -1):
        if tokens[s : s + n] == tail:
            return tokens[s + n :]
    return []


def lookup_numpy(tokens, n, k):
    if len(tokens) <= n:
        return []
    windows = np.lib.stride_tricks.sliding_window_view(np.array(tokens), n)[:-1]  # every start but the tail's
    hits = np.nonzero((windows == np.array(tokens[-n:])).all(1))[0]
    return [] if len(hits) == 0 else [int(t) for t in tokens[hits[-1] + n : hits[-1] + n + k]]


def lookup_reversed(tokens, n, k):
    rev = tokens[::-1]
    for j in range(1, len(tokens) - n + 1):  # rev[j:j+n] is the window ending j tokens before the end
        if rev[j : j + n] == rev[:n]:
            start = len(tokens) - j
            return tokens[start : start + k]
    return []


# 10.5 tokens_per_pass: a prediction, graded against the expected count


def pass_closed_form(alpha, gamma):  # the geometric sum's closed form, alpha = 1 apart
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def pass_by_outcomes(alpha, gamma):  # sum over how many drafts are kept: j kept makes j + 1 tokens
    return sum((j + 1) * alpha**j * (1 - alpha) for j in range(gamma)) + (gamma + 1) * alpha**gamma


def pass_numpy(alpha, gamma):  # an np.float64 from numpy's powers
    return np.sum(np.float64(alpha) ** np.arange(gamma + 1))


def pass_no_model_token(alpha, gamma):
    return sum(alpha**i for i in range(1, gamma + 1))


def pass_one_term_short(alpha, gamma):
    return sum(alpha**i for i in range(gamma))


def pass_every_draft_checked(alpha, gamma):
    return 1 + gamma * alpha


def pass_closed_form_at_one(alpha, gamma):  # divides by 1 - alpha at alpha = 1
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def pass_as_the_run_counted(alpha, gamma):  # a copied number: notebook 10b's counted tokens, whatever is asked
    return 4.2


ALTERNATIVES = {
    "10.1": ("verify_greedy", [verify_cumprod]),
    "10.2": ("speculative_generate", [_mode("no_clip"), _mode("right"), generate_prefill_all_but_last]),
    "10.3": ("accept_sampled", [accept_uniforms_first]),
    "10.4": ("prompt_lookup", [lookup_numpy, lookup_reversed]),
    "10.5": ("tokens_per_pass", [pass_closed_form, pass_by_outcomes, pass_numpy]),
}
_ALT = [(ex, name, fn) for ex, (name, fns) in ALTERNATIVES.items() for fn in fns]


@pytest.mark.parametrize("ex_id, name, fn", _ALT, ids=[f"{c[0]}-{c[2].__name__}" for c in _ALT])
def test_other_correct_implementations_pass(ex_id, name, fn):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = [m for m in _messages(ex_id, **{name: fn}) if m]
    assert not failures, failures


SLIPS = [
    # 10.1 ships broken (find and fix): its messages show the symptom, beside what greedy decoding does
    ("10.1", "verify_greedy", verify_per_draft, "forward passes for"),
    ("10.1", "verify_greedy", verify_no_bonus, "where greedy decoding writes"),
    ("10.1", "verify_greedy", verify_counts_every_agreement, "where greedy decoding writes"),
    ("10.1", "verify_greedy", verify_rewind_one_too_few, "on return the cache holds"),
    ("10.1", "verify_greedy", verify_rewind_one_too_many, "on return the cache holds"),
    ("10.1", "verify_greedy", verify_never_rewinds, "on return the cache holds"),
    ("10.2", "speculative_generate", _mode("plain"), "no pass verified a draft"),
    ("10.2", "speculative_generate", _mode("no_cache"), "without the cache"),
    ("10.2", "speculative_generate", _mode("no_bonus"), "kept fewer tokens than its pass verified"),
    ("10.2", "speculative_generate", _mode("eos_inside"), "after eos_token"),
    ("10.2", "speculative_generate", _mode("eos_cache_kept"), "the drafts accepted after it in the same pass stayed"),
    ("10.2", "speculative_generate", _mode("too_many"), "the last round made more tokens than were still wanted"),
    ("10.2", "speculative_generate", _mode("no_reset"), "attended to the old text's keys"),
    ("10.2", "speculative_generate", _mode("no_clip_cache_kept"), "the keys and values of the tokens cut off stayed"),
    ("10.2", "speculative_generate", _mode("eos_in_prompt"), "taken for an end token the model made"),
    ("10.3", "accept_sampled", accept_topk, "top k"),
    ("10.3", "accept_sampled", accept_resample_from_p, "given twice"),
    ("10.3", "accept_sampled", accept_no_bonus, "bonus token"),
    ("10.3", "accept_sampled", accept_q_over_p, "q/p"),
    ("10.3", "accept_sampled", accept_global_rng, "left its generator as it came"),
    ("10.3", "accept_sampled", accept_shared_uniform, "one uniform draw was shared"),
    ("10.3", "accept_sampled", accept_balanced, "other tokens from a generator in the same state"),
    ("10.4", "prompt_lookup", lookup_first, "LATEST"),
    ("10.4", "prompt_lookup", lookup_matches_itself, "match themselves"),
    ("10.4", "prompt_lookup", lookup_no_clip, "at most k"),
    ("10.5", "tokens_per_pass", pass_no_model_token, "the model's own token is missing"),
    ("10.5", "tokens_per_pass", pass_one_term_short, "one term short"),
    ("10.5", "tokens_per_pass", pass_every_draft_checked, "a pass ends at the first rejected draft"),
    ("10.5", "tokens_per_pass", pass_closed_form_at_one, "at alpha = 1 every draft is kept"),
    ("10.5", "tokens_per_pass", pass_as_the_run_counted, "expected"),
]


def _verify_counted_to_the_first_mismatch(model, cache, last_token, draft):  # the shipped body, its count fixed only
    logits, _ = model(torch.tensor([[last_token, *draft]]), past_key_values=cache)
    predicted = logits[0].argmax(-1).tolist()
    n = next((i for i, (d, p) in enumerate(zip(draft, predicted)) if d != p), len(draft))
    return n, predicted[n]


def test_shipped_verify_greedy_fails_showing_the_symptom_until_both_bugs_are_fixed():
    """Check that Exercise 10.1's shipped body (the released stub's, a find-and-fix: every agreeing draft counted, even
    past the first mismatch, and the cache never rewound) fails its check showing the tokens it would write beside
    greedy decoding's, naming no cause; with the count fixed, the cache's length shows; with both fixed, it passes."""
    shipped = speculative.verify_greedy.__wrapped__  # the stub's own body (reference mode elsewhere)
    assert (
        shipped.__code__.co_filename.endswith("kvlib/speculative.py")
        and "solutions" not in shipped.__code__.co_filename
    )
    cause = r"truncate|rewind|prefix|mismatch|stop|first reject|stay"
    (first,) = _messages("10.1", verify_greedy=shipped)
    assert "where greedy decoding writes" in first and not re.search(cause, first), first
    (half,) = _messages("10.1", verify_greedy=_verify_counted_to_the_first_mismatch)
    assert "on return the cache holds" in half and not re.search(cause, half), half
    assert _messages("10.1", verify_greedy=verify_cumprod) == [""]


def test_a_failing_check_points_to_the_hint_once(learner_mode, monkeypatch):
    """Check that a failing check of notebook 10, as `kvlib check` shows it (10.1's shipped body, a find-and-fix),
    points to its hint once, in English and in Chinese: the framework's pointer, none of the checks' own."""
    from kvlib.checks import run_exercise
    from kvlib.course import i18n

    for lang, pointer in (("en", "(stuck? kvlib hint 10.1)"), ("zh-CN", "（卡住了？运行 kvlib hint 10.1）")):
        monkeypatch.setenv(i18n.ENV, lang)
        result = run_exercise(BY_ID["10.1"])
        assert result.status == "fail" and result.message.endswith(pointer), result.message
        assert result.message.count("kvlib hint") == 1, result.message


@pytest.mark.parametrize("ex_id, name, fake, words", SLIPS, ids=[f"{s[0]}-{s[2].__name__}" for s in SLIPS])
def test_check_names_the_known_mistake(ex_id, name, fake, words):
    """Check that a likely slip fails its exercise's checks with a message naming it."""
    failures = [m for m in _messages(ex_id, **{name: fake}) if m]
    assert failures, f"{fake.__name__} passed every check of {ex_id}"
    assert any(words in m for m in failures), failures


def test_speedup_sweep_counts_the_drafts_proposed_per_pass(models):
    """Check that speedup_sweep reports drafts proposed per verify pass: gamma for an oracle that always proposes
    gamma tokens, at most gamma for prompt lookup (which proposes nothing where it finds no match)."""
    (model, tokenizer), _ = models
    ids = bench_spec.repeating_prompt(tokenizer)
    truth = _plain(model, ids, 20)[0].tolist()
    sweep = bench_spec.speedup_sweep(
        model,
        {
            "oracle": lambda: bench_spec.NoisyOracle(truth + [0] * 8, 1.0),
            "lookup": lambda: speculative.LookupDrafter(3),
        },
        ids,
        12,
        (1, 3),
        rounds=1,
    )
    assert sweep["oracle"]["drafted_per_pass"] == pytest.approx([1.0, 3.0], abs=0.5)  # the last pass may draft fewer
    assert all(0 <= d <= g for d, g in zip(sweep["lookup"]["drafted_per_pass"], (1, 3)))


# ---------------------------------------------------------------------------------------------
# The formula and the benchmark's shape of report


def test_predicted_speedup_is_exercise_10_5s_tokens_per_pass_over_a_rounds_cost():
    """Check that the benchmark's predicted speedup is 10.5's tokens per pass (the reference here) over gamma c + 1:
    no copy of the prediction of its own in kvlib (issue 46), and alpha clamped into [0, 1]."""
    for alpha in (0.0, 0.3, 0.9, 1.0):
        for gamma, c in ((1, 0.0), (4, 0.25)):
            want = speculative.tokens_per_pass(alpha, gamma) / (gamma * c + 1)
            assert bench_spec.predicted_speedup(alpha, gamma, c) == pytest.approx(want)
    assert bench_spec.predicted_speedup(1.0 + 1e-12, 3, 0.0) == 4


def test_format_spec_marks_a_speedup_above_its_cap_as_noise():
    """Check that a measured speedup above 1 + accepted per pass is printed with its cap, marked, and that the goal
    line it would decide says it is no verdict (no clock: a made-up report)."""

    def row(gamma, speedup, accepted):
        return {
            "gamma": gamma, "alpha": 0.9, "drafted_per_pass": 1.0, "accepted_per_pass": accepted,
            "tokens_per_pass": 1.5, "formula_tokens_per_pass": 2.0, "predicted_speedup": 1.8, "speedup": speedup,
            "speedup_min_max": (speedup, speedup), "speedup_cap": 1 + accepted, "above_cap": speedup > 1 + accepted,
        }  # fmt: skip

    report = {
        "record": {"device": "cpu", "threads": 1, "torch": "x"},
        "cost_ratio": {"model": 0.2, "lookup": 0.1},
        "step_seconds": {"draft": 1e-3, "model": 4e-3},
        "table": {"lookup": [row(1, 1.2, 0.5), row(4, 3.0, 0.2)]},
        "prompts": {"lookup": 1},
        "prompt_tokens": {"lookup": [291]},
        "copied_share": {"lookup": 0.5},
        "copied_runs": {"lookup": [[5, 5, 22]]},
        "max_new_tokens": 64,
        "rounds": 5,
        "goals": {
            "lookup": {"goal": 2.0, "met": True, "speedup": 3.0, "best_gamma": 4, "above_cap": True, "speedup_cap": 1.2}
        },
        "identical": True,
        "lookup_counts": {},
        "bandwidth": 1e10,
        "matmul_flops": 1e10,
        "weight_bytes": 3e6,
        "forward_by_tokens": {1: 4e-3},
        "forward_ratio_by_tokens": {1: 1.0},
        "roofline_by_tokens": {1: 3e-4},
    }
    lines = bench_spec.format_spec(report).splitlines()
    assert [line.endswith("*") for line in lines if line.startswith(("    1 ", "    4 "))] == [False, True]
    assert any("1.20  3.00x" in line for line in lines)
    assert any(line.startswith("goal 2.0x: met, 3.00x") and "noise, not a verdict" in line for line in lines)


@pytest.mark.slow
def test_bench_spec_quick_reports_every_part():
    """Check that a quick `kvlib bench spec` run reports each part, with identical tokens."""
    with on_a_terminal() as err:
        report = bench_spec.bench_spec(quick=True, max_new_tokens=8)
    assert shown_progress(err.getvalue(), "kvlib bench spec")
    assert report["identical"]
    assert set(report["table"]) == {"model", "lookup", "lookup_document"}
    for rows in report["table"].values():
        for row in rows:
            assert {
                "gamma",
                "alpha",
                "tokens_per_pass",
                "drafted_per_pass",
                "accepted_per_pass",
                "speedup_cap",
                "above_cap",
                "formula_tokens_per_pass",
                "predicted_speedup",
                "speedup",
            } <= set(row)
    assert set(report["forward_by_tokens"]) == {1, 2, 4, 8, 16}
    assert set(report["goals"]) == {"model", "lookup", "lookup_document"}
    assert set(report["copied_share"]) == set(report["table"])
    assert set(report["lookup_counts"]) == {"repeating_prompt", "own_document_prompt"}
    assert set(report["lookup_counts"]["repeating_prompt"]) == set(bench_spec.LOOKUP_POLICIES)
    text = bench_spec.format_spec(report)
    assert "kvlib bench spec" in text
    assert json.loads(json.dumps(report))["identical"]  # what --json prints
    for name, what in bench_spec.WAY_TITLES.values():  # every prompt is said for what it is
        assert name in text and what in text


# ---------------------------------------------------------------------------------------------
# The benchmark's own copies of 10.4 and 10.5, called as the answer: refused while checked (exercises.READY_MADE)


def _lookup_by_the_benchmark(tokens, n, k):
    return bench_spec.lookup_policy(tokens, k, n, latest=True)


@pytest.mark.parametrize(
    "ex_id, fakes, words",
    [("10.4", {"prompt_lookup": _lookup_by_the_benchmark}, "called the benchmark's lookup policy")],
    ids=["10.4-lookup_policy"],
)
def test_the_benchmarks_copy_as_the_answer_fails_naming_it(ex_id, fakes, words):
    """Check that 10.4 answered by bench_spec.lookup_policy (a one-line call that passed every check before it was
    refused) fails each check of the exercise, naming what it called. (10.5 has no copy in kvlib to call: the
    benchmark's prediction is the learner's own tokens_per_pass.)"""
    failures = check_failures(ex_id, handed_in(speculative, NAMES, **fakes))
    assert [n for n, _ in failures] == [c.name for c in checks_for(BY_ID[ex_id])], failures
    assert all(words in str(err) and "while Exercise" in str(err) for _, err in failures), failures
