"""kvlib/generation.py (notebook 02): the reference passes every check, the stand-in's fake clock, and bad
input (empty prompt, too many tokens) gets a clear error.

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0."""

import time
from time import perf_counter as imported_perf_counter  # a learner may import the clock by name

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_slip_named, case_ids, check_failures, handed_in, spoil_everything, vandal

from kvlib import generation
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.generation import _model
from kvlib.core.model import apply_rotary, rotary_tables, rotate_half
from kvlib.course.exercises import BY_ID, reference

GEN_CHECKS = [c for i in range(1, 5) for c in checks_for(BY_ID[f"2.{i}"])]
IDS = ["2.1", "2.2", "2.3", "2.4"]


@pytest.mark.parametrize("check", GEN_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 02."""
    check.fn(generation, np.random.default_rng(0))


def test_generate_rejects_a_request_past_max_seq_len():
    """Check that asking for more tokens than the model's context says how many fit."""
    model = _model(0)  # max_seq_len 64
    with pytest.raises(ValueError, match="ask for at most 54 new tokens"):
        generation.generate(model, torch.zeros(1, 10, dtype=torch.long), 60)


def test_generate_rejects_an_empty_prompt_and_float_ids():
    """Check that an empty prompt and float token ids are named errors."""
    model = _model(0)
    with pytest.raises(ValueError, match="empty prompt"):
        generation.generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="integer token ids"):
        generation.generate(model, torch.zeros(1, 3), 3)


def test_next_token_rejects_wrong_shapes():
    """Check that next_token names the expected (batch, vocab_size) shape and a negative temperature."""
    with pytest.raises(ValueError, match=r"\(batch, vocab_size\), got \(2, 3, 4\)"):
        generation.next_token(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        generation.next_token(torch.zeros(2, 4), temperature=-1)


NAMES = ("next_token", "generate", "measure_ttft_tpot", "project_qkv")


def _module(**replaced):
    """What a learner hands in: kvlib.generation (the reference, in reference mode) with some functions replaced."""
    return handed_in(generation, NAMES, **replaced)


# ---------------------------------------------------------------------------------------------
# Other correct implementations (ALTERNATIVES) pass every check of their exercise


# 2.1 next_token ------------------------------------------------------------------------------
def next_token_gumbel(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return torch.max(logits, dim=-1).indices
    u = torch.rand(logits.shape, generator=generator).clamp_min(1e-20)
    return (logits / temperature - torch.log(-torch.log(u))).argmax(dim=-1)  # the Gumbel-max trick


def next_token_inverse_cdf(logits, temperature=0.0, generator=None):
    if not temperature:
        return logits.argmax(-1)
    cdf = torch.softmax(logits.double() / temperature, dim=-1).cumsum(dim=-1)
    u = torch.rand(logits.shape[0], 1, generator=generator, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1).clamp_max(logits.shape[-1] - 1)


def next_token_float64(logits, temperature=0.0, generator=None):
    if temperature <= 0:
        return torch.argmax(logits, dim=1)
    probs = F.softmax(logits.double() / temperature, dim=1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


# 2.2 generate --------------------------------------------------------------------------------
def _next(logits, temperature, generator):
    return reference(BY_ID["2.1"])(logits, temperature, generator)


def generate_buffer(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    B, T = input_ids.shape
    out = torch.empty(B, T + max_new_tokens, dtype=input_ids.dtype)
    out[:, :T] = input_ids
    with torch.no_grad():
        for i in range(max_new_tokens):
            token = _next(model(out[:, : T + i])[:, T + i - 1], temperature, generator)
            out[:, T + i] = token
            if on_token:
                on_token(token)
    return out


def generate_token_list(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    new = []
    with torch.inference_mode():
        while len(new) < max_new_tokens:
            logits = model(torch.cat([input_ids, *[t[:, None] for t in new]], dim=1))
            new.append(_next(logits[:, -1], temperature, generator))
            if on_token is not None:
                on_token(new[-1])
    return torch.cat([input_ids] + [t[:, None] for t in new], dim=1)


def generate_recursive(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    if max_new_tokens == 0:
        return input_ids
    with torch.no_grad():
        token = _next(model(input_ids)[:, -1, :], temperature, generator)
    if on_token is not None:
        on_token(token)
    return generate_recursive(
        model, torch.cat([input_ids, token.unsqueeze(1)], 1), max_new_tokens - 1, temperature, generator, on_token
    )


# 2.3 measure_ttft_tpot -----------------------------------------------------------------------
def measure_own_loop(model, input_ids, max_new_tokens):
    ids, stamps = input_ids, []
    start = time.monotonic()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
            stamps.append(time.monotonic())
    return stamps[0] - start, list(np.diff(stamps).astype(float))


def measure_ns(model, input_ids, max_new_tokens):
    stamps = [time.perf_counter_ns()]
    reference(BY_ID["2.2"])(
        model, input_ids, max_new_tokens, on_token=lambda token: stamps.append(time.perf_counter_ns())
    )
    seconds = [t / 1e9 for t in stamps]
    return seconds[1] - seconds[0], [b - a for a, b in zip(seconds[1:], seconds[2:])]


def measure_imported_clock(model, input_ids, max_new_tokens):
    last, gaps = imported_perf_counter(), []

    def tick(token):
        nonlocal last
        now = imported_perf_counter()
        gaps.append(now - last)
        last = now

    reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, on_token=tick)
    return float(gaps[0]), gaps[1:]


# 2.4 project_qkv -----------------------------------------------------------------------------
def project_einsum(attn, h, cos, sin):
    B, T, _ = h.shape

    def heads(W, n):
        return torch.einsum("btc,nc->btn", h, W).reshape(B, T, n, attn.head_dim).permute(0, 2, 1, 3)

    q, k = heads(attn.q_proj.weight, attn.n_heads), heads(attn.k_proj.weight, attn.n_kv_heads)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), heads(attn.v_proj.weight, attn.n_kv_heads)


def project_modules(attn, h, cos, sin):
    B, T, _ = h.shape
    D = attn.head_dim
    out = []
    for proj, n, turn in (
        (attn.q_proj, attn.n_heads, True),
        (attn.k_proj, attn.n_kv_heads, True),
        (attn.v_proj, attn.n_kv_heads, False),
    ):
        x = proj(h).view(B, T, n, D).transpose(1, 2)
        if turn:
            x1, x2 = x[..., : D // 2], x[..., D // 2 :]
            c, s = cos[:, : D // 2], sin[:, : D // 2]
            x = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)  # each pair (i, i + D/2) turned by its angle
        out.append(x)
    return tuple(out)


def project_float64(attn, h, cos, sin):
    B, T, _ = h.shape
    h64, c64, s64 = h.double(), cos.double(), sin.double()

    def heads(W, n):
        return F.linear(h64, W.double()).view(B, T, n, attn.head_dim).transpose(1, 2)

    q, k = heads(attn.q_proj.weight, attn.n_heads), heads(attn.k_proj.weight, attn.n_kv_heads)
    q, k = q * c64 + rotate_half(q) * s64, k * c64 + rotate_half(k) * s64
    return q.float(), k.float(), heads(attn.v_proj.weight, attn.n_kv_heads).float()


ALTERNATIVES = [
    ("2.1", {"next_token": next_token_gumbel}),
    ("2.1", {"next_token": next_token_inverse_cdf}),
    ("2.1", {"next_token": next_token_float64}),
    ("2.2", {"generate": generate_buffer}),
    ("2.2", {"generate": generate_token_list}),
    ("2.2", {"generate": generate_recursive}),
    ("2.3", {"measure_ttft_tpot": measure_own_loop}),
    ("2.3", {"measure_ttft_tpot": measure_ns}),
    ("2.3", {"measure_ttft_tpot": measure_imported_clock}),
    ("2.4", {"project_qkv": project_einsum}),
    ("2.4", {"project_qkv": project_modules}),
    ("2.4", {"project_qkv": project_float64}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that another correct way of writing the exercise passes every one of its checks."""
    with np.errstate(all="ignore"):
        assert not check_failures(ex_id, _module(**replaced))


def test_every_exercise_has_three_alternatives():
    """Check that ALTERNATIVES covers each exercise of notebook 02 three times or more."""
    counts = {ex_id: sum(c[0] == ex_id for c in ALTERNATIVES) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# Likely slips (SLIPS) fail their check, or their exercise's checks, with a message naming them


def _sample_without_temperature(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)


def _greedy_keepdim(logits, temperature=0.0, generator=None):
    return logits.argmax(-1, keepdim=True)


def _generate_from_first_position(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    ids = input_ids
    for _ in range(max_new_tokens):
        token = model(ids)[:, 0].argmax(-1)  # the slip: the first position's logits
        ids = torch.cat([ids, token[:, None]], 1)
    return ids


def _measure_whole_generation(model, input_ids, max_new_tokens):
    start = time.perf_counter()
    generation.generate(model, input_ids, max_new_tokens)
    total = time.perf_counter() - start
    return total, [total / max_new_tokens] * (max_new_tokens - 1)


# 2.1
def next_token_no_temperature(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)


def next_token_times_temperature(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits * temperature, -1), 1, generator=generator).squeeze(-1)


def next_token_global_rng(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits / temperature, -1), 1).squeeze(-1)


def next_token_reseeds(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(
        torch.softmax(logits / temperature, -1), 1, generator=torch.Generator().manual_seed(0)
    ).squeeze(-1)


def next_token_always_argmax(logits, temperature=0.0, generator=None):
    return logits.argmax(-1)


def next_token_keepdim(logits, temperature=0.0, generator=None):
    return logits.argmax(-1, keepdim=True)


# 2.2
def generate_first_position(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    ids = input_ids
    for _ in range(max_new_tokens):
        token = _next(model(ids)[:, 0], temperature, generator)
        ids = torch.cat([ids, token[:, None]], 1)
        if on_token:
            on_token(token)
    return ids


def generate_never_appends(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    new = []
    for _ in range(max_new_tokens):
        new.append(_next(model(input_ids)[:, -1], temperature, generator))
        if on_token:
            on_token(new[-1])
    return torch.cat([input_ids, torch.stack(new, 1)], 1)


def generate_greedy_only(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    return reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, on_token=on_token)


def generate_new_tokens_only(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    return reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, temperature, generator, on_token)[
        :, input_ids.shape[1] :
    ]


def generate_callback_at_end(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    out = reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, temperature, generator)
    if on_token:
        on_token(out[:, input_ids.shape[1] :])
    return out


# 2.3
def _stamps(model, input_ids, max_new_tokens):
    start, stamps = time.perf_counter(), []
    reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, on_token=lambda token: stamps.append(time.perf_counter()))
    return start, stamps


def measure_without_prefill(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return gaps[0], gaps  # TTFT taken as the first decode step: the prefill left out


def measure_average_tpot(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    average = (stamps[-1] - start) / max_new_tokens  # over all steps, the prefill included
    return stamps[0] - start, [average] * (max_new_tokens - 1)


def measure_whole_generation(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    return stamps[-1] - start, [b - a for a, b in zip(stamps, stamps[1:])]


def measure_clock_readings(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    return stamps[0], [b - a for a, b in zip(stamps, stamps[1:])]


def measure_ttft_in_tpots(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    times = [start] + stamps
    gaps = [b - a for a, b in zip(times, times[1:])]
    return gaps[0], gaps


# 2.4
def _project(
    attn, h, cos, sin, *, rotate_q=True, rotate_k=True, rotate_v=False, split="right", angles=None, pairs="half"
):
    B, T, _ = h.shape
    D = attn.head_dim
    if angles == "from zero":
        cos, sin = rotary_tables(D, T)

    def heads(W, n):
        x = h @ W.T
        return x.view(B, T, n, D).transpose(1, 2) if split == "right" else x.view(B, n, T, D)

    def turn(x):
        if pairs == "half":
            return x * cos + rotate_half(x) * sin
        c, s = cos[:, : D // 2].repeat_interleave(2, -1), sin[:, : D // 2].repeat_interleave(2, -1)
        return x * c + torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2) * s

    q, k, v = (
        heads(attn.q_proj.weight, attn.n_heads),
        heads(attn.k_proj.weight, attn.n_kv_heads),
        heads(attn.v_proj.weight, attn.n_kv_heads),
    )
    return (turn(q) if rotate_q else q), (turn(k) if rotate_k else k), (turn(v) if rotate_v else v)


def project_all_query_heads(attn, h, cos, sin):
    B, T, _ = h.shape
    q, _, _ = _project(attn, h, cos, sin)
    return q, q, q  # k and v with n_heads heads, as if every layer were MHA


# (check or exercise, replaced functions, words the failure must contain)
SLIPS = [
    ("next_token_samples_from_softmax", {"next_token": _sample_without_temperature}, "temperature changes nothing"),
    ("next_token_greedy_is_argmax", {"next_token": _greedy_keepdim}, "shape (3,)"),
    ("generate_matches_greedy_loop", {"generate": _generate_from_first_position}, "first position"),
    (
        "measure_ttft_tpot_times_prefill_and_steps",
        {"measure_ttft_tpot": _measure_whole_generation},
        "the whole generation",
    ),
    ("2.1", {"next_token": next_token_no_temperature}, "temperature changes nothing"),
    ("2.1", {"next_token": next_token_times_temperature}, "multiplied by the temperature"),
    ("2.1", {"next_token": next_token_global_rng}, "use the generator you are given"),
    ("2.1", {"next_token": next_token_reseeds}, "do not reseed it"),
    ("2.1", {"next_token": next_token_always_argmax}, "every draw is the top token"),
    ("2.1", {"next_token": next_token_keepdim}, "shape (3,)"),
    ("2.2", {"generate": generate_first_position}, "first position"),
    ("2.2", {"generate": generate_never_appends}, "feed each chosen token back"),
    ("2.2", {"generate": generate_greedy_only}, "pass temperature"),
    ("2.2", {"generate": generate_new_tokens_only}, "(batch, 5 + 7)"),
    ("2.2", {"generate": generate_callback_at_end}, "once per new token"),
    ("2.3", {"measure_ttft_tpot": measure_without_prefill}, "the prefill was left out"),
    ("2.3", {"measure_ttft_tpot": measure_average_tpot}, "an average"),
    ("2.3", {"measure_ttft_tpot": measure_whole_generation}, "the whole generation"),
    ("2.3", {"measure_ttft_tpot": measure_clock_readings}, "clock reading"),
    ("2.3", {"measure_ttft_tpot": measure_ttft_in_tpots}, "the first entry is the prefill"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, rotate_v=True)}, "v is rotated"),
    (
        "2.4",
        {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, rotate_q=False, rotate_k=False)},
        "q is not rotated",
    ),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, rotate_k=False)}, "k is not rotated"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, split="wrong")}, "heads are split wrongly"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, angles="from zero")}, "positions 0, 1"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, pairs="neighbours")}, "neighbouring features"),
    ("2.4", {"project_qkv": project_all_query_heads}, "n_kv_heads heads"),
]


@pytest.mark.parametrize("where, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(where, replaced, words):
    """Check that a likely wrong implementation fails the check named (with an AssertionError), or the exercise
    named (its first failing check, as `kvlib check` reports it), with a message that names the slip."""
    assert_slip_named(where, _module(**replaced), words)


def test_every_exercise_has_three_slips():
    """Check that SLIPS holds three or more likely slips for each exercise of notebook 02."""
    counts = {ex_id: sum(c[0] == ex_id for c in SLIPS) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# A function that vandalises its arguments scores 0 on every check


VANDAL_CHECKS = [c for ex_id in ("2.1", "2.2", "2.3", "2.4") for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", VANDAL_CHECKS, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that zeroing the arrays, tensors, weights or config a check passes cannot make it expect the wrong answer."""
    ex = check.exercise
    module = _module(**{ex.name: vandal(reference(ex), spoil_everything)})
    with np.errstate(all="ignore"), pytest.raises(Exception):  # noqa: B017 - any failure is a score of 0
        check.fn(module, np.random.default_rng(0))


def test_the_stand_in_clock_is_fake_and_restored():
    """Check that 2.3's stand-in charges its fake clock, never real time, and gives the real clocks back."""
    from kvlib.checks.generation import _stand_in

    model = _stand_in()
    real = time.perf_counter
    with model.fake_clock(_module()):
        start = time.perf_counter()
        model(torch.zeros(1, 10, dtype=torch.long))  # a prefill: 10 new tokens + a tenth of 10
        prefill = time.perf_counter() - start
        model(torch.zeros(1, 11, dtype=torch.long))  # a naive decode step: 1 new + a tenth of 11
        step = time.perf_counter() - start - prefill
        assert (
            imported_perf_counter is not time.perf_counter
        )  # module imports are faked too... by name only when passed
    assert time.perf_counter is real
    assert prefill == pytest.approx(0.11) and step == pytest.approx(0.021)


@pytest.mark.slow
def test_timing_checks_read_the_fake_clock_in_the_isolated_child():
    """Check that 2.3's checks judge a learner's file in the isolated grader by the stand-in's fake
    clock, even when the file imports the clock by name; an averaged TPOT still fails there."""
    from kvlib.core.paths import ROOT
    from kvlib.grading.sandbox import Sandbox, package_files

    source = (ROOT / "solutions" / "kvlib" / "generation.py").read_text(encoding="utf-8")
    by_name = source.replace("import time\n", "import time\nfrom time import perf_counter\n", 1).replace(
        "time.perf_counter()", "perf_counter()"
    )
    averaged = source.replace(
        "    return ttft, [b - a for a, b in zip(times, times[1:])]",
        "    return ttft, [(times[-1] - start) / max_new_tokens] * (max_new_tokens - 1)",
    )
    assert by_name != source and averaged != source
    functions = [f"generation.{BY_ID[i].name}" for i in ("2.1", "2.2", "2.3", "2.4")]
    for text, passes in ((by_name, True), (averaged, False)):
        files = package_files(ROOT / "kvlib")
        files["kvlib/generation.py"] = text.encode()
        with Sandbox(
            files, ["generation"], functions, mode="plain", torch=True, call_timeout=60, budget=300
        ) as sandbox:
            module = sandbox.module("generation")
            check = CHECKS["measure_ttft_tpot_times_prefill_and_steps"]
            if passes:
                check.fn(module, np.random.default_rng(0))
                CHECKS["project_qkv_matches_tiny_layer_0"].fn(module, np.random.default_rng(0))
            else:
                with pytest.raises(AssertionError, match="an average"):
                    check.fn(module, np.random.default_rng(0))
