"""Train the tiny model on the generated corpus, evaluate it, and write assets/tiny.

`python -m kvlib.study.train` reproduces the shipped weights (fixed seeds; bit-exact on the same torch
version and CPU kind) in about eight minutes on two idle CPU cores, then evaluates them. Notebooks
02-06 only load the result (kvlib.core.weights.load_tiny); notebook 06 reuses held_out_loss(). Left out
on purpose: dropout, mixed precision, checkpoints to resume from, and any GPU code path.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before torch loads OpenMP: spinning idle threads starve a shared core
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import datetime
import hashlib
import json
import math
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from kvlib.core.model import Decoder, ModelConfig
from kvlib.core.progress import bar, quiet
from kvlib.core.tokenizer import Tokenizer
from kvlib.core.weights import (
    CONFIG_FILE,
    DRAFT_DIR,
    MANIFEST_FILE,
    TINY_DIR,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    load_tiny,
    sha256_of,
)
from kvlib.study import corpus


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 2000  # ~2 passes over the training records; every fact in ~190 phrasings each pass
    batch_size: int = 16  # rows per step: small batches, many steps learn the facts fastest per FLOP
    seq_len: int = 128  # tokens per row: several records, so facts appear at many positions
    long_fraction: float = 0.15  # the last 15% of steps: rows of max_seq_len tokens (see long_steps)
    lr: float = 3e-3  # peak AdamW learning rate; a model this small tolerates a high one
    min_lr: float = 3e-4  # the cosine schedule of the main phase ends here
    long_lr: float = 1e-3  # the long-row phase restarts here and decays linearly to a tenth
    warmup: int = 100  # linear warm-up steps, to keep early Adam updates small
    weight_decay: float = 0.1  # on matrices only, not on norms
    grad_clip: float = 1.0  # clip the global gradient norm: guards against a rare spike
    seed: int = 0  # seeds the initial weights and the sampling of batches

    @property
    def long_steps(self) -> int:
        """Steps on long rows. Trained on 128-token rows alone, the model's loss climbs from ~0.3
        to over 2 nats past position ~150 (distances it never met); a short phase of long rows
        keeps it flat up to max_seq_len, so generations of a few hundred tokens stay sensible."""
        return round(self.steps * self.long_fraction)


# ---------------------------------------------------------------------------------------------
# Data: rows of whole records


def encode_records(tokenizer: Tokenizer, records: list[str]) -> list[list[int]]:
    """Token ids of each record followed by its newline."""
    return [tokenizer.encode(r + "\n") for r in records]


def sample_rows(records: list[list[int]], batch_size: int, seq_len: int, rng: random.Random) -> torch.Tensor:
    """(batch_size, seq_len + 1) token ids: each row starts a random record and runs on through
    more random records, so row position 0 is always the start of a record, like a prompt."""
    rows = []
    for _ in range(batch_size):
        row: list[int] = []
        while len(row) < seq_len + 1:
            row += records[rng.randrange(len(records))]
        rows.append(row[: seq_len + 1])
    return torch.tensor(rows)


def pack_rows(records: list[list[int]], seq_len: int) -> torch.Tensor:
    """Deterministic (n_rows, seq_len + 1) token ids, each row starting at a record, in order.

    A record cut off at the end of a row starts the next one; a final tail too short for a
    whole row is dropped.
    """
    rows, start = [], 0
    while start < len(records):
        row, end = [], start
        while len(row) < seq_len + 1 and end < len(records):
            row += records[end]
            end += 1
        if len(row) < seq_len + 1:
            break
        rows.append(row[: seq_len + 1])
        cut = len(row) > seq_len + 1 and end - 1 > start  # the last record did not fit whole
        start = end - 1 if cut else end
    return torch.tensor(rows)


def build_tokenizer() -> Tokenizer:
    """The vocabulary: every character of the training text (held-out text uses no other)."""
    tokenizer = Tokenizer.from_text(corpus.train_text())
    unseen = set(corpus.held_out_text()) - set(tokenizer.chars)
    if unseen:
        raise ValueError(f"held-out templates use characters the training text lacks: {sorted(unseen)}")
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def text_loss(
    model: Decoder,
    tokenizer: Tokenizer,
    split: corpus.Split,
    seq_len: int = 128,
    batch_size: int = 64,
    max_rows: int | None = None,
) -> float:
    """Mean next-token cross-entropy (nats per token) on the text of one corpus split.

    max_rows: only the first rows of the (shuffled, so well mixed) text; None means all of it.
    """
    records = corpus.shuffled_records(split)
    if max_rows is not None:
        records = records[: 20 * max_rows]  # a row holds at most ~16 records: enough for max_rows rows
    rows = pack_rows(encode_records(tokenizer, records), seq_len)[:max_rows]  # (N, T + 1)
    total, count = 0.0, 0
    for chunk in rows.split(batch_size):
        logits = model(chunk[:, :-1])  # (B, T) -> (B, T, vocab)
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    return total / count


def held_out_loss(model: Decoder, tokenizer: Tokenizer, seq_len: int = 128, max_rows: int | None = 256) -> float:
    """Cross-entropy (nats per token) on text in the held-out phrasings: notebook 06's quality measure.

    The default 256 rows (~33k tokens) tell model variants apart and take a second or two;
    max_rows=None reads all of the held-out text (~7k rows).
    """
    return text_loss(model, tokenizer, "held_out", seq_len, max_rows=max_rows)


@torch.no_grad()
def loss_by_position(
    model: Decoder, tokenizer: Tokenizer, n_rows: int = 16, edges: tuple[int, ...] = (0, 128, 256)
) -> dict[str, float]:
    """Loss on rows of training text max_seq_len tokens long, averaged per band of positions.

    Flat bands mean the model copes with every position up to max_seq_len; a model trained only
    on short rows has a much higher loss beyond them. Example: {"0-127": 0.30, "128-255": 0.31, ...}
    """
    T = model.config.max_seq_len
    records = encode_records(tokenizer, corpus.shuffled_records("train")[: 40 * n_rows])
    rows = pack_rows(records, T)[:n_rows]  # (n_rows, T + 1)
    logits = model(rows[:, :-1])  # (N, T) -> (N, T, vocab)
    loss = F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none").mean(0)  # (N, T) -> (T,)
    bounds = [e for e in edges if e < T] + [T]
    return {f"{a}-{b - 1}": round(loss[a:b].mean().item(), 4) for a, b in zip(bounds, bounds[1:])}


@torch.no_grad()
def greedy_correct(
    model: Decoder, tokenizer: Tokenizer, items: list[corpus.EvalPrompt], batch_size: int = 256
) -> list[bool]:
    """For each item: does greedy decoding of its prompt produce exactly its answer?

    Teacher forcing gives the same verdict in one forward pass: greedy produces the answer iff at
    every answer position the argmax, given the prompt and the answer so far, is the answer's
    next token. Rows are right-padded; a causal model never looks right, so padding changes nothing.
    """
    encoded = [(tokenizer.encode(it.prompt), tokenizer.encode(it.answer)) for it in items]
    order = sorted(range(len(items)), key=lambda i: sum(map(len, encoded[i])))  # similar lengths together
    verdicts = [False] * len(items)
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        width = max(sum(map(len, encoded[i])) for i in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)  # (N, L), padded with token 0
        for row, i in enumerate(chunk):
            prompt, answer = encoded[i]
            ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        predicted = model(ids).argmax(-1)  # (N, L, vocab) -> (N, L): the token after each position
        for row, i in enumerate(chunk):
            n_prompt, n_answer = map(len, encoded[i])
            guess = predicted[row, n_prompt - 1 : n_prompt + n_answer - 1]  # predictions for the answer slots
            verdicts[i] = bool(torch.equal(guess, ids[row, n_prompt : n_prompt + n_answer]))
    return verdicts


@torch.no_grad()
def greedy_text(model: Decoder, tokenizer: Tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The text greedy decoding adds to prompt (full recompute each step; evaluation only)."""
    ids = torch.tensor([tokenizer.encode(prompt)])  # (1, T)
    for _ in range(max_new_tokens):
        next_token = model(ids)[:, -1].argmax(-1, keepdim=True)  # (1, T, vocab) -> (1, 1)
        ids = torch.cat([ids, next_token], dim=1)
    return tokenizer.decode(ids[0, len(tokenizer.encode(prompt)) :])


def evaluate(
    model: Decoder, tokenizer: Tokenizer, stride: int = 3, n_countries: int | None = None, loss_rows: int = 256
) -> dict:
    """Held-out loss, capital accuracy per split and language, and the anchors' greedy answers.

    stride: ask each template about every stride-th country (see corpus.eval_prompts); 1 asks all.
    n_countries: only the first countries of the table (for quick tests); None means all.
    loss_rows: rows of held-out and of training text for the two losses.
    """
    was_training = model.training
    model.eval()
    countries = {c.name_en for c in corpus.COUNTRIES[:n_countries]}
    result = {
        "stride": stride,
        "loss_rows": loss_rows,
        "held_out_loss": round(held_out_loss(model, tokenizer, max_rows=loss_rows), 4),
        "train_text_loss": round(text_loss(model, tokenizer, "train", max_rows=loss_rows), 4),
        "train_loss_by_position": loss_by_position(model, tokenizer, n_rows=max(1, loss_rows // 16)),
        "accuracy": {},
        "asked": {},
        "worst_templates": {},
        "anchors": {},
    }
    for split in ("train", "held_out"):
        for lang in ("en", "zh"):
            items = [it for it in corpus.eval_prompts(split, lang, stride) if it.country in countries]
            verdicts = greedy_correct(model, tokenizer, items)
            result["accuracy"][f"{split}_{lang}"] = round(sum(verdicts) / len(verdicts), 4)
            result["asked"][f"{split}_{lang}"] = len(verdicts)
            per_template: dict[str, list[bool]] = {}
            for it, ok in zip(items, verdicts):
                per_template.setdefault(it.template, []).append(ok)
            worst = sorted((sum(v) / len(v), t) for t, v in per_template.items())[:3]
            result["worst_templates"][f"{split}_{lang}"] = {t: round(acc, 4) for acc, t in worst}
    for prompt, answer in corpus.ANCHORS:
        said = greedy_text(model, tokenizer, prompt, len(tokenizer.encode(answer)))
        result["anchors"][prompt] = {"expected": answer, "greedy": said, "ok": said == answer}
    model.train(was_training)
    return result


# ---------------------------------------------------------------------------------------------
# Training

DRAFT_STEPS = 1500  # the drafter (notebook 10) learns the templates' text well within these, on one core


def draft_config(vocab_size: int) -> ModelConfig:
    """Notebook 10's drafter: the tiny model's vocabulary and positions, 1 layer of width 64 (about a tenth
    of the tiny model's matrix weights), so one of its steps costs a fraction of one of the model's."""
    return ModelConfig(vocab_size, d_model=64, n_layers=1, n_heads=4, n_kv_heads=4, hidden_dim=128, max_seq_len=512)


def init_weights(model: Decoder, seed: int) -> None:
    """GPT-2 style: N(0, 0.02) everywhere, residual outputs scaled down by sqrt(2 * n_layers)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight")):  # these add into the residual stream
                std /= math.sqrt(2 * model.config.n_layers)
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def lr_at(step: int, s: TrainSettings) -> float:
    """Main phase: linear warm-up, then cosine decay from lr to min_lr. Long-row phase: linear
    decay from long_lr to long_lr / 10."""
    main_steps = s.steps - s.long_steps
    if step >= main_steps:
        return s.long_lr * (1 - 0.9 * (step - main_steps) / max(1, s.long_steps))
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, main_steps - s.warmup)
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: Decoder, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with betas (0.9, 0.95); weight decay on the matrices only (norm weights stay undecayed)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


def train_step(
    model: Decoder, optimizer: torch.optim.Optimizer, rows: torch.Tensor, lr: float, grad_clip: float
) -> float:
    """One optimiser step at learning rate lr on rows (batch, seq_len + 1): predict every next token.

    Gradients are clipped to norm grad_clip. Returns the step's loss (nats per token).
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    logits = model(rows[:, :-1])  # (B, T) -> (B, T, vocab): predict every next character
    loss = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def train(
    settings: TrainSettings, config: ModelConfig | None = None, progress: bool = True
) -> tuple[Decoder, Tokenizer, float]:
    """Train from scratch; returns (model in eval mode, tokenizer, seconds spent). progress: a bar on a terminal,
    step, smoothed loss and time left (kvlib.core.progress)."""
    torch.manual_seed(settings.seed)
    tokenizer = build_tokenizer()
    config = config or ModelConfig(vocab_size=tokenizer.vocab_size)
    if config.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"config.vocab_size={config.vocab_size}, the corpus has {tokenizer.vocab_size} characters")
    if settings.seq_len > config.max_seq_len or settings.batch_size * settings.seq_len < config.max_seq_len:
        raise ValueError(f"need seq_len <= max_seq_len <= batch_size * seq_len, got {settings}, {config}")
    long_batch = settings.batch_size * settings.seq_len // config.max_seq_len  # same tokens per step
    model = Decoder(config)
    init_weights(model, settings.seed)
    records = encode_records(tokenizer, corpus.records("train"))
    rng = random.Random(settings.seed)
    optimizer = make_optimizer(model, settings.lr, settings.weight_decay)
    model.train()
    started, smooth = time.perf_counter(), None
    with quiet(not progress):
        steps = bar(range(settings.steps), desc=f"training {model.num_params():,} parameters", unit="step")
    for step in steps:
        if step < settings.steps - settings.long_steps:
            rows = sample_rows(records, settings.batch_size, settings.seq_len, rng)  # (B, T + 1)
        else:  # fewer, longer rows: positions up to max_seq_len, so long generations stay coherent
            rows = sample_rows(records, long_batch, config.max_seq_len, rng)  # (B', max_seq_len + 1)
        loss = train_step(model, optimizer, rows, lr_at(step, settings), settings.grad_clip)
        smooth = loss if smooth is None else 0.95 * smooth + 0.05 * loss
        if step % 10 == 9:
            steps.set_postfix(loss=f"{smooth:.3f}", refresh=False)
    return model.eval(), tokenizer, time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# Writing assets/tiny


def save(folder: Path, model: Decoder, tokenizer: Tokenizer, manifest: dict) -> dict:
    """Write weights (fp16), config, tokenizer and manifest (with the weights' sha256) to folder."""
    folder.mkdir(parents=True, exist_ok=True)
    state_dict = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    torch.save(state_dict, folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n", encoding="utf-8")
    tokenizer.save(folder / TOKENIZER_FILE)
    manifest = {
        "weights_sha256": sha256_of(folder / WEIGHTS_FILE),
        "weights_bytes": (folder / WEIGHTS_FILE).stat().st_size,
        **manifest,
    }
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    (folder / MANIFEST_FILE).write_text(text, encoding="utf-8")
    return manifest


ASSET_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, MANIFEST_FILE)


def _existing_sha(folder: Path) -> str | None:
    """sha256 of the model already in folder; None when folder holds none of our files."""
    try:
        return json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))["weights_sha256"]
    except (OSError, ValueError, KeyError):
        return "unknown" if any((folder / name).exists() for name in ASSET_FILES) else None


def _move_files(source: Path, dest: Path) -> None:
    """Move our four files from source into dest (only those: never delete a whole folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ASSET_FILES:
        shutil.move(str(source / name), str(dest / name))
    source.rmdir()


def main(argv: list[str] | None = None) -> int:
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(prog="python -m kvlib.study.train", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=defaults.steps, help=f"optimizer steps (default {defaults.steps})")
    add("--out", type=Path, default=TINY_DIR, help="output folder (default assets/tiny)")
    add("--threads", type=int, default=2, help="CPU threads (default 2; the count can change the last bits)")
    add("--force", action="store_true", help="replace a different model already in --out")
    add("--seed", type=int, default=defaults.seed, help=f"seed of weights and batches (default {defaults.seed})")
    add("--toy", action="store_true", help="a toy model and a quick evaluation, to test this script")
    add("--quiet", action="store_true", help="no progress bar (one shows only on a terminal)")
    add(
        "--preset",
        choices=("tiny", "draft"),
        default="tiny",
        help="tiny: the course's model (assets/tiny); draft: notebook 10's drafter, 1 layer of width 64, "
        f"{DRAFT_STEPS} steps, written to assets/draft (default tiny)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.threads < 1:
        parser.error("--steps and --threads must be positive")

    torch.set_num_threads(args.threads)
    warmup = min(defaults.warmup, max(1, args.steps // 10))  # short runs (tests) warm up for a tenth
    settings = replace(defaults, steps=args.steps, seed=args.seed, warmup=warmup)
    config, quick = None, {}
    if args.preset == "draft":  # same corpus and tokenizer as the tiny model, a tenth of its work per token
        config = draft_config(build_tokenizer().vocab_size)
        steps = args.steps if "--steps" in (sys.argv[1:] if argv is None else argv) else DRAFT_STEPS
        settings = replace(settings, steps=steps, warmup=min(defaults.warmup, max(1, steps // 10)))
        if args.out == TINY_DIR:
            args.out = DRAFT_DIR
    if args.toy:  # one small layer, short rows, and 6 countries in the evaluation
        vocab_size = build_tokenizer().vocab_size
        config = ModelConfig(
            vocab_size, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, hidden_dim=64, max_seq_len=128
        )
        settings, quick = replace(settings, batch_size=4, seq_len=32), {"n_countries": 6, "loss_rows": 16}
    out = args.out.resolve()
    previous = _existing_sha(out)
    if previous is not None and not args.force:
        print(f"{out} already holds a model: only an identical one (or --force) replaces it", file=sys.stderr)

    print(f"training on {torch.get_num_threads()} threads: {settings}", file=sys.stderr)
    model, tokenizer, seconds = train(settings, config, progress=not args.quiet)
    print(f"trained {model.num_params():,} parameters in {seconds:.0f} s; evaluating...", file=sys.stderr)
    metrics = evaluate(model, tokenizer, **quick)
    manifest = {
        "settings": asdict(settings),
        "config": model.config.to_dict(),
        "num_params": model.num_params(),
        "corpus": {
            "countries": len(corpus.COUNTRIES),
            "templates": {
                f"{s}_{lang}": len(corpus.templates(s, lang)) for s in ("train", "held_out") for lang in ("en", "zh")
            },
            "train_text_sha256": hashlib.sha256(corpus.train_text().encode("utf-8")).hexdigest(),
        },
        "evaluation": metrics,
        "train_seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "command": " ".join(["python -m kvlib.study.train", *(sys.argv[1:] if argv is None else argv)]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".train-", dir=out.parent))  # written first, placed after
    written = save(scratch, model, tokenizer, manifest)
    print(json.dumps(metrics, indent=2, ensure_ascii=False))
    if previous == written["weights_sha256"]:
        shutil.rmtree(scratch)
        print(f"reproduced {out} exactly (sha256 {previous[:12]}...): files left as they were", file=sys.stderr)
    elif previous is not None and not args.force:
        keep = out.with_name(out.name + "-new")
        _move_files(scratch, keep)
        new = written["weights_sha256"]
        print(
            f"NOT overwriting {out}: it holds a different model (sha256 {previous[:12]}..., new {new[:12]}...). "
            f"The new one is in {keep}; use --force to replace.",
            file=sys.stderr,
        )
        return 1
    else:
        _move_files(scratch, out)
        load_tiny(out)  # what we wrote must load and pass its checksum
        print(f"wrote {out} ({written['weights_bytes'] / 1e6:.2f} MB of fp16 weights)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
