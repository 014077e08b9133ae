"""Checks for notebook 04 (kvlib/kv_cache.py): exercises 4.1-4.6.

Every cached result is compared with full recompute on small random GQA decoders (batch 2, 4 query
heads, 2 KV heads, every size distinct). Each check works out what it expects BEFORE the learner's
code runs, from its own copy of the model and of every tensor (the learner's function may change
what it is given). The cache exercises are graded on using the cache: a decode step must read what
the cache holds (overwrite the cache and the answer must follow), and the tokens it runs through each
layer's MLP must not grow with the prefix; a prefill runs the prompt once. In the isolated grader the
MLPs run, and are counted, in the grader (GradersMLPs), and a long cache's updates are judged by the
memory they hold, which the grading process reads in the child's /proc: nothing the learner's code
does in its own process reaches those counts.
Named slips: rotary positions restarting at 0, is_causal=True for new queries against more keys,
torch.cat that reallocates, writes that clobber stored tokens, a cache not reset between prompts,
recomputing from the token ids, a prompt fed one token at a time; in the cache's bytes, n_heads for
n_kv_heads, the factor 2 for K and V, the layers, bits for bytes, the batch; in the sequences that fit (4.6, a
prediction graded against the count, then against what torch allocates), the weights left out or counted per
sequence, the cache or the weights in another dtype, tokens for sequences, a fraction or a negative count, the
weights as the matrices alone (matrix_params, which notebook 04b uses later).
The texts a message is built from (a slip's name, which call or case) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F

from kvlib.checks import MB, check, held_nothing_before, isolated
from kvlib.core.configs import REAL_MODELS
from kvlib.core.model import Decoder, ModelConfig, matrix_params, num_params
from kvlib.core.weights import load_tiny
from kvlib.course.i18n import tr

CONFIG = ModelConfig(vocab_size=29, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, hidden_dim=40, max_seq_len=48)
L, H, H_KV, D = CONFIG.n_layers, CONFIG.n_heads, CONFIG.n_kv_heads, CONFIG.head_dim


def _model(seed: int = 0) -> Decoder:
    """A fresh model: one for the learner's code, another with the same weights for the expected answer."""
    torch.manual_seed(seed)
    return Decoder(CONFIG).eval()


def _ids(rng, batch, n):
    return torch.from_numpy(rng.integers(0, CONFIG.vocab_size, size=(batch, n)))


def _close(a, b) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5)
    )


def _cache(kv, batch=2, max_seq_len=None):
    return kv.KVCache(CONFIG, batch=batch, max_seq_len=max_seq_len)


class GradersMLPs:
    """A model whose every layer's MLP, and its output head, stay with the grader: handed to the learner's code in the
    isolated child, the model goes there without their weights, and each layer.mlp(x) and lm_head(x) there is run,
    and counted, here."""

    kvlib_remote_mlps = True

    def __init__(self, decoder: Decoder):
        self.decoder, self.calls, self.heads = decoder, [], []  # (layer, tokens fed) of every MLP call; head calls
        self.mlps = [_Counted(layer.mlp, i, self.calls) for i, layer in enumerate(decoder.layers)]
        self.head = _CountedHead(decoder.lm_head, "head", self.heads)


def _rows(x) -> int:
    """Tokens per sequence of a layer's input: (batch, seq_len, d_model), or (batch, d_model) for one."""
    return int(x.shape[1]) if x.dim() == 3 else 1


class _Counted:
    kvlib_public = ("forward",)  # not its weights: the learner's code can only call it

    def __init__(self, part, tag, calls: list):
        self._part, self._tag, self._calls = part, tag, calls

    def __call__(self, x):
        self._calls.append((self._tag, _rows(x)))
        with torch.inference_mode():
            return self._part(x)

    forward = __call__


class _CountedHead(_Counted):
    kvlib_public = ("forward", "weight")  # the head's weight may be read (a head in float64): its calls are counted

    @property
    def weight(self) -> torch.Tensor:
        return self._part.weight.detach()


class _LocalCounted(torch.nn.Module):
    """A layer's MLP, or the output head, that records (tag, tokens) of each call, in a local run (the learner's own
    process)."""

    def __init__(self, part, tag, calls: list):
        super().__init__()
        self.inner, self.tag, self.calls = part, tag, calls

    def forward(self, x):
        self.calls.append((self.tag, _rows(x)))
        return self.inner(x)

    @property
    def weight(self) -> torch.Tensor:  # a head's weight, read as the isolated grader's _CountedHead lets it be
        return self.inner.weight


def _counted(fn, decoder: Decoder):
    """(model, calls, heads): the model to hand fn, each of whose layers' MLP appends (layer, tokens per row) to calls,
    and its output head ("head", positions per row) to heads. In the isolated grader they stay here (GradersMLPs) and
    run, and are counted, in the grader, where no code beside the learner's can hide or fake a call; locally they are
    wrapped in place."""
    if isolated(fn):
        counted = GradersMLPs(decoder)
        return counted, counted.calls, counted.heads
    calls: list[tuple[int, int]] = []
    heads: list[tuple[str, int]] = []
    for i, layer in enumerate(decoder.layers):
        layer.mlp = _LocalCounted(layer.mlp, i, calls)
    decoder.lm_head = _LocalCounted(decoder.lm_head, "head", heads)
    return decoder, calls, heads


def _mlp_passes(fn, model, *args) -> int:
    """How many times fn(model, *args) runs a layer's MLP: n_layers for each forward pass (_counted)."""
    counted, calls, _ = _counted(fn, model)
    fn(counted, *args)
    return len(calls)


def _mlp_tokens(calls) -> int:
    """Tokens (per sequence of the batch) the calls ran through the MLPs, summed over layers and calls."""
    return sum(tokens for _, tokens in calls)


def _keys_values(model, ids) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's keys and values (B, H_kv, T, D) of a full forward over ids: what a cache of ids holds."""
    T = ids.shape[1]
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    out = []
    with torch.inference_mode():
        x = model.embed(ids)
        for layer in model.layers:
            out.append(layer.attn.project_kv(layer.attn_norm(x), cos, sin))
            x = layer(x, cos, sin)
    return out


def _fill(cache, kvs) -> None:
    """Replace what the cache holds with kvs, through its own reset, update and advance."""
    cache.reset()
    for layer, (k, v) in enumerate(kvs):
        cache.update(layer, k.clone(), v.clone())
    cache.advance(kvs[0][0].shape[2])


# ---------------------------------------------------------------------------------------------
# 4.1 KVCache.update


_LONG = 65_536  # max_seq_len of the cache whose updates the isolated grader measures: 25 MB of keys, as many values


def _reallocates(kv, rng) -> None:
    """In the isolated grader: fail if making a long cache holds more than it, or an update holds a sizable part of it
    (the grading process measures the child's memory, kvlib.grading.memory)."""
    made, usage = kv.KVCache.memory(dataclasses.replace(CONFIG, max_seq_len=_LONG), batch=2, max_seq_len=_LONG)
    size = 2 * L * 2 * H_KV * _LONG * D * 4  # k and v, float32
    assert usage.beyond_inputs <= size + size // 4, (
        f"KVCache(config, batch=2, max_seq_len={_LONG:,}) held {usage.beyond_inputs / MB:.0f} MB at its peak (the "
        f"grader measures the process's memory), and its k and v need {size / MB:.0f} MB: allocate them once, and "
        "nothing else of that size"
    )
    for step, (layer, T) in enumerate(((0, 3), (1, 3), (2, 3), (0, 1))):
        k_new, v_new = _randn(rng, 2, H_KV, T, D), _randn(rng, 2, H_KV, T, D)
        _, usage = made.update.memory(layer, k_new, v_new)
        held_nothing_before(usage, "KVCache.update", allowed=size)
        assert usage.beyond_inputs < size // 8, (
            f"update({layer}, ...) #{step + 1} on a cache of max_seq_len {_LONG:,} held {usage.beyond_inputs / MB:.0f} "
            f"MB beyond its inputs at its peak (the grader measures the process's memory); the cache's keys are "
            f"{size / 2 / MB:.0f} MB: the cache was reallocated (a new tensor the size of its storage, made at each update)"
        )
        if layer == L - 1:
            made.advance(3)


def _randn(rng, *shape) -> torch.Tensor:
    return torch.from_numpy(rng.normal(size=shape)).float()


@check("4.1")
def kv_cache_update_writes_in_place(kv, rng):
    """Check that update stores one layer's new keys and values in the storage made once, and returns what it holds.

    Reallocation is judged by the cache's address in a local run, by the memory an update of a long cache holds
    in the isolated grader (measured by the grading process)."""
    cache = _cache(kv, max_seq_len=10)
    remote = isolated(kv.KVCache)
    storage = None if remote else (cache.k.data_ptr(), cache.v.data_ptr())
    k1, v1 = torch.randn(2, H_KV, 3, D), torch.randn(2, H_KV, 3, D)
    k, v = cache.update(1, k1.clone(), v1.clone())
    assert tuple(k.shape) == (2, H_KV, 3, D) and tuple(v.shape) == (2, H_KV, 3, D), (
        f"after 3 tokens update should return (2, {H_KV}, 3, {D}), got {tuple(k.shape)}"
    )
    if remote:
        _reallocates(kv, rng)
    else:
        assert (cache.k.data_ptr(), cache.v.data_ptr()) == storage, (
            "the cache was reallocated: after update, self.k / self.v are new tensors, not the storage made once"
        )
    assert torch.equal(k, k1) and torch.equal(v, v1), (
        "update should return the keys and values stored so far (here the 3 just written)"
    )
    assert torch.equal(cache.k[1, :, :, :3], k1) and torch.equal(cache.v[1, :, :, :3], v1), (
        "k_new, v_new should land at positions 0..2 of layer 1"
    )
    assert not cache.k[0].any() and not cache.k[2].any(), "update(1, ...) must leave the other layers alone"
    assert cache.pos == 0, "update moved pos: it should leave pos as it was (advance() moves it)"


@check("4.1")
def kv_cache_grows_one_slot_per_step(kv, rng):
    """Check that a prompt of 3, then steps of 1, 1, 2 and 1 tokens in every layer, keep every stored token intact."""
    cache = _cache(kv, max_seq_len=12)
    expect_k, expect_v = torch.zeros(L, 2, H_KV, 12, D), torch.zeros(L, 2, H_KV, 12, D)
    pos = 0
    for T in (3, 1, 1, 2, 1):  # the prompt, then decode steps and a chunk of 2
        for layer in range(L):
            new_k, new_v = torch.randn(2, H_KV, T, D), torch.randn(2, H_KV, T, D)
            expect_k[layer, :, :, pos : pos + T], expect_v[layer, :, :, pos : pos + T] = new_k, new_v
            k, v = cache.update(layer, new_k.clone(), new_v.clone())
            what = tr("layer {layer}, {T} token(s) at pos {pos}", layer=layer, T=T, pos=pos)
            assert tuple(k.shape) == (2, H_KV, pos + T, D), (
                f"{what}: update should return {pos + T} positions, got {tuple(k.shape)}"
            )
            stored_k, stored_v = cache.k, cache.v
            bad = [p for p in range(pos) if not torch.equal(stored_k[:, :, :, p], expect_k[:, :, :, p])]
            assert not bad, f"{what}: the keys stored earlier at position(s) {bad} were overwritten by this update"
            other = [
                i
                for i in range(L)
                if not torch.equal(stored_k[i], expect_k[i]) or not torch.equal(stored_v[i], expect_v[i])
            ]
            assert not other, (
                f"{what}: layer(s) {other} do not hold what was written to them: an update of one layer changed another"
            )
            assert torch.equal(k, expect_k[layer, :, :, : pos + T]) and torch.equal(
                v, expect_v[layer, :, :, : pos + T]
            ), f"{what}: update should return that layer's filled prefix, positions 0..{pos + T - 1}"
        cache.advance(T)
        pos += T


# ---------------------------------------------------------------------------------------------
# 4.2 cached_attention


def _full_rows(model, x):
    """Reference: layer 0's attention over the whole sequence x (B, S, C)."""
    S = x.shape[1]
    with torch.inference_mode():
        return model.layers[0].attn(x, model.rope_cos[:S], model.rope_sin[:S])


def _attend(attn, q, k, v, **kw):
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    return attn.o_proj(out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1))


def _attention(kv, attn, x, cache, rope_cos, rope_sin):
    """kv.cached_attention on layer 0, a tensor-size error raised inside it named: this layer is GQA."""
    try:
        return kv.cached_attention(attn, x, cache, 0, rope_cos, rope_sin)
    except RuntimeError as err:
        if "while Exercise" in str(err) or not re.search(r"size|shape|dimension", str(err)):
            raise
        raise AssertionError(
            f"cached_attention raised RuntimeError ({str(err)[:120]}) on a GQA layer: its {H} query heads share "
            f"{H_KV} key/value heads, and the cache holds n_kv_heads = {H_KV} heads, not n_heads. Each key/value head "
            f"serves n_heads // n_kv_heads = {H // H_KV} query heads: the code assumed one each"
        ) from err


def _run_chunks(kv, model, x, split):
    """cached_attention over x[:, :split] on an empty cache, then over the rest: the two outputs."""
    attn, cache = model.layers[0].attn, _cache(kv)
    with torch.inference_mode():
        first = _attention(kv, attn, x[:, :split].clone(), cache, model.rope_cos, model.rope_sin)
        cache.advance(split)
        second = _attention(kv, attn, x[:, split:].clone(), cache, model.rope_cos, model.rope_sin)
    return first, second


@check("4.2")
def cached_attention_matches_full_attention(kv, rng):
    """Check that a prompt of 3 then a chunk of 2 through the cache equals attention over all 5 at once."""
    seed = int(rng.integers(1000))
    x = torch.from_numpy(rng.normal(size=(2, 5, CONFIG.d_model))).float()
    ref = _model(seed)
    full = _full_rows(ref, x)
    attn, cos, sin = ref.layers[0].attn, ref.rope_cos, ref.rope_sin
    with torch.inference_mode():  # the classic wrong answers, worked out now
        k_all, v_all = attn.project_kv(x, cos[:5], sin[:5])
        k0, v0 = k_all.clone(), v_all.clone()
        k0[:, :, 3:], v0[:, :, 3:] = attn.project_kv(x[:, 3:], cos[:2], sin[:2])  # positions 0, 1 instead of 3, 4
        from_zero = _attend(
            attn,
            attn.project_q(x[:, 3:], cos[:2], sin[:2]),
            k0,
            v0,
            attn_mask=torch.tril(torch.ones(2, 5, dtype=torch.bool), 3),
        )
        top_left = _attend(attn, attn.project_q(x[:, 3:], cos[3:5], sin[3:5]), k_all, v_all, is_causal=True)
        unmasked = _attend(attn, attn.project_q(x[:, :3], cos[:3], sin[:3]), k_all[:, :, :3], v_all[:, :, :3])
        q3 = attn.project_q(x[:, :3], cos[:3], sin[:3])
        joined = F.scaled_dot_product_attention(q3, k_all[:, :, :3], v_all[:, :, :3], is_causal=True, enable_gqa=True)
        joined = joined.transpose(1, 2).reshape(x.shape[0], 3, -1)  # the heads joined, no o_proj
    first, second = _run_chunks(kv, _model(seed), x, 3)
    assert isinstance(second, torch.Tensor) and tuple(second.shape) == (2, 2, CONFIG.d_model), (
        f"the output should be (batch, seq_len, d_model) = (2, 2, {CONFIG.d_model}), got {tuple(getattr(second, 'shape', ()))}"
    )
    if not _close(first, full[:, :3]) and _close(first, unmasked):
        raise AssertionError(
            "a prefill of 3 tokens ran without a causal mask: with more than one new query, query i may not see "
            "the keys after it (a single decode query may see all of them, so only T == 1 can skip the mask)"
        )
    if not _close(first, full[:, :3]) and _close(first, joined):
        raise AssertionError(
            "the first chunk is attention's heads joined, without the layer's output projection (attn.o_proj)"
        )
    assert _close(first, full[:, :3]), (
        "the first chunk (positions 0..2, empty cache) differs from plain causal attention over those 3 tokens"
    )
    if not _close(second, full[:, 3:]):
        if _close(second, from_zero):
            raise AssertionError(
                "the rotary positions restart at 0: the 2 new tokens were turned as if at positions 0 and 1, and they "
                "sit at 3 and 4, after the 3 cached"
            )
        if _close(second, top_left):
            raise AssertionError(
                "the mask is aligned top-left (is_causal=True): 2 new queries against 5 keys sit at positions 3 and 4"
            )
        raise AssertionError(
            "the second chunk (positions 3, 4 against 5 keys) differs from attention over the full sequence"
        )


@check("4.2")
def cached_attention_one_token_sees_every_key(kv, rng):
    """Check that one decode-step query attends to all cached keys, not just the first."""
    x = torch.from_numpy(rng.normal(size=(2, 7, CONFIG.d_model))).float()
    ref = _model(1)
    full = _full_rows(ref, x)
    attn = ref.layers[0].attn
    with torch.inference_mode():
        q = attn.project_q(x[:, 6:], ref.rope_cos[6:7], ref.rope_sin[6:7])
        k, v = attn.project_kv(x, ref.rope_cos[:7], ref.rope_sin[:7])
        only_first, only_self = _attend(attn, q, k, v, is_causal=True), _attend(attn, q, k[:, :, 6:], v[:, :, 6:])
    _, last = _run_chunks(kv, _model(1), x, 6)
    if not _close(last, full[:, 6:]):
        if _close(last, only_first):
            raise AssertionError(
                "the decode query at position 6 saw key 0 only, of the 7 it may see (a causal mask aligned top-left, "
                "as is_causal=True aligns it)"
            )
        if _close(last, only_self):
            raise AssertionError("the decode query saw only its own key, not the 6 cached before it")
        raise AssertionError(
            "the decode-step output (position 6, against 7 keys) differs from full attention's last row"
        )


@check("4.2")
def cached_attention_reads_the_cache(kv, rng):
    """Check that a decode step attends to what the cache holds: other stored keys and values, another output."""
    x = torch.from_numpy(rng.normal(size=(2, 7, CONFIG.d_model))).float()
    other = torch.from_numpy(rng.normal(size=(2, 6, CONFIG.d_model))).float()  # what the cache is made to hold instead
    ref = _model(2)
    attn, cos, sin = ref.layers[0].attn, ref.rope_cos, ref.rope_sin
    with torch.inference_mode():
        k_other, v_other = attn.project_kv(other, cos[:6], sin[:6])
        k_new, v_new = attn.project_kv(x[:, 6:], cos[6:7], sin[6:7])
        q = attn.project_q(x[:, 6:], cos[6:7], sin[6:7])
        expected = _attend(attn, q, torch.cat([k_other, k_new], 2), torch.cat([v_other, v_new], 2))
        ignored = _full_rows(ref, x)[:, 6:]  # what a step that kept its own copy of the inputs would give
    model, cache = _model(2), _cache(kv)
    with torch.inference_mode():
        _attention(kv, model.layers[0].attn, x[:, :6].clone(), cache, model.rope_cos, model.rope_sin)
        cache.advance(6)
        _fill(cache, [(k_other, v_other)] + [(torch.zeros_like(k_other), torch.zeros_like(v_other))] * (L - 1))
        step = _attention(kv, model.layers[0].attn, x[:, 6:].clone(), cache, model.rope_cos, model.rope_sin)
    if not _close(step, expected):
        if _close(step, ignored):
            raise AssertionError(
                "the step ignored the keys and values in the cache (it recomputed them from the inputs it saw)"
            )
        raise AssertionError("after the cache was filled with other keys and values, the step should attend to those")


# ---------------------------------------------------------------------------------------------
# 4.3 cached_forward: prefill and decode step


@check("4.3")
def cached_forward_matches_full_forward(kv, rng):
    """Check that a prefill of 4, a chunk of 3 and three decode steps each give a full forward's last logits."""
    ids = _ids(rng, 2, 10)
    with torch.inference_mode():
        full = _model(3)(ids)  # (2, 10, vocab): expected, from a model the learner never sees
    model, cache = _model(3), _cache(kv)
    with torch.inference_mode():
        for a, b in ((0, 4), (4, 7), (7, 8), (8, 9), (9, 10)):
            logits = kv.cached_forward(model, ids[:, a:b].clone(), cache)
            what = (
                tr("the prefill")
                if a == 0
                else tr("the chunk of {n}", n=b - a)
                if b - a > 1
                else tr("the decode step at position {a}", a=a)
            )
            assert isinstance(logits, torch.Tensor) and tuple(logits.shape) == (2, CONFIG.vocab_size), (
                f"{what} should return the last position's logits (batch, vocab_size) = (2, {CONFIG.vocab_size}), "
                f"got {tuple(getattr(logits, 'shape', ()))}"
            )
            assert cache.pos == b, (
                f"after {what} ({b - a} new token(s) after {a}) cache.pos is {cache.pos}, and the cache should hold {b} "
                f"tokens: it moved by {cache.pos - a} (this check's model has {model.config.n_layers} layers)"
            )
            assert _close(logits, full[:, b - 1]), f"{what} differs from a full forward over tokens 0..{b - 1}"


@check("4.3")
def cached_forward_decode_uses_the_cache(kv, rng):
    """Check that a decode step reads what the cache holds, and that the tokens it runs do not grow with the prefix."""
    prompt, other, token = _ids(rng, 2, 6), _ids(rng, 2, 6), _ids(rng, 2, 1)
    ref = _model(4)
    with torch.inference_mode():
        expected = ref(torch.cat([other, token], 1))[:, -1]  # the cache will hold `other`, not the prompt
        recomputed = ref(torch.cat([prompt, token], 1))[:, -1]
        other_kv = _keys_values(ref, other)
    model, cache = _model(4), _cache(kv)
    with torch.inference_mode():
        kv.cached_forward(model, prompt.clone(), cache)
        _fill(cache, other_kv)
        step = kv.cached_forward(model, token.clone(), cache)
    if not _close(step, expected):
        if _close(step, recomputed):
            raise AssertionError(
                "the decode step gave the logits of the tokens it was fed, not of the keys and values in the cache: "
                "it recomputes from the token ids, so the cache is never read"
            )
        raise AssertionError(
            "after the cache was filled with another prompt's keys and values, the step should continue that prompt"
        )
    tokens = {}  # what a decode step runs through each layer's MLP: 1 new token, however long the prefix
    for n in (4, 36):
        model, calls, _ = _counted(kv.cached_forward, _model(4))
        cache = _cache(kv)
        with torch.inference_mode():
            kv.cached_forward(model, _ids(rng, 2, n), cache)
            del calls[:]
            kv.cached_forward(model, _ids(rng, 2, 1), cache)
        tokens[n] = _mlp_tokens(calls)
    assert tokens[4] > 0, "a decode step ran no token through the layers' MLPs"
    assert tokens[36] <= tokens[4], (
        f"a decode step after 36 cached tokens ran {tokens[36]} tokens through the layers' MLPs, after 4 tokens "
        f"{tokens[4]}: the step recomputes the earlier tokens instead of reading their keys and values from the cache"
        + (" (the MLPs run, and are counted, by the grader)" if isolated(kv.cached_forward) else "")
    )
    assert tokens[4] == L, (
        f"a decode step after 4 cached tokens ran {tokens[4]} tokens through the {L} layers' MLPs, for one new token "
        f"and {L} layers"
    )


@check("4.3")
def cached_forward_prefill_runs_once(kv, rng):
    """Check that a prefill runs the whole prompt through the model in one pass, not one token at a time, and computes
    no logits it does not return."""
    model, cache = _model(5), _cache(kv)
    one = _mlp_passes(kv.cached_forward, model, _ids(rng, 2, 1), cache)
    model, calls, heads = _counted(kv.cached_forward, _model(5))
    kv.cached_forward(model, _ids(rng, 2, 12), _cache(kv))
    twelve = len(calls)
    assert one > 0, "a forward over one token ran no layer's MLP"
    assert twelve <= one, (
        f"a prefill of 12 tokens ran the MLPs {twelve / one:.0f} times as often as a decode step: the prompt went through the "
        "model in pieces (one token at a time?), not in one forward pass"
    )
    positions = sum(rows for _, rows in heads)  # 0 when the head's weight is applied by hand (a float64 head)
    assert positions <= 1, (
        f"a prefill of 12 tokens computed {positions} rows of logits per sequence and returned one (the checks count "
        "the output head's work): a prompt of 8,000 tokens and a vocabulary of 128,000 would make 4 GB of logits to "
        "keep one row" + (" (the head runs, and is counted, in the grader)" if isolated(kv.cached_forward) else "")
    )


# ---------------------------------------------------------------------------------------------
# 4.4 kv_cache_bytes


def _kv_bytes(c, seq_len, batch, dtype) -> int:
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * torch.empty((), dtype=dtype).element_size() * seq_len * batch


@check("4.4")
def kv_cache_bytes_of_real_models(kv, rng):
    """Check KiB per token in float16 for Falcon-7B's MQA (8), Llama-2-70B (320) and Llama-2-7B (512)."""
    # MQA first: its 71 query heads per KV head cannot be mistaken for the 8 of bits for bytes
    for name, kib in (("Falcon-7B", 8), ("Llama-2-70B", 320), ("Llama-2-7B", 512)):
        c, expected = REAL_MODELS[name].config, kib * 1024
        got = kv.kv_cache_bytes(
            dataclasses.replace(c), 1, 1, torch.float16
        )  # a copy: what the call does to it stays there
        assert isinstance(got, int), f"kv_cache_bytes should return an int number of bytes, got {type(got).__name__}"
        hints = {
            expected // 2: tr("exactly half: keys and values are both cached (the factor 2)"),
            expected // c.n_layers: tr(
                "that is one layer's cache: each of the n_layers layers keeps its own keys and values"
            ),
            expected * c.n_heads // c.n_kv_heads: tr(
                "the cache holds n_kv_heads heads, not n_heads (this model shares them), "
                "each head_dim = d_model // n_heads wide: not d_model numbers"
            ),
            expected * 8: tr("8 times too large: count bytes, not bits"),
        }
        for wrong, hint in hints.items():
            if got == wrong and wrong != expected:
                raise AssertionError(f"{name}: {hint}")
        assert got == expected, f"{name} in float16: expected {kib} KiB ({expected:,} bytes) per token, got {got:,}"


@check("4.4")
def kv_cache_bytes_scales_with_tokens_batch_and_dtype(kv, rng):
    """Check the cache of several tokens and sequences, in float32 and bfloat16, on a small GQA config."""
    for seq_len, batch, dtype in ((5, 3, torch.float32), (17, 2, torch.bfloat16), (0, 4, torch.float32)):
        expected = _kv_bytes(CONFIG, seq_len, batch, dtype)
        got = kv.kv_cache_bytes(dataclasses.replace(CONFIG), seq_len, batch, dtype)
        if seq_len and got == _kv_bytes(CONFIG, seq_len, 1, dtype):
            raise AssertionError("that is one sequence's cache: every sequence of the batch has its own")
        size = torch.empty((), dtype=dtype).element_size()
        if seq_len and size != 2 and got == _kv_bytes(CONFIG, seq_len, batch, torch.float16):
            raise AssertionError(f"the element size depends on dtype: {dtype} takes {size} bytes")
        assert got == expected, f"{seq_len} tokens x batch {batch} in {dtype}: expected {expected:,} bytes, got {got:,}"


# ---------------------------------------------------------------------------------------------
# 4.5 generate_cached


def drift_weights(model, seed: int, step: int, scale: float) -> None:
    """Add seeded noise to every layer's key and value weights, in place: a model whose keys and values
    change after each token. kvlib/grading/_child.py holds the same lines (the isolated child imports
    no checks); tests/grading/test_trusted_measures.py holds them equal."""
    g = torch.Generator().manual_seed(int(seed) * 100_003 + int(step))
    with torch.no_grad():
        for layer in model.layers:
            for w in (layer.attn.k_proj.weight, layer.attn.v_proj.weight):
                w.add_(torch.randn(tuple(w.shape), generator=g, dtype=w.dtype) * scale)


class Drifting:
    """An on_token whose every call drifts the model's key and value weights (drift_weights): tokens
    cached before a call keep the keys and values of the weights they were computed with, and a
    generation that recomputes the earlier tokens gets other keys, other logits, other tokens. The
    effect does not depend on anything measured beside the learner's code: in the isolated child its
    stand-in drifts the child's model the same way (the sandbox sends kvlib_drift)."""

    def __init__(self, model, seed: int, scale: float):
        self.model, self.kvlib_drift, self.seen = model, (int(seed), float(scale)), []

    def record(self, token) -> None:
        self.seen.append(token)

    def __call__(self, token) -> None:
        self.record(token)
        drift_weights(self.model, self.kvlib_drift[0], len(self.seen) - 1, self.kvlib_drift[1])


def _drifting_greedy(model, ids, n, seed: int, scale: float) -> torch.Tensor:
    """Greedy tokens of a cached generation whose model drifts after each token (Drifting): every
    token's keys and values are computed once, with the weights of its own step, and kept."""
    keys, values = [None] * L, [None] * L
    step, pos, out = ids, 0, []
    with torch.inference_mode():
        for i in range(n):
            T = step.shape[1]
            cos, sin = model.rope_cos[pos : pos + T], model.rope_sin[pos : pos + T]
            x = model.embed(step)
            for j, layer in enumerate(model.layers):
                h = layer.attn_norm(x)
                q = layer.attn.project_q(h, cos, sin)
                k, v = layer.attn.project_kv(h, cos, sin)
                keys[j] = k if keys[j] is None else torch.cat([keys[j], k], 2)
                values[j] = v if values[j] is None else torch.cat([values[j], v], 2)
                a = layer.attn.attend(q, keys[j], values[j]).transpose(1, 2).reshape(x.shape[0], T, -1)
                x = x + layer.attn.o_proj(a)
                x = x + layer.mlp(layer.mlp_norm(x))
            token = model.lm_head(model.norm(x))[:, -1].float().argmax(-1)
            out.append(token)
            drift_weights(model, seed, i, scale)
            pos, step = pos + T, token[:, None]
    return torch.cat([ids, torch.stack(out, 1)], 1)


def _greedy(model, ids, n):
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@check("4.5")
def generate_cached_matches_generate(kv, rng):
    """Check that greedy tokens with the cache equal greedy tokens of full recompute (fp32, 30 tokens).

    Also: sampled at temperature 0.8 with a seeded generator, the tokens equal those generate draws.
    """
    seed = int(rng.integers(1000))
    for prompt_len in (1, 5):  # a one-token prompt is an edge case
        ids = _ids(rng, 2, prompt_len)
        expected = _greedy(_model(seed), ids, 30)
        out = kv.generate_cached(_model(seed), ids.clone(), 30)
        assert isinstance(out, torch.Tensor) and out.shape == expected.shape, (
            f"generate_cached should return {tuple(expected.shape)}, got {getattr(out, 'shape', out)}"
        )
        assert torch.equal(out, expected), (
            f"with a prompt of {prompt_len}, cached greedy tokens differ from full recompute"
        )
    # sampling: the same seed must draw the same tokens as generate (Exercise 2.2) does
    ids = _ids(rng, 2, 4)
    with torch.inference_mode():
        model = _model(seed)
        logits, sampled = model(ids)[:, -1], [ids]
        gen = torch.Generator().manual_seed(seed)
        for _ in range(12):
            probs = torch.softmax(logits.float() / 0.8, dim=-1)
            token = torch.multinomial(probs, 1, generator=gen)
            sampled.append(token)
            logits = model(torch.cat(sampled, dim=1))[:, -1]
    expected = torch.cat(sampled, dim=1)
    out = kv.generate_cached(
        _model(seed), ids.clone(), 12, temperature=0.8, generator=torch.Generator().manual_seed(seed)
    )
    if not torch.equal(out, expected):
        greedy = _greedy(_model(seed), ids, 12)
        if torch.equal(out, greedy):
            raise AssertionError(
                "at temperature 0.8 generate_cached gave the greedy tokens: the temperature and the generator went unused"
            )
        raise AssertionError(
            "at temperature 0.8 with a seeded generator, generate_cached drew other tokens than generate draws "
            "with the same seed (the generator's draws were spent otherwise, or on other probabilities)"
        )


@check("4.5")
def generate_cached_resets_between_prompts(kv, rng):
    """Check that a cache reused for a second prompt gives the same tokens as a fresh one."""
    cache = _cache(kv, batch=1)
    a, b = _ids(rng, 1, 4), _ids(rng, 1, 6)
    expected = _greedy(_model(6), b, 8)
    kv.generate_cached(_model(6), a.clone(), 8, cache=cache)
    second = kv.generate_cached(_model(6), b.clone(), 8, cache=cache)
    pos = cache.pos
    assert pos != 6 + 8, (
        "after a 6-token prompt and 8 new tokens, cache.pos is 14: one token more went through the model than the 8 new "
        "tokens need"
    )
    assert pos == 6 + 7, (
        f"after a 6-token prompt and 8 new tokens, cache.pos is {pos}; 13 tokens went through the model in a fresh run"
        + (": the count includes the earlier prompt's tokens" if pos > 14 else "")
    )
    assert torch.equal(second, expected), (
        "the second prompt's tokens differ from a fresh run's: they depend on the earlier prompt"
    )


@check("4.5")
def generate_cached_uses_the_cache(kv, rng):
    """Check that generation runs the prompt once and then one token per step: MLP tokens and forward passes counted."""
    ids = _ids(rng, 2, 8)
    cached = L * (8 + 23)  # tokens through the layers' MLPs: the prompt once, then 23 steps of one token
    model, calls, _ = _counted(kv.generate_cached, _model(7))
    with torch.inference_mode():
        kv.generate_cached(model, ids, 24)
    ran = _mlp_tokens(calls)
    assert ran >= cached // 2, (
        f"24 new tokens after a prompt of 8 ran {ran} tokens through the layers' MLPs, under half of the {cached} "
        "they need: run the model"
    )
    assert ran <= 2 * cached, (
        f"24 new tokens after a prompt of 8 ran {ran} tokens through the layers' MLPs, {ran / cached:.1f} times what "
        "the prompt once and one token per step need: the loop reruns earlier tokens"
    )
    one, eight = (_mlp_passes(kv.generate_cached, _model(7), _ids(rng, 2, n), 4) for n in (1, 8))
    assert one > 0, "4 new tokens ran no layer's MLP: run the model's layers"
    assert eight <= one, (
        f"a prompt of 8 took {eight / max(one, 1) * 4 - 4:.0f} more forward passes than a prompt of 1: "
        "the prompt went in one token at a time"
    )
    # what no instrument beside the code can be hidden from: the model drifts after each token, so the
    # tokens follow the cached keys and values only if they were kept, not recomputed
    seed, ids = int(rng.integers(1 << 20)), _ids(rng, 2, 6)
    expected = _drifting_greedy(_model(8), ids, 12, seed, 0.2)
    model = _model(8)
    out = kv.generate_cached(model, ids.clone(), 12, on_token=Drifting(model, seed, 0.2))
    assert isinstance(out, torch.Tensor) and torch.equal(out, expected), (
        "with a model whose key and value weights change after every token (on_token changes them), the tokens "
        "should follow the keys and values cached when each token was new: these did not, so the loop "
        "recomputes earlier tokens instead of reading them from the cache (or calls on_token late)"
    )


@check("4.5")
def generate_cached_answers_the_seed_question(kv, rng):
    """Check that the shipped model with the cache continues 法国的首都是 with 巴黎, streaming each token."""
    model, tokenizer = load_tiny()
    ids = torch.tensor([tokenizer.encode("法国的首都是")])
    seen = []
    out = kv.generate_cached(model, ids.clone(), 2, on_token=lambda t: seen.append(int(t[0])))
    answer = tokenizer.decode(out[0, ids.shape[1] :].tolist())
    assert answer == "巴黎", f"expected 巴黎, got {answer!r}"
    assert seen == out[0, ids.shape[1] :].tolist(), "on_token should be called with each new token, as in generate"
    # and a question nobody can know in advance: a random prompt, greedy tokens of full recompute to match
    ids = torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, 7)))
    expected = _greedy(load_tiny()[0], ids, 4)
    out = kv.generate_cached(load_tiny()[0], ids.clone(), 4)
    assert isinstance(out, torch.Tensor) and torch.equal(out, expected), (
        "on a random prompt the shipped model's cached greedy tokens differ from full recompute"
    )


# ---------------------------------------------------------------------------------------------
# 4.6 sequences_that_fit: a prediction, graded against the count


def _fits(c, memory, seq_len, dtype) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    return max(0, (memory - num_params(c) * size) // _kv_bytes(c, seq_len, 1, dtype))


def _fit_slips(c, memory, seq_len, dtype) -> dict[str, object]:
    """What the answer comes out as under each likely slip, by the slip's message."""
    size = torch.empty((), dtype=dtype).element_size()
    weights, one = num_params(c) * size, _kv_bytes(c, seq_len, 1, dtype)
    left = memory - weights
    return {
        tr("the weights take memory too: one copy of them, stored once, beside the caches"): memory // one,
        tr("the weights are stored once and shared by every sequence of the batch, not once per sequence"): memory
        // (weights + one),
        tr("that counts tokens, not sequences: each sequence keeps a cache of seq_len tokens"): max(0, left)
        // _kv_bytes(c, 1, 1, dtype),
        tr("the caches counted in float16, though they are stored in dtype too"): max(0, left)
        // _kv_bytes(c, seq_len, 1, torch.float16),
        tr("the weights counted in float16, though they are stored in dtype too"): max(
            0, (memory - num_params(c) * 2) // one
        ),
        tr("one sequence too many: the last one's cache does not fit whole"): -(-max(0, left) // one),
        tr("whole sequences only: a fraction of a sequence does not decode"): max(0, left) / one,
        tr("when the weights alone do not fit, no sequence does: 0, not a negative count"): left // one,
        tr(
            "the weights counted without the embedding table and the norms: every parameter is stored, not only the "
            "matrices a token is multiplied by"
        ): max(0, (memory - matrix_params(c) * size) // one),
    }


@check("4.6")
def sequences_that_fit_real_gpus(kv, rng):
    """Check the sequences that fit on real GPUs: Llama-2-7B and Llama-3-8B on 80 GB, Falcon-7B's MQA on 24 GB, Llama-2-70B
    on eight 80 GB cards, float32 and bfloat16 among them, a memory the weights fill and one they overflow."""
    cases = [
        ("Llama-2-7B", 80 * 10**9, 4096, torch.float16),
        ("Llama-3-8B", 80 * 10**9, 8192, torch.bfloat16),
        ("Falcon-7B", 24 * 10**9, 2048, torch.float16),
        ("Llama-2-70B", 8 * 80 * 10**9, 4096, torch.float16),
        ("Llama-3-8B", 80 * 10**9, 4096, torch.float32),
        ("Llama-2-7B", 14 * 10**9, 4096, torch.float16),  # the weights leave no room for one cache
        ("Llama-2-70B", 80 * 10**9, 4096, torch.float16),  # the weights alone do not fit
    ]
    failing = []  # (what, got, expected, the slips' values) of each case answered wrong
    for name, memory, seq_len, dtype in cases:
        c = REAL_MODELS[name].config
        expected = _fits(c, memory, seq_len, dtype)
        got = kv.sequences_that_fit(dataclasses.replace(c), memory, seq_len, dtype)
        what = tr(
            "{name}, {gb} GB, {seq_len} tokens, {dtype}",
            name=name,
            gb=f"{memory / 1e9:.0f}",
            seq_len=f"{seq_len:,}",
            dtype=dtype,
        )
        if not (got == expected and isinstance(got, int) and not isinstance(got, bool)):
            failing.append((what, got, expected, _fit_slips(c, memory, seq_len, dtype)))
    if not failing:
        return
    what, got, expected, slips = failing[0]
    matching = [slip for slip, value in slips.items() if got == value != expected]
    # two slips may give the same count on one case: name the one that every wrong answer agrees with
    matching.sort(key=lambda slip: not all(g == values[slip] for _, g, _, values in failing))
    if matching:
        raise AssertionError(f"{what}: {matching[0]}")
    assert isinstance(got, int) and not isinstance(got, bool), (
        f"{what}: sequences_that_fit should return an int, got {type(got).__name__}"
    )
    raise AssertionError(f"{what}: expected {expected} sequences, got {got}")


@check("4.6")
def sequences_that_fit_is_what_torch_allocates(kv, rng):
    """Check on a small GQA model that the answer's weights and caches fit in the memory as torch allocates them, and
    one more sequence's cache would not."""
    for memory, seq_len, dtype in ((3 * 2**20, 48, torch.float32), (2**20, 17, torch.bfloat16)):
        weights = sum(
            p.untyped_storage().nbytes() for p in Decoder(CONFIG).to(dtype).parameters()
        )  # as torch holds them
        keys = torch.zeros(L, 1, H_KV, seq_len, D, dtype=dtype)  # one sequence's keys in a KVCache; its values alike
        one = 2 * keys.untyped_storage().nbytes()
        n = kv.sequences_that_fit(dataclasses.replace(CONFIG), memory, seq_len, dtype)
        assert isinstance(n, int) and not isinstance(n, bool) and n >= 0, f"expected a count of sequences, got {n!r}"
        held = weights + n * one
        assert held <= memory, (
            f"{n} sequences of {seq_len} tokens: torch holds {held:,} bytes for the weights and their caches, more than "
            f"the {memory:,} given"
        )
        assert held + one > memory, (
            f"{n} sequences of {seq_len} tokens leave room for one more ({held + one:,} of {memory:,} bytes)"
        )
