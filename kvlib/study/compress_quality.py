"""The quality side of the smaller caches (notebook 08), on the trained tiny model.

int8: greedy-token agreement with the float32 cache over the held-out capital questions (teacher-forced
on the float32 cache's own greedy continuation, so one early difference does not count twice) and the
capital-answer accuracy of each. Rolling window with and without attention sinks: loss by position on
held-out text longer than the window, every token fed through the cache one at a time. Uses the
learner's caches (kvlib.compress, through kvlib.measure.bench_compress).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlib.core import progress
from kvlib.core.model import Decoder
from kvlib.study import corpus, train
from kvlib.variants.compressed import Int8KVCache


def _prompts(tokenizer, stride: int, limit: int | None) -> list[tuple[list[int], list[int]]]:
    items = corpus.eval_prompts("held_out", stride=stride)[:limit]
    return [(tokenizer.encode(it.prompt), tokenizer.encode(it.answer)) for it in items]


@torch.inference_mode()
def _continue(
    model: Decoder, prompts: list[list[int]], cache, new_tokens: int, forced=None, desc: str = "decode"
) -> torch.Tensor:
    """Each prompt's greedy argmax after its last token and after each next one (forced ones if given), every
    prompt at once through one cache of batch len(prompts), one token a step: (N, new_tokens).

    Prompts of different lengths ride right-padded in one batch (a causal model never reads a later position);
    a row switches from its prompt to its new tokens at its own step. forced: (N, new_tokens) tokens fed instead
    of the picks (the int8 run follows the float32 run's continuation). desc: what the progress bar says runs.
    """
    lengths = torch.tensor([len(p) for p in prompts])
    width = int(lengths.max()) + new_tokens
    ids = torch.zeros(len(prompts), width, dtype=torch.long)  # (N, width): prompts, then their new tokens
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.tensor(p)
    picks = torch.zeros(len(prompts), new_tokens, dtype=torch.long)
    rows = torch.arange(len(prompts))
    fed = picks if forced is None else forced  # what a row reads once past its prompt
    cache.reset()
    for t in progress.bar(range(width - 1), desc=desc, unit="token"):
        logits, _ = model(ids[:, t : t + 1], past_key_values=cache)  # (N, 1, vocab): each row's next token after t
        i = t + 1 - lengths  # which new token position t + 1 is, per row (negative: still in the prompt)
        new = (i >= 0) & (i < new_tokens)
        picks[rows[new], i[new]] = logits[new, -1].argmax(-1)
        ids[rows[new], t + 1] = fed[rows[new], i[new]]
    return picks


def int8_agreement(model: Decoder, tokenizer, stride: int = 48, limit: int | None = None, new_tokens: int = 16) -> dict:
    """Greedy tokens of the int8 cache against the float32 cache's, and the capital answers of each.

    agreement: share of the new_tokens positions (over every prompt) where the int8 cache's argmax equals
    the float32 cache's, both fed the float32 cache's continuation. answer_*: the first tokens of the
    continuation spell the expected capital. Every prompt runs in one batch (_continue).
    """
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)

    prompts = _prompts(tokenizer, stride, limit)
    questions = [p for p, _ in prompts]
    n, width = len(prompts), max(map(len, questions)) + new_tokens
    f = _continue(
        model, questions, KVCache(model.config, batch=n, max_seq_len=width), new_tokens, desc="int8 agreement: float32"
    )
    int8 = Int8KVCache(model.config, batch=n, max_seq_len=width)
    q = _continue(model, questions, int8, new_tokens, forced=f, desc="int8 agreement: int8")
    right_f = sum(f[row, : len(a)].tolist() == a for row, (_, a) in enumerate(prompts))
    right_q = sum(q[row, : len(a)].tolist() == a for row, (_, a) in enumerate(prompts))
    return {
        "prompts": n,
        "new_tokens": new_tokens,
        "agreement": int((f == q).sum()) / f.numel(),
        "identical_continuations": int((f == q).all(1).sum()) / n,
        "answer_float32": right_f / n,
        "answer_int8": right_q / n,
        "goal": 0.99,
    }


def held_out_rows(tokenizer, n_rows: int, seq_len: int) -> torch.Tensor:
    """(n_rows, seq_len + 1) held-out token ids: rows of the phrasings the model never trained on."""
    records = train.encode_records(tokenizer, corpus.records("held_out"))
    return train.pack_rows(records, seq_len)[:n_rows]


@torch.inference_mode()
def stepwise_loss(model: Decoder, rows: torch.Tensor, cache, attention=None, desc: str = "loss") -> torch.Tensor:
    """Next-token loss at every position (seq_len,), averaged over rows, feeding one token at a time through cache
    (desc: what the progress bar says runs)."""
    cache.reset()
    losses = []
    for t in progress.bar(range(rows.shape[1] - 1), desc=desc, unit="token"):
        logits, _ = model(rows[:, t : t + 1], past_key_values=cache, attention=attention)  # (N, 1, vocab)
        losses.append(F.cross_entropy(logits[:, -1], rows[:, t + 1], reduction="none"))
    return torch.stack(losses, 1).mean(0)


def window_study(
    model: Decoder, tokenizer, capacity: int = 32, n_sink: int = 4, n_rows: int = 8, seq_len: int = 256, band: int = 32
) -> dict:
    """Loss by position band: the full float32 cache, int8, a window of `capacity` tokens, and n_sink sinks plus
    capacity - n_sink recent tokens (the same cache size), on held-out rows longer than the window."""
    from kvlib.compress import SinkCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)

    rows = held_out_rows(tokenizer, n_rows, seq_len)
    B = rows.shape[0]
    caches = {
        "float32 (full)": KVCache(model.config, batch=B, max_seq_len=seq_len),
        "int8 (full)": Int8KVCache(model.config, batch=B, max_seq_len=seq_len),
        f"window {capacity}, no sinks": SinkCache(model.config, 0, capacity, batch=B),
        f"{n_sink} sinks + window {capacity - n_sink}": SinkCache(model.config, n_sink, capacity - n_sink, batch=B),
    }
    per_position = {
        name: stepwise_loss(model, rows, cache, desc=f"window study: {name}")  # each cache brings its own attention
        for name, cache in caches.items()
    }
    edges = list(range(0, seq_len, band)) + [seq_len]
    return {
        "capacity": capacity,
        "n_sink": n_sink,
        "rows": B,
        "seq_len": seq_len,
        "bands": [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])],
        "loss": {
            name: [round(loss[a:b].mean().item(), 4) for a, b in zip(edges, edges[1:])]
            for name, loss in per_position.items()
        },
        "mean_past_window": {name: round(loss[capacity:].mean().item(), 4) for name, loss in per_position.items()},
        "per_position": {name: [round(x, 4) for x in loss.tolist()] for name, loss in per_position.items()},
    }


# ---------------------------------------------------------------------------------------------
# Which axis shares a key scale: KIVI's choice at 8, 4, 3 and 2 bits


def fake_quantize(x: torch.Tensor, dim: int, bits: int, group: int = 32) -> torch.Tensor:
    """x (batch, heads, tokens, head_dim) rounded to `bits` bits and back, KIVI's asymmetric rule (arXiv 2402.02750).

    Each slice's min ... max maps to 2**bits levels. dim=-1: a slice per token (its head_dim channels);
    dim=-2: a slice per channel per `group` tokens (the last group may be short), as Int8KVCache groups keys.
    """
    if dim == -1:
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        chunks = [(x, lo, hi)]
    elif dim == -2:
        chunks = [(c, c.amin(-2, keepdim=True), c.amax(-2, keepdim=True)) for c in x.split(group, dim=-2)]
    else:
        raise ValueError(f"dim must be -1 (per token) or -2 (per channel), got {dim!r}")
    levels = 2**bits - 1
    out = []
    for c, lo, hi in chunks:
        scale = ((hi - lo) / levels).clamp_min(1e-12)  # a constant slice: any scale, error 0
        out.append(((c - lo) / scale).round().clamp(0, levels) * scale + lo)
    return torch.cat(out, dim=-2)


@torch.inference_mode()
def key_axis_study(
    model: Decoder, tokenizer, bits=(8, 4, 3, 2), n_rows: int = 8, seq_len: int = 256, group: int = 32
) -> dict:
    """Keys quantised with a scale per channel (dim=-2) or per token (dim=-1), at each bit width, on held-out text.

    Every layer's keys of the float model (rotated, as a cache holds them) are rounded with fake_quantize and
    attended to with the float queries and values. key_error: mean |error| / mean |key|; output_error: the
    same for the attention output, which is what the next layer reads. Averages over the layers.
    """
    rows = held_out_rows(tokenizer, n_rows, seq_len)[:, :-1]
    x, (cos, sin) = model.embed(rows), (model.rope_cos[:seq_len], model.rope_sin[:seq_len])
    sums = {(b, axis): [0.0, 0.0] for b in bits for axis in ("per channel", "per token")}
    for layer in model.layers:
        h = layer.attn_norm(x)
        q, (k, v) = layer.attn.project_q(h, cos, sin), layer.attn.project_kv(h, cos, sin)
        gqa = q.shape[1] != k.shape[1]
        exact = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        for b in bits:
            for axis, dim in (("per channel", -2), ("per token", -1)):
                k_q = fake_quantize(k, dim, b, group)
                out = F.scaled_dot_product_attention(q, k_q, v, is_causal=True, enable_gqa=gqa)
                sums[b, axis][0] += ((k_q - k).abs().mean() / k.abs().mean()).item() / len(model.layers)
                sums[b, axis][1] += ((out - exact).abs().mean() / exact.abs().mean()).item() / len(model.layers)
        x = layer(x, cos, sin)
    return {
        "rows": rows.shape[0],
        "seq_len": seq_len,
        "group": group,
        "bits": list(bits),
        "key_error": {axis: [sums[b, axis][0] for b in bits] for axis in ("per channel", "per token")},
        "output_error": {axis: [sums[b, axis][1] for b in bits] for axis in ("per channel", "per token")},
    }


# ---------------------------------------------------------------------------------------------
# What eviction costs: the capital questions through caches smaller than the question


@torch.inference_mode()
def window_accuracy(
    model: Decoder, tokenizer, capacities=(32, 16, 8), n_sink: int = 4, stride: int = 96, sinks_at=None
) -> dict:
    """Capital answers with the full cache, a plain rolling window of each capacity and n_sink sinks + the rest
    (at every capacity, or only at those in sinks_at: each cache costs a pass over the questions).

    Every prompt and its answer go through the cache one token at a time (right-padded rows: a causal model
    never reads the padding); an answer is right when the argmax at every answer position is its next token
    (teacher forcing gives greedy decoding's verdict). A window evicts the question's country once the cache
    is shorter than the distance from the country to the answer.
    """
    from kvlib.compress import SinkCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)

    encoded = _prompts(tokenizer, stride, None)
    width = max(len(p) + len(a) for p, a in encoded)
    ids = torch.zeros(len(encoded), width, dtype=torch.long)  # (N, width), right-padded with token 0
    for row, (p, a) in enumerate(encoded):
        ids[row, : len(p) + len(a)] = torch.tensor(p + a)
    N = len(encoded)
    caches = {"full cache": KVCache(model.config, batch=N, max_seq_len=width)}
    for c in capacities:
        caches[f"window {c}"] = SinkCache(model.config, 0, c, batch=N)
        if c > n_sink and (sinks_at is None or c in sinks_at):
            caches[f"{n_sink} sinks + window {c - n_sink}"] = SinkCache(model.config, n_sink, c - n_sink, batch=N)
    accuracy = {}
    for name, cache in caches.items():
        cache.reset()
        steps = progress.bar(range(width - 1), desc=f"window accuracy: {name}", unit="token")
        picks = torch.stack([model(ids[:, t : t + 1], past_key_values=cache)[0][:, -1].argmax(-1) for t in steps], 1)
        right = [
            torch.equal(picks[row, len(p) - 1 : len(p) + len(a) - 1], ids[row, len(p) : len(p) + len(a)])
            for row, (p, a) in enumerate(encoded)
        ]
        accuracy[name] = sum(right) / N
    lengths = sorted(len(p) for p, _ in encoded)
    return {
        "prompts": N,
        "prompt_tokens": {"min": lengths[0], "median": lengths[N // 2], "max": lengths[-1]},
        "capacities": list(capacities),
        "n_sink": n_sink,
        "accuracy": accuracy,
    }
