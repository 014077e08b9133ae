"""The quality side of GQA (notebook 06): convert the trained tiny MHA model to fewer key/value heads,
measure held-out loss and capital-question accuracy, optionally uptrain, and load the recording.

Uses the learner's to_gqa (Exercise 6.4) and the evaluation and training step of kvlib.study.train.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from kvlib.core import progress
from kvlib.core.model import Decoder
from kvlib.core.paths import ASSETS
from kvlib.core.weights import first_head_of_group
from kvlib.study import corpus, train


def quality(model: Decoder, tokenizer, stride: int = 3, loss_rows: int = 256) -> dict:
    """Held-out loss (nats per token) and capital-question accuracy on the held-out phrasings.

    Accuracy: greedy decoding gives the exact answer (teacher-forced check, kvlib.study.train.greedy_correct),
    English and Chinese together, every stride-th country per template.
    """
    items = corpus.eval_prompts("held_out", stride=stride)
    verdicts = train.greedy_correct(model, tokenizer, items)
    return {
        "held_out_loss": train.held_out_loss(model, tokenizer, max_rows=loss_rows),
        "accuracy": sum(verdicts) / len(verdicts),
        "asked": len(verdicts),
    }


def uptrain(
    model: Decoder,
    tokenizer,
    steps: int = 60,
    lr: float = 1e-3,
    batch_size: int = 16,
    seq_len: int = 128,
    seed: int = 0,
) -> dict:
    """Continue training a converted model on the training text for a few steps, in place (the GQA
    paper's "uptraining", here a few percent of the tiny model's 2,000 training steps).

    The optimiser and step of kvlib.study.train (weight decay 0.1, gradients clipped to 1) at a
    constant lr after a 10-step warm-up; returns the seconds it took and the loss of each step.
    Leaves the model in eval mode.
    """
    records = train.encode_records(tokenizer, corpus.records("train"))
    rng, losses = random.Random(seed), []
    optimizer = train.make_optimizer(model, lr, weight_decay=0.1)
    model.train()
    started = time.perf_counter()
    for step in progress.bar(range(steps), desc="uptraining", unit="step"):
        rows = train.sample_rows(records, batch_size, seq_len, rng)  # (B, T + 1)
        losses.append(train.train_step(model, optimizer, rows, lr * min(1.0, (step + 1) / 10), grad_clip=1.0))
    model.eval()
    return {
        "seconds": time.perf_counter() - started,
        "steps": steps,
        "tokens": steps * batch_size * seq_len,
        "losses": losses,
    }


UPTRAINING_RECORDING = ASSETS / "gqa" / "uptraining.json"


def load_uptraining_recording(path: str | Path | None = None) -> dict | None:
    """The recorded conversion_study with 100 uptraining steps (rows and record), or None if absent."""
    path = Path(path) if path is not None else UPTRAINING_RECORDING
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def conversion_study(
    model: Decoder,
    tokenizer,
    kv_heads=(8, 4, 2, 1),
    recipes=("mean", "first"),
    uptrain_steps: int = 0,
    stride: int = 24,
    loss_rows: int = 32,
) -> list[dict]:
    """Convert model to each n_kv_heads with each recipe, optionally uptrain, and measure quality.

    Returns one row per (n_kv_heads, recipe): held-out loss and capital accuracy (quality),
    and, with uptrain_steps, the same after that many steps of uptrain() with its cost in seconds.
    """
    from kvlib.gqa import to_gqa  # noqa: PLC0415 (late binding: runs the learner's code)

    pools = {"mean": None, "first": first_head_of_group}
    rows = []
    plan = [
        (n_kv_heads, recipe)
        for n_kv_heads in kv_heads
        for recipe in (recipes if n_kv_heads != model.config.n_kv_heads else recipes[:1])
    ]
    for n_kv_heads, recipe in progress.bar(plan, desc="GQA conversion study", unit="model"):
        converted = to_gqa(model, n_kv_heads, pool=pools[recipe])
        row = {
            "n_kv_heads": n_kv_heads,
            "recipe": recipe if n_kv_heads != model.config.n_kv_heads else "original",
            **quality(converted, tokenizer, stride, loss_rows),
        }
        if uptrain_steps:
            cost = uptrain(converted, tokenizer, steps=uptrain_steps)
            after = quality(converted, tokenizer, stride, loss_rows)
            row.update(
                {f"uptrained_{k}": v for k, v in after.items() if k != "asked"},
                uptrain_steps=uptrain_steps,
                uptrain_seconds=cost["seconds"],
                uptrain_tokens=cost["tokens"],
            )
        rows.append(row)
    return rows
