"""Grouped-Query Attention (notebook 06-gqa): query heads share key/value heads in groups.

MHA gives each of the n_heads query heads its own key/value head, MQA gives them all one, GQA one
per group of group_size = n_heads // n_kv_heads. The cache, and the bytes a decode step reads
from it, shrink by group_size, but only if attention reads each shared head in place instead of
copying it out to every query head. Here: the grouping (repeat_kv), attention that keeps the
saving (grouped_attention), and turning a trained MHA model into GQA by mean-pooling (Ainslie et
al., 2023). Left out: uptraining schedules, and fused kernels (SDPA's enable_gqa is compared only).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from kvlib._exercise import exercise
from kvlib.model import Decoder, load_checked

# ---------------------------------------------------------------------------------------------
# Input checks: every bad shape is named with what was expected


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"


def _check_repeat(x, group_size):
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be keys or values of shape (batch, n_kv_heads, seq_len, head_dim), got {_shape(x)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size (query heads per key/value head) must be a positive int, got {group_size!r}")


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            what = "(batch, n_heads, seq_len, head_dim)" if name == "q" else "(batch, n_kv_heads, kv_len, head_dim)"
            raise ValueError(f"{name} must have shape {what}, got {_shape(t)}")
    if k.shape != v.shape:
        raise ValueError(f"k {_shape(k)} and v {_shape(v)} must have the same shape (batch, n_kv_heads, kv_len, head_dim)")
    (B, H, T, D), (B_kv, H_kv, S, D_kv) = q.shape, k.shape
    if (B, D) != (B_kv, D_kv):
        raise ValueError(f"q {_shape(q)} and k {_shape(k)} must agree on batch (dim 0) and head_dim (dim 3)")
    if H % H_kv:
        raise ValueError(f"q has {H} heads and k {H_kv}: n_heads must be a multiple of n_kv_heads (q {_shape(q)}, k {_shape(k)})")
    if S < T:
        raise ValueError(f"{T} queries need at least {T} keys (the queries are the last T of the kv_len positions), got k {_shape(k)}")


def _check_pool(w, n_heads, n_kv_heads):
    for name, n in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w must be a k_proj or v_proj weight of shape (n_heads * head_dim, d_model), got {_shape(w)}")
    if w.shape[0] % n_heads:
        raise ValueError(f"w has {w.shape[0]} rows, not a multiple of n_heads={n_heads}: expected (n_heads * head_dim, d_model)")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}: every group needs the same size")


def _check_to_gqa(model, n_kv_heads, pool=None):
    if not isinstance(model, Decoder):
        raise ValueError(f"model must be a kvlib Decoder, got a {type(model).__name__}")
    have = model.config.n_kv_heads
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or have % n_kv_heads:
        divisors = [d for d in range(1, have + 1) if have % d == 0]
        raise ValueError(f"the model has {have} key/value heads: n_kv_heads must divide it, one of {divisors}; got {n_kv_heads!r}")


# ---------------------------------------------------------------------------------------------
# Exercise 6.1: which key/value head each query head reads


@exercise("6.1", validate=_check_repeat)
def repeat_kv(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Copy each key/value head out to the group_size query heads that share it.

    torch.repeat_interleave(x, repeats=group_size, dim=1): query head h reads key/value head
    h // group_size, so heads 0..group_size-1 share head 0 (not head h % n_kv_heads).
    Args:    x: (batch, n_kv_heads, kv_len, head_dim)
    Returns: (batch, n_kv_heads * group_size, kv_len, head_dim): in general a copy, the one that
             grouped_attention avoids
    Example: heads [a, b], group_size 2 -> [a, a, b, b]  (x.repeat would give [a, b, a, b])

    Hints (reference solution: 2 lines):
      1. x[:, :, None] is (B, H_kv, 1, S, D); .expand it to (B, H_kv, group_size, S, D) (no copy yet).
      2. .reshape to (B, H_kv * group_size, S, D): the group axis lands right after its head.
    """
    ### BEGIN SOLUTION
    B, H_kv, S, D = x.shape
    return x[:, :, None].expand(B, H_kv, group_size, S, D).reshape(B, H_kv * group_size, S, D)  # -> (B, H, S, D)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Attention two ways: copy the shared heads out (the peers' way), or read them in place


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v with one key/value head per query head (MHA), bottom-right causal.

    q (batch, n_heads, seq_len, head_dim), k and v (batch, n_heads, kv_len, head_dim) -> like q.
    The T queries are the last T of the S positions (a decode step: T = 1 against the whole cache).
    """
    _check_qkv(q, k, v)
    assert q.shape[1] == k.shape[1], f"causal_attention needs as many key heads as query heads: q {_shape(q)}, k {_shape(k)}"
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    scores = (k @ q.transpose(-2, -1)).transpose(-2, -1) / math.sqrt(D)  # = q @ k^T, (B, H, T, S); see grouped_attention
    if T > 1:  # one query (a decode step) may attend to every key: no mask to build or apply
        allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)  # (T, S), True = may attend
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H, T, S) @ (B, H, S, D)


def materialised_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """GQA the copying way: repeat_kv (Exercise 6.1) the cached heads out to n_heads, then MHA attention.

    Right answer, but every decode step writes and reads n_heads heads of keys and values again:
    the cache is small, the traffic is MHA's and more.
    """
    group_size = q.shape[1] // k.shape[1]
    # .contiguous(): for batch 1 and one KV head reshape can hand back a view; peers' code copies always
    k, v = repeat_kv(k, group_size).contiguous(), repeat_kv(v, group_size).contiguous()  # (B, H, S, D) each
    return causal_attention(q, k, v)  # (B, H, T, D)


# ---------------------------------------------------------------------------------------------
# Exercise 6.2


@exercise("6.2", validate=_check_qkv)
def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention in which each key/value head serves its group of query heads, read in place.

    Equals causal_attention(q, repeat_kv(k, G), repeat_kv(v, G)) with G = n_heads // n_kv_heads,
    and F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), but never
    makes a tensor of n_heads keys or values. Mask: query t (the last T of S positions) may
    attend to key j iff j <= S - T + t; True = may attend.
    Args:    q: (batch, n_heads, seq_len, head_dim); k, v: (batch, n_kv_heads, kv_len, head_dim)
    Returns: (batch, n_heads, seq_len, head_dim)

    Hints (reference solution: 8 lines):
      1. Query head h = g_kv * G + i belongs to key/value head g_kv, so q.reshape(B, H_kv, G * T, D)
         stacks each group's queries as rows against ONE (S, D) block of keys: a plain matmul
         (on a CPU, (k @ q^T)^T streams the cache faster than q @ k^T; both are right).
      2. Broadcasting (B, H_kv, G, T, D) @ (B, H_kv, 1, D, S) looks free, but torch.matmul copies the
         broadcast keys out to G heads first: exactly the repeat you are avoiding.
      3. The (T, S) mask, torch.ones(T, S, dtype=torch.bool).tril(S - T), repeats G times along rows.
    """
    ### BEGIN SOLUTION
    (B, H, T, D), (H_kv, S) = q.shape, k.shape[1:3]
    G = H // H_kv
    q = q.reshape(B, H_kv, G * T, D) / math.sqrt(D)  # (B, H, T, D) -> (B, H_kv, G*T, D): a group's queries as rows
    # (k @ q^T)^T == q @ k^T; with the cache as the left operand a CPU streams it once, like a matrix-vector product
    scores = (k @ q.transpose(-2, -1)).transpose(-2, -1)  # (B, H_kv, S, D) @ (B, H_kv, D, G*T) -> (B, H_kv, G*T, S)
    if T > 1:  # one query per head (a decode step) may attend to every key: no mask to build or apply
        allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T).repeat(G, 1)  # (G*T, S): row g*T + t is query t
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(dim=-1) @ v).view(B, H, T, D)  # (B, H_kv, G*T, S) @ (B, H_kv, S, D) -> (B, H_kv, G*T, D) -> (B, H, T, D)
    ### END SOLUTION


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The library's way, for comparison: scaled_dot_product_attention with enable_gqa (torch >= 2.5)."""
    T, S = q.shape[2], k.shape[2]
    # one query (a decode step) attends to every key: no mask, which also lets a GPU pick its fused kernels
    mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)  # (T, S), True = may attend
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def largest_new_tensor(fn: Callable, *args) -> tuple[str, tuple[int, ...]]:
    """(op name, shape) of the largest tensor that fn(*args) allocates (views are free, so not counted).

    Example: largest_new_tensor(materialised_attention, q, k, v) -> ("clone", (batch, n_heads, kv_len, head_dim))
    """
    from kvlib.benchmark import new_tensors

    made = new_tensors(fn, *args)
    return max(made, key=lambda m: math.prod(m[1]), default=("none", ()))


ATTENTION: dict[str, Callable] = {  # the three ways notebook 06 and `kvlib bench gqa` time
    "materialised": materialised_attention,
    "grouped": grouped_attention,
    "sdpa": sdpa_attention,
}


# ---------------------------------------------------------------------------------------------
# A decode step with a chosen attention (for timing; the model's own path uses SDPA)


@torch.inference_mode()
def decode_step_with(model: Decoder, token: torch.Tensor, cache, attend: Callable) -> torch.Tensor:
    """One decode step of model for token (batch,) at position cache.pos, attention done by `attend`.

    cache: a kvlib.kv_cache.KVCache (batch, n_kv_heads per layer) already holding cache.pos tokens;
    the new keys and values are written at cache.pos, and pos is NOT advanced, so the same step
    can be timed again and again at one kv_len. Returns the logits (batch, vocab_size).
    """
    pos, B = cache.pos, token.shape[0]
    cos, sin = model.rope_cos[pos : pos + 1], model.rope_sin[pos : pos + 1]  # (1, D): the new token's angles
    x = model.embed(token[:, None])  # (B, 1) -> (B, 1, C)
    for i, layer in enumerate(model.layers):
        h = layer.attn_norm(x)
        q = layer.attn.project_q(h, cos, sin)  # (B, H, 1, D)
        k_new, v_new = layer.attn.project_kv(h, cos, sin)  # (B, H_kv, 1, D)
        cache.k[i, :, :, pos : pos + 1], cache.v[i, :, :, pos : pos + 1] = k_new, v_new
        out = attend(q, cache.k[i, :, :, : pos + 1], cache.v[i, :, :, : pos + 1])  # (B, H, 1, D), S = pos + 1
        x = x + layer.attn.o_proj(out.transpose(1, 2).reshape(B, 1, -1))  # (B, H, 1, D) -> (B, 1, H*D) -> (B, 1, C)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x))[:, -1]  # (B, vocab)


def decode_bytes(model: Decoder, kv_len: int, batch: int = 1, method: str = "grouped") -> int:
    """Bytes one decode step must move: every matrix weight once, plus the cache it reads.

    The embedding is a lookup of one row (left out). "grouped"/"sdpa" read n_kv_heads heads of
    keys and values; "materialised" reads them, writes n_heads heads of copies and reads those
    again; MHA is n_kv_heads == n_heads. kv_len: cached tokens the step attends to.
    """
    c, size = model.config, model.embed.weight.element_size()
    weights = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and not name.startswith("embed"))
    kv_heads = c.n_kv_heads + (2 * c.n_heads if method == "materialised" and c.n_kv_heads != c.n_heads else 0)
    return size * (weights + 2 * c.n_layers * batch * kv_heads * kv_len * c.head_dim)


# ---------------------------------------------------------------------------------------------
# Exercise 6.3: from n_heads key/value heads to n_kv_heads, the GQA paper's way


@exercise("6.3", validate=_check_pool)
def mean_pool_heads(w: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Average the heads of each group of a key or value projection: (n_heads*D, C) -> (n_kv_heads*D, C).

    Groups are consecutive heads, as repeat_kv (Exercise 6.1) reads them: new head j is the mean
    of old heads j*G ... j*G + G - 1, G = n_heads // n_kv_heads. nn.Linear stores (out, in), so
    rows h*D ... h*D + D - 1 of w are head h (head_dim D = w.shape[0] // n_heads).
    Example: 4 heads [a, b, c, d] to 2 -> [(a + b) / 2, (c + d) / 2]

    Hints (reference solution: 3 lines):
      1. w.view(n_kv_heads, G, D, C): the group's heads on their own axis.
      2. Average over that axis only, then reshape back to two dimensions.
    """
    ### BEGIN SOLUTION
    D, C = w.shape[0] // n_heads, w.shape[1]
    G = n_heads // n_kv_heads
    return w.reshape(n_kv_heads, G, D, C).mean(dim=1).reshape(n_kv_heads * D, C)  # (H_kv, G, D, C) -> (H_kv*D, C)
    ### END SOLUTION


def first_head_of_group(w: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """The alternative the GQA paper compares with: keep the first head of each group, drop the rest."""
    _check_pool(w, n_heads, n_kv_heads)
    D, C = w.shape[0] // n_heads, w.shape[1]
    return w.reshape(n_kv_heads, n_heads // n_kv_heads, D, C)[:, 0].reshape(n_kv_heads * D, C)


# ---------------------------------------------------------------------------------------------
# Exercise 6.4


@exercise("6.4", validate=_check_to_gqa)
def to_gqa(model: Decoder, n_kv_heads: int, pool: Callable | None = None) -> Decoder:
    """A new Decoder with n_kv_heads key/value heads, its k_proj and v_proj weights pooled from model's.

    Everything else (embeddings, queries, o_proj, MLP, norms) is copied unchanged; model itself is
    left as it was. pool(w, n_heads_in_w, n_kv_heads) shrinks one weight; None means
    mean_pool_heads (Exercise 6.3). Example: to_gqa(load_tiny()[0], 2).config.n_kv_heads == 2

    Hints (reference solution: 5 lines):
      1. dataclasses.replace(model.config, n_kv_heads=n_kv_heads) is the new config.
      2. Pool the state dict's entries ending in "k_proj.weight" and "v_proj.weight"; the weight has
         model.config.n_kv_heads heads (n_heads for MHA).
      3. kvlib.model.load_checked(Decoder(config), state) names any shape that does not fit.
    """
    ### BEGIN SOLUTION
    pool = pool or mean_pool_heads
    config = dataclasses.replace(model.config, n_kv_heads=n_kv_heads)
    state = {name: pool(w, model.config.n_kv_heads, n_kv_heads) if name.endswith(("k_proj.weight", "v_proj.weight")) else w
             for name, w in model.state_dict().items()}
    new = load_checked(Decoder(config), state, source=f"model pooled to {n_kv_heads} key/value heads")
    return new.to(model.embed.weight.dtype).train(model.training)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Quality of a converted model (notebook 06), with the evaluation of kvlib.train


def quality(model: Decoder, tokenizer, stride: int = 3, loss_rows: int = 256) -> dict:
    """Held-out loss (nats per token) and capital-question accuracy on the held-out phrasings.

    Accuracy: greedy decoding gives the exact answer (teacher-forced check, kvlib.train.greedy_correct),
    English and Chinese together, every stride-th country per template.
    """
    from kvlib import corpus, train

    items = corpus.eval_prompts("held_out", stride=stride)
    verdicts = train.greedy_correct(model, tokenizer, items)
    return {"held_out_loss": train.held_out_loss(model, tokenizer, max_rows=loss_rows),
            "accuracy": sum(verdicts) / len(verdicts), "asked": len(verdicts)}


def uptrain(model: Decoder, tokenizer, steps: int = 60, lr: float = 1e-3, batch_size: int = 16, seq_len: int = 128,
            seed: int = 0) -> dict:
    """Continue training a converted model on the training text for a few steps, in place (the GQA
    paper's "uptraining", here a few percent of the tiny model's 2,000 training steps).

    AdamW at a constant lr after a 10-step warm-up, the rows of kvlib.train; returns the seconds
    it took and the loss of each step. Leaves the model in eval mode.
    """
    import random
    import time

    import torch.nn.functional as F

    from kvlib import corpus, train

    records = train.encode_records(tokenizer, corpus.records("train"))
    rng, losses = random.Random(seed), []
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    started = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 10)
        rows = train.sample_rows(records, batch_size, seq_len, rng)  # (B, T + 1)
        logits = model(rows[:, :-1])  # (B, T, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return {"seconds": time.perf_counter() - started, "steps": steps, "tokens": steps * batch_size * seq_len, "losses": losses}


UPTRAINING_RECORDING = Path(__file__).resolve().parent.parent / "assets" / "gqa" / "uptraining.json"


def load_uptraining_recording(path: str | Path | None = None) -> dict | None:
    """The recorded conversion_study with 100 uptraining steps (rows and record), or None if absent."""
    path = Path(path) if path is not None else UPTRAINING_RECORDING
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


POOLS = {"mean": None, "first": first_head_of_group}  # to_gqa's pool for each conversion recipe


def conversion_study(model: Decoder, tokenizer, kv_heads=(8, 4, 2, 1), recipes=("mean", "first"),
                     uptrain_steps: int = 0, stride: int = 24, loss_rows: int = 32) -> list[dict]:
    """Convert model to each n_kv_heads with each recipe, optionally uptrain, and measure quality.

    Returns one row per (n_kv_heads, recipe): held-out loss and capital accuracy (kvlib.gqa.quality),
    and, with uptrain_steps, the same after that many steps of uptrain() with its cost in seconds.
    """
    rows = []
    for n_kv_heads in kv_heads:
        for recipe in recipes if n_kv_heads != model.config.n_kv_heads else recipes[:1]:
            converted = to_gqa(model, n_kv_heads, pool=POOLS[recipe])
            row = {"n_kv_heads": n_kv_heads, "recipe": recipe if n_kv_heads != model.config.n_kv_heads else "original",
                   **quality(converted, tokenizer, stride, loss_rows)}
            if uptrain_steps:
                cost = uptrain(converted, tokenizer, steps=uptrain_steps)
                after = quality(converted, tokenizer, stride, loss_rows)
                row.update({f"uptrained_{k}": v for k, v in after.items() if k != "asked"},
                           uptrain_steps=uptrain_steps, uptrain_seconds=cost["seconds"], uptrain_tokens=cost["tokens"])
            rows.append(row)
    return rows
