"""The exercise mechanism: one table of exercises, stubs that fail loudly, and reference mode.

Learners fill in functions in kvlib/<module>.py; the complete reference of each such file sits
at solutions/kvlib/<module>.py. Every exercise function carries @exercise("X.Y"), which
  - in reference mode (KVLIB_SOLUTIONS=1, or use_solutions()) calls the reference instead,
  - turns a stub's NotImplementedError into ExerciseNotDone, which names the exercise, and
    names the earlier exercise to do first when a later one calls an unfinished one,
  - notes each call of a find-and-fix exercise's shipped body (kind "fix": the learner's stub runs broken code
    instead of raising), so that a later exercise's failed check can name the bug to fix first.
Not here: the checks themselves (kvlib.checks) and the command line (kvlib.app.cli).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvlib.core.paths import ROOT
from kvlib.course import i18n

# ---------------------------------------------------------------------------------------------
# The table: one row per exercise, in course order. Notebook, module and checks hang off the id.


# What an exercise asks of the learner (issue 46): "build" a function from its contract; "predict" a number or a
# formula before the cell that measures it (graded against the analytic value); "design" a choice under a stated
# budget that a deterministic objective judges (any choice that meets it earns the points); "fix" a body that ships
# broken (the release writes its ### BEGIN SHIPPED block into the stub: kvlib.app.release), the checks showing the
# symptom.
KINDS = ("build", "predict", "design", "fix")


@dataclass(frozen=True)
class Exercise:
    id: str  # "1.2": notebook 1, second exercise; used in headings, errors, checks and grades
    title: str
    notebook: str  # folder under notebooks/, e.g. "01-attention"
    module: str  # kvlib module the learner edits, e.g. "attention"
    name: str  # function (or Class.method) in that module
    kind: str = "build"  # what it asks: KINDS

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Exercise {self.id}: kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @property
    def file(self) -> str:
        return f"kvlib/{self.module}.py"

    @property
    def where(self) -> str:
        return f"{self.file}, notebooks/{self.notebook}"


EXERCISES: tuple[Exercise, ...] = (
    Exercise("1.1", "Stable softmax", "01-attention", "attention", "softmax"),
    Exercise("1.2", "Attention for one query", "01-attention", "attention", "attend"),
    Exercise("1.3", "Causal mask", "01-attention", "attention", "causal_mask"),
    Exercise("1.4", "Causal self-attention", "01-attention", "attention", "causal_self_attention"),
    Exercise("1.5", "Aim the query", "01-attention", "attention", "aimed_query", kind="design"),
    Exercise("2.1", "Greedy or sampled token", "02-generation", "generation", "next_token"),
    Exercise("2.2", "Find and fix: the naive generation loop", "02-generation", "generation", "generate", kind="fix"),
    Exercise("2.3", "Measuring TTFT and inter-token latency", "02-generation", "generation", "measure_ttft_itl"),
    Exercise("2.4", "The attention of a layer, head by head", "02-generation", "generation", "attention_block"),
    Exercise("2.5", "Find and fix: RMSNorm", "02-generation", "generation", "rms_norm", kind="fix"),
    Exercise("2.6", "The SwiGLU MLP", "02-generation", "generation", "swiglu"),
    Exercise("2.7", "Predict a temperature's probabilities", "02-generation", "generation", "temper", kind="predict"),
    Exercise("2.8", "Predict a decoder's parameters", "02-generation", "generation", "param_counts", kind="predict"),
    Exercise("3.1", "FLOPs of one forward pass", "03-recompute", "recompute", "forward_flops"),
    Exercise("3.2", "FLOPs one new token needs", "03-recompute", "recompute", "new_token_flops"),
    Exercise("3.3", "FLOPs of a whole generation, naive and kept", "03-recompute", "recompute", "generation_flops"),
    Exercise(
        "3.4",
        "Predict: where attention takes half",
        "03-recompute",
        "recompute",
        "attention_half_length",
        kind="predict",
    ),
    Exercise("4.1", "Write into the cache", "04-kv-cache", "kv_cache", "KVCache.update"),
    Exercise("4.2", "Attention with a cache", "04-kv-cache", "kv_cache", "cached_attention"),
    Exercise("4.3", "Find and fix: prefill and decode step", "04-kv-cache", "kv_cache", "cached_forward", kind="fix"),
    Exercise("4.4", "Bytes of the cache", "04-kv-cache", "kv_cache", "kv_cache_bytes"),
    Exercise("4.5", "Generation with the cache", "04-kv-cache", "kv_cache", "generate_cached"),
    Exercise(
        "4.6", "Predict: how many conversations fit", "04-kv-cache", "kv_cache", "sequences_that_fit", kind="predict"
    ),
    Exercise("5.1", "Arithmetic intensity of a matmul", "05-memory-wall", "roofline", "matmul_intensity"),
    Exercise("5.2", "Rows that reach the ridge", "05-memory-wall", "roofline", "ridge_batch"),
    Exercise("5.3", "Find and fix: FLOPs and bytes of a step", "05-memory-wall", "roofline", "step_cost", kind="fix"),
    Exercise("5.4", "Predicted tokens per second", "05-memory-wall", "roofline", "predicted_tokens_per_second"),
    Exercise(
        "5.5", "Predict the batch at the ridge", "05-memory-wall", "roofline", "compute_bound_batch", kind="predict"
    ),
    Exercise(
        "6.1", "Find and fix: which key/value head each query head reads", "06-gqa", "gqa", "repeat_kv", kind="fix"
    ),
    Exercise("6.2", "Grouped attention without copies", "06-gqa", "gqa", "grouped_attention"),
    Exercise("6.3", "Which heads a GQA head replaces", "06-gqa", "gqa", "mean_pool_heads"),
    Exercise("6.4", "Convert MHA to GQA", "06-gqa", "gqa", "to_gqa"),
    Exercise("6.5", "Predict the speedup of sharing", "06-gqa", "gqa", "predicted_speedup", kind="predict"),
    Exercise("7.1", "Give a block back", "07-serving", "serving", "BlockPool.release"),
    Exercise("7.2", "Room for the next tokens", "07-serving", "serving", "BlockTable.append"),
    Exercise("7.6", "Predict how full the blocks are", "07-serving", "serving", "block_utilisation", kind="predict"),
    Exercise("7.3", "Paged attention", "07-serving", "serving", "paged_attention"),
    Exercise("7.4", "One step of continuous batching", "07-serving", "serving", "Scheduler.step"),
    Exercise("7.7", "A policy under a budget", "07-serving", "serving", "Policy.blocks_to_admit", kind="design"),
    Exercise("7.5", "Find and fix: copy on write", "07-serving", "serving", "copy_on_write", kind="fix"),
    Exercise("8.1", "int8 with a scale per slice", "08-compress", "compress", "quantize"),
    Exercise("8.2", "Attention over an int8 cache", "08-compress", "compress", "int8_attention"),
    Exercise(
        "8.7", "Predict the bytes of an int8 cache", "08-compress", "compress", "int8_bytes_per_token", kind="predict"
    ),
    Exercise("8.5", "MLA by rebuilding keys and values", "08-compress", "compress", "mla_reconstruct"),
    Exercise("8.6", "MLA with absorbed weights", "08-compress", "compress", "mla_absorbed"),
    Exercise("8.8", "Predict the FLOPs of MLA's two paths", "08-compress", "compress", "mla_flops", kind="predict"),
    Exercise(
        "8.3", "Find and fix: a rolling cache with sinks", "08-compress", "compress", "SinkCache.update", kind="fix"
    ),
    Exercise("8.4", "Positions inside the rolling cache", "08-compress", "compress", "cache_positions"),
    Exercise("9.1", "The online softmax", "09-fused", "fused", "online_softmax"),
    Exercise("9.2", "Tiled attention, causal tiles skipped", "09-fused", "fused", "tiled_attention"),
    Exercise("9.3", "Merge partial attentions", "09-fused", "fused", "merge_partials"),
    Exercise("9.5", "How many splits of the cache", "09-fused", "fused", "flash_decode_splits", kind="design"),
    Exercise("9.4", "int8 attention with folded scales", "09-fused", "fused", "int8_folded_attention"),
    Exercise(
        "10.1", "Find and fix: verify drafts in one pass", "10-speculative", "speculative", "verify_greedy", kind="fix"
    ),
    Exercise("10.2", "Greedy speculative decoding", "10-speculative", "speculative", "speculative_generate"),
    Exercise(
        "10.5", "Predict the tokens a pass makes", "10-speculative", "speculative", "tokens_per_pass", kind="predict"
    ),
    Exercise("10.3", "Exact speculative sampling", "10-speculative", "speculative", "accept_sampled"),
    Exercise("10.4", "Prompt lookup", "10-speculative", "speculative", "prompt_lookup"),
)
BY_ID = {ex.id: ex for ex in EXERCISES}
NOTEBOOKS = tuple(dict.fromkeys(ex.notebook for ex in EXERCISES))
LEARNER_MODULES = tuple(dict.fromkeys(ex.module for ex in EXERCISES))  # kvlib/<module>.py, in course order


# ---------------------------------------------------------------------------------------------
# Ready-made answers: code kvlib ships that answers an exercise whole (the infrastructure's own copy of it) or measures
# what the exercise counts (its checks' yardstick). While a check runs the exercise's function (kvlib.checks locally,
# the isolated grader's child), each of these raises RuntimeError naming itself and what to do instead
# (close_ready_made, below): {exercise: ({"module:name" or "module:Class.attr": what calling it did},
# what the exercise asks instead)}

_FLOP_COUNTER = {
    "kvlib.core.model:Decoder.__init__": "built a model (kvlib.core.model.Decoder)",
    "kvlib.core.flops:forward_flops_counted": "ran torch's FLOP counter (kvlib.core.flops.forward_flops_counted)",
    "kvlib.core.flops:attention_flops_counted": "ran torch's FLOP counter (kvlib.core.flops.attention_flops_counted)",
    "kvlib.core.model:matrix_params": "took the model's own list of its matrices (kvlib.core.model.matrix_params)",
}
_COUNT = (
    "torch's counter on a model is what this count is checked against, and which matrices a token meets is the count "
    "itself: neither is a way to make it. Count from the config's sizes alone (no model is built or run)"
)
READY_MADE: dict[str, tuple[dict[str, str], str]] = {
    "2.5": (
        {"kvlib.core.model:RMSNorm.forward": "ran the model's own RMSNorm"},
        "that is the infrastructure's copy of this exercise. Find and fix the bugs of the shipped body",
    ),
    "2.6": (
        {"kvlib.core.model:MLP.forward": "ran the model's own MLP"},
        "that is the infrastructure's copy of this exercise. Write the MLP from its three weights",
    ),
    "3.1": (_FLOP_COUNTER, _COUNT),
    "3.2": (_FLOP_COUNTER, _COUNT),
    "3.3": (_FLOP_COUNTER, _COUNT),
    "3.4": (_FLOP_COUNTER, _COUNT),
    "4.2": (
        {
            "kvlib.core.cache:attention_through_cache": "called kvlib.core.cache.attention_through_cache",
            "kvlib.core.cache:causal_attend": "called kvlib.core.cache.causal_attend",
            "kvlib.core.model:Attention.attend": "called the model's attention step (Attention.attend)",
            "kvlib.core.model:causal_mask_tensor": "called the model's mask (kvlib.core.model.causal_mask_tensor)",
        },
        "that is the infrastructure's own copy of this exercise, which decides where the new tokens sit and which "
        "keys each query sees. Write those steps in cached_attention: project, store, attend, o_proj",
    ),
    "4.3": (
        {
            "kvlib.core.model:Decoder.forward": "ran the model's own forward (model(...))",
            "kvlib.core.model:Block.forward": "ran a layer's own forward (model.layers[i](...))",
        },
        "without a cache it recomputes what the cache keeps; with one, the model's and its layers' forwards are the "
        "infrastructure's copy of this exercise. Write the pass in cached_forward from the layers' parts (norms, "
        "attention through the cache, MLP), the cache and the head",
    ),
    "4.4": (
        {
            "kvlib.core.cache:CacheBase.__init__": "made a cache (KVCache)",
            "kvlib.core.cache:CacheBase.nbytes": "read a cache's nbytes",
        },
        "what a cache allocates is what this count is checked against, not a way to make it. Count the bytes from the "
        "config's sizes and the dtype (no cache is made)",
    ),
    "5.4": (
        {"kvlib.measure.machine:roofline_time": "called the notebooks' roofline time (roofline_time)"},
        "that is the notebooks' own copy of this exercise's step time. Work out how long a step takes from its "
        "FLOPs, its bytes and the device's two rates",
    ),
    "6.2": (
        {"kvlib.variants.gqa_attention:split_k_attention": "called the benchmark's split-K attention"},
        "that is the infrastructure's own grouped attention (for a decode step). Write how a group's query heads "
        "meet their key/value head in grouped_attention",
    ),
    "7.3": (
        {
            "kvlib.checks.serving:laid_out_attention": "called the checks' yardstick (laid_out_attention)",
            "kvlib.checks.serving:laid_out": "read the pool through the checks' yardstick (laid_out)",
        },
        "what paged attention is checked against, not a way to make it. Read each row's keys and values through its "
        "own block table and attend over them",
    ),
    "7.6": (
        {"kvlib.core.paging:BlockStore.__init__": "made a block pool (BlockPool)"},
        "the blocks a pool hands out are what this share is checked against, not a way to make it. Work the share "
        "out from the lengths and the block size (no pool is made)",
    ),
    "8.7": (
        {
            "kvlib.core.cache:CacheBase.__init__": "made a cache (Int8KVCache)",
            "kvlib.core.cache:CacheBase.nbytes": "read a cache's nbytes",
        },
        "what an int8 cache allocates is what this count is checked against, not a way to make it. Count the bytes "
        "from the config's sizes, the group and the scales' bytes (no cache is made)",
    ),
    "9.2": (
        {"kvlib.measure.bench_fused:tile_kinds": "called the figure's map of the tiles (bench_fused.tile_kinds)"},
        "which key tiles a query tile needs, and which need a mask, is this exercise's to work out from the positions; "
        "the figure only draws it",
    ),
    "9.4": (
        {
            "kvlib.compress:dequantize": "called dequantize (notebook 08's float copy of int8 numbers)",
            "kvlib.compress:int8_attention": "called 8.2's int8_attention (which attends a dequantised copy)",
            "kvlib.fused:chunk_partial": "called chunk_partial (attention over float keys, flash-decoding's worker)",
        },
        "float keys made from the int8 cache, a block at a time or whole, are the copy this exercise does without",
    ),
    "6.5": (
        {"kvlib.variants.gqa_attention:decode_bytes": "called the benchmark's byte count (decode_bytes)"},
        "what a decode step reads is the benchmark's yardstick here, not a way to make the prediction. Work out what "
        "sharing shrinks from the config's sizes",
    ),
    "10.4": (
        {"kvlib.measure.bench_spec:lookup_policy": "called the benchmark's lookup policy (bench_spec.lookup_policy)"},
        "the benchmark's policies are what this exercise is compared with, not a way to write it. Write the lookup "
        "yourself",
    ),
    "8.8": (
        {
            "kvlib.core.flops:matmul_flops": "ran torch's FLOP counter (kvlib.core.flops.matmul_flops)",
            "kvlib.measure.bench_compress:mla_counted_flops": "ran torch's FLOP counter on 8.5 and 8.6",
        },
        "torch's count of the two paths is what this prediction is checked against, not a way to make it. Count each "
        "path's matrix products from the sizes alone",
    ),
}


def ready_made(function: str) -> list[list[str]]:
    """[[target, message], ...] to close while `function` ("module.name", an exercise's) runs under a check."""
    module, _, name = function.partition(".")
    ex = next((ex for ex in EXERCISES if (ex.module, ex.name) == (module, name)), None)
    if ex is None or ex.id not in READY_MADE:
        return []
    targets, instead = READY_MADE[ex.id]
    return [
        [target, f"{name} (or a function it calls) {did} while Exercise {ex.id} was checked: {instead}"]
        for target, did in targets.items()
    ]


STEPS_REFUSED = ("project_q", "project_kv")  # Exercise 2.4's steps in one call each: refused in the checks' layer


def refuse_steps(attn, message: str):
    """attn (a kvlib Attention) with its STEPS_REFUSED methods raising AttributeError(message), here and, sent to
    the isolated grader's child, there too (kvlib.checks.generation's Exercise 2.4 hands such a layer in); returns
    attn."""

    def refused(*args, **kwargs):
        raise AttributeError(message)

    for name in STEPS_REFUSED:
        object.__setattr__(attn, name, refused)
    object.__setattr__(attn, "kvlib_refused", message)
    return attn


def close_ready_made(entries):
    """Make each of entries, [target, message] with target "module:name" or "module:Class.attr" (kvlib's own code that
    answers the exercise being checked, or measures what it counts: kvlib.course.exercises.READY_MADE), raise
    RuntimeError(message) when called, until the function returned is called; a target in kvlib.checks, which the
    isolated grader's child cannot import (kvlib.grading.sandbox.NOT_IN_THE_CHILD), is skipped where it is absent.
    A module's function keeps its identity (its code is swapped), so every name bound to it is closed too; a class's
    attribute is replaced on the class.
    The isolated grader's child (kvlib.grading._child) and a local run (kvlib.checks.Graded) both close them here."""
    undo = []

    def reopen():
        while undo:
            undo.pop()()

    try:
        for target, message in entries:
            module_name, _, path = str(target).partition(":")
            try:
                owner = importlib.import_module(module_name)
            except ModuleNotFoundError:  # not in this process (the grader's child has no kvlib.checks): unreachable
                if not module_name.startswith("kvlib.checks."):
                    raise
                continue
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            space = {}
            exec(f"def {name}(*args, **kwargs):\n    raise RuntimeError({str(message)!r})\n", space)  # noqa: S102
            refuse = space[name]
            if isinstance(owner, type):
                kept = owner.__dict__[name]
                kind = (
                    property if isinstance(kept, property) else staticmethod if isinstance(kept, staticmethod) else None
                )
                setattr(owner, name, kind(refuse) if kind else refuse)
                undo.append(functools.partial(setattr, owner, name, kept))
            else:
                fn = getattr(owner, name)
                if fn.__code__.co_freevars:  # a closure's code cannot be swapped: the module's name alone is closed
                    setattr(owner, name, refuse)
                    undo.append(functools.partial(setattr, owner, name, fn))
                else:
                    code, fn.__code__ = fn.__code__, refuse.__code__
                    undo.append(functools.partial(setattr, fn, "__code__", code))
    except BaseException:
        reopen()
        raise
    return reopen


# ---------------------------------------------------------------------------------------------
# Selectors: one grammar for `kvlib check`, `lab`, `present` and `present --check`
#   1.2                    an exercise (check: that one; the others: the notebook that holds it)
#   01, 1, 01-attention    a notebook, all its parts
#   02b                    a part: the second notebook of folder 02 (02a its first)
#   a path                 a notebook, or a folder of them, inside the course folder

_NOTEBOOK = re.compile(r"(\d{1,2})([a-z]?)|(\d\d)-[\w-]+")
_EXERCISE_ID = re.compile(r"\d+\.\d+")
HEADING = re.compile(r"^#+ (?:Exercise|练习) (\d+\.\d+) — (.*?)\s*$", re.MULTILINE)  # a task's heading, any language
SELECTORS = "an exercise (1.2), a notebook (01), a part (02b) or a notebook's path"


def headings(path: Path) -> dict[str, str]:
    """The exercise headings of a notebook file, {id: title as the heading spells it}, in order."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {m.group(1): m.group(2) for m in HEADING.finditer(text)}


def notebook_folders(folder: str = "notebooks", root: Path = ROOT) -> list[Path]:
    """The notebook folders under root/folder (NN-topic), in course order."""
    top = root / folder
    return sorted(p for p in top.iterdir() if p.is_dir() and p.name[:2].isdigit()) if top.is_dir() else []


def notebook_files(selector: str | None = None, *, folder: str = "notebooks", root: Path = ROOT) -> list[Path]:
    """The notebook files under root/folder that a selector names (the grammar above), in course order.

    Example: notebook_files("02b", folder="solutions") -> [ROOT / "solutions/02-generation/layer.ipynb"]
    """
    folders = notebook_folders(folder, root)
    if not selector:
        return [p for f in folders for p in sorted(f.glob("*.ipynb"))]
    if selector in BY_ID:
        ex = BY_ID[selector]
        files = sorted((root / folder / ex.notebook).glob("*.ipynb"))
        held = [p for p in files if ex.id in headings(p)]
        if not held:
            raise ValueError(f"no notebook under {folder}/{ex.notebook} holds Exercise {ex.id}")
        return held[:1]
    if _EXERCISE_ID.fullmatch(selector):
        raise ValueError(
            f"no exercise {selector!r}: the course's exercises are {EXERCISES[0].id} to {EXERCISES[-1].id}"
        )
    if m := _NOTEBOOK.fullmatch(selector):
        number, letter, named = m.groups()
        number = (number or named).zfill(2)
        match = [f for f in folders if f.name.split("-")[0] == number and (named is None or f.name == selector)]
        if not match:
            have = ", ".join(f.name.split("-")[0] for f in folders) or f"none: {root / folder} holds no notebooks"
            raise ValueError(f"no notebook {selector!r}: the course has {have}")
        files = sorted(match[0].glob("*.ipynb"))
        if not files:
            raise ValueError(f"{folder}/{match[0].name} holds no notebook")
        if not letter:
            return files
        index = ord(letter) - ord("a")
        if index >= len(files):
            parts = ", ".join(f"{number}{chr(ord('a') + i)}" for i in range(len(files)))
            raise ValueError(f"no part {selector!r}: {match[0].name} has {len(files)} notebook(s): {parts}")
        return [files[index]]
    path = Path(selector).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{selector} is outside the course folder {root}")
    if not path.exists():
        raise ValueError(f"no exercise, notebook or path {selector!r}: give {SELECTORS}")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        if not files:
            raise ValueError(f"{selector} holds no notebook")
        return files
    if path.suffix != ".ipynb":
        raise ValueError(f"{selector} is not a notebook (.ipynb)")
    return [path]


def select(selector: str | None = None, *, root: Path = ROOT) -> list[Exercise]:
    """The exercises a selector names (the grammar above), in course order.

    A whole notebook is read off the table, so it needs no notebook file; a part or a path takes the exercises
    whose headings its notebooks hold.
    """
    if not selector:
        return list(EXERCISES)
    if selector in BY_ID:
        return [BY_ID[selector]]
    m = _NOTEBOOK.fullmatch(selector)
    if m and not m.group(2):
        number = (m.group(1) or m.group(3)).zfill(2)
        picked = [ex for ex in EXERCISES if ex.notebook.split("-")[0] == number]
        if picked and (m.group(3) is None or picked[0].notebook == selector):
            return picked
    files = notebook_files(selector, root=root)
    held = {ex_id for path in files for ex_id in headings(path)}
    picked = [ex for ex in EXERCISES if ex.id in held]
    if not picked:
        raise ValueError(f"{selector} holds no exercise")
    return picked


# ---------------------------------------------------------------------------------------------
# Reference mode

_SOLUTIONS_PACKAGE = "kvlib._solutions"  # name the reference modules are loaded under
_forced: bool | None = None  # set by use_solutions(); None defers to the environment


def use_solutions(enabled: bool = True) -> None:
    """Switch every exercise to the reference solution (True) or back to your own code (False).

    The same switch as the environment variable KVLIB_SOLUTIONS=1, for presenters and graders.
    """
    global _forced
    _forced = bool(enabled)


@contextmanager
def solutions_used(enabled: bool = True):
    """use_solutions(enabled) for a with block: the mode before it comes back after (`kvlib bench --reference`)."""
    global _forced
    before = _forced
    _forced = bool(enabled)
    try:
        yield
    finally:
        _forced = before


def solutions_enabled() -> bool:
    if _forced is not None:
        return _forced
    return os.environ.get("KVLIB_SOLUTIONS", "").strip().lower() in {"1", "true", "yes", "on"}


def solutions_dir() -> Path:
    """Folder holding the reference modules: $KVLIB_SOLUTIONS_DIR, else the repo's solutions/kvlib."""
    env = os.environ.get("KVLIB_SOLUTIONS_DIR")
    return Path(env) if env else ROOT / "solutions" / "kvlib"


def reference_module(module: str):
    """Import solutions/kvlib/<module>.py once, as kvlib._solutions.<module>."""
    name = f"{_SOLUTIONS_PACKAGE}.{module}"
    if name in sys.modules:
        return sys.modules[name]
    path = solutions_dir() / f"{module}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"reference mode needs {path}, which is not there: run from a clone of the course "
            "repository, or point KVLIB_SOLUTIONS_DIR at its solutions/kvlib folder"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def reference(ex: Exercise):
    """The reference implementation of one exercise (a function, or an unbound method)."""
    obj = reference_module(ex.module)
    for part in ex.name.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------
# Stubs and the decorator


class ExerciseNotDone(NotImplementedError):
    """An exercise's stub ran. `exercise` is the unfinished one; `needed_by` the one that called it."""

    def __init__(self, exercise: Exercise, needed_by: Exercise | None = None):
        self.exercise, self.needed_by = exercise, needed_by
        if needed_by is None:
            msg = i18n.tr(
                "Exercise {id} ({title}) is not done yet: fill in {name} in {where}",
                id=exercise.id,
                title=_title(exercise),
                name=exercise.name,
                where=exercise.where,
            )
        else:
            msg = i18n.tr(
                "Exercise {id} ({title}) uses Exercise {first} ({first_title}), which is not done yet: do Exercise "
                "{first} first ({where})",
                id=needed_by.id,
                title=_title(needed_by),
                first=exercise.id,
                first_title=_title(exercise),
                where=exercise.where,
            )
        super().__init__(msg)


def _title(ex: Exercise) -> str:
    """An exercise's title in the learner's language (KVLIB_LANG): its translated hints' title where there is one;
    in English the table's, without reading a hint file."""
    return i18n.hint_title(ex.id, ex.title)


_STUB_MESSAGE = re.compile(r"^Exercise (\d+\.\d+)\b")
# The find-and-fix exercises whose learner copy ran since kvlib.checks last cleared this set: a later exercise's
# failure may come from a bug the learner has not fixed yet (kvlib.checks.run_exercise names it).
SHIPPED_CALLS: set[Exercise] = set()


def exercise(exercise_id: str, validate=None):
    """Mark a function as exercise `exercise_id` (a row of EXERCISES).

    validate: optional callable taking the same arguments; it raises ValueError on bad input
    (a wrong shape or dtype) before your code or the reference runs.
    """
    ex = BY_ID[exercise_id]

    def decorate(fn):
        if fn.__name__ != ex.name.split(".")[-1]:
            raise TypeError(f"Exercise {ex.id} is {ex.name}, not {fn.__name__}")
        if fn.__module__.startswith(_SOLUTIONS_PACKAGE + "."):
            fn.__exercise__ = ex  # the reference itself: no dispatch, no wrapping
            return fn

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if validate is not None:
                validate(*args, **kwargs)
            impl = reference(ex) if solutions_enabled() else fn
            if impl is fn and ex.kind == "fix":
                SHIPPED_CALLS.add(ex)  # the learner's copy of a shipped body ran: kvlib.checks may name it
            try:
                return impl(*args, **kwargs)
            except ExerciseNotDone as err:
                if err.exercise is ex or err.needed_by is not None:
                    raise
                raise ExerciseNotDone(err.exercise, needed_by=ex) from None
            except NotImplementedError as err:
                match = _STUB_MESSAGE.match(str(err))
                if match and match.group(1) in BY_ID:
                    done = BY_ID[match.group(1)]
                    raise ExerciseNotDone(done, None if done is ex else ex) from None
                raise

        wrapper.__exercise__ = ex
        return wrapper

    return decorate
