"""The figures the course's text states, each with its source: a number with a unit in a notebook's markdown is
one of these, or it is printed by code from the learner's own run (tests/test_facts.py holds every notebook to it).

A fact is written as the markdown writes it ("3,350 GB/s", "768 -> 3,072", "21%"). Where kvlib's own tables hold
the figure (a model's config.json in configs.py, a datasheet in devices.py), `value` recomputes it from them, and
the test checks the text against it, so a table and the text cannot drift apart. Published results (a paper's
table, a peer's benchmark) carry their source and are checked by reading it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvlib.core.configs import REAL_MODELS
from kvlib.core.devices import DEVICES
from kvlib.core.model import matrix_params


@dataclass(frozen=True)
class Fact:
    text: str  # as the markdown writes it: the number(s) and the unit
    what: str
    source: str
    value: Callable[[], float] | None = None  # the figure recomputed from kvlib's tables, in the text's unit


def _kv_bytes(name: str) -> int:
    """One token's KV cache of a model in 16-bit: K and V, every layer."""
    c = REAL_MODELS[name].config
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2


def _kv_kib(name: str) -> Callable[[], float]:
    return lambda: _kv_bytes(name) / 1024  # K and V, every layer, fp16


def _bandwidth(name: str) -> Callable[[], float]:
    return lambda: DEVICES[name].bandwidth / 1e9


def _weights_gb(name: str) -> Callable[[], float]:
    return lambda: REAL_MODELS[name].weight_bytes() / 1e9


_SEED = "the seed article ('KV Cache：以空间换时间', CSDN; docs/articles.md)"

FACTS: tuple[Fact, ...] = (
    # models (each one's config.json, kvlib/core/configs.py)
    Fact(
        "768 -> 3,072",
        "GPT-2 small's MLP: d_model to hidden_dim, GELU, no gate",
        REAL_MODELS["GPT-2 small"].source,
        lambda: REAL_MODELS["GPT-2 small"].config.hidden_dim,
    ),
    Fact("512 KiB", "Llama-2-7B's KV cache per token, fp16", REAL_MODELS["Llama-2-7B"].source, _kv_kib("Llama-2-7B")),
    Fact(
        "128 KiB",
        "Llama-3-8B's (and Mistral-7B's) KV cache per token, fp16",
        REAL_MODELS["Llama-3-8B"].source,
        _kv_kib("Llama-3-8B"),
    ),
    Fact("13.5 GB", "Llama-2-7B's weights in 16-bit", REAL_MODELS["Llama-2-7B"].source, _weights_gb("Llama-2-7B")),
    # devices (NVIDIA datasheets, kvlib/core/devices.py)
    Fact("3,350 GB/s", "H100 SXM memory bandwidth", DEVICES["H100 SXM"].source, _bandwidth("H100 SXM")),
    Fact("2,039 GB/s", "A100 80GB SXM memory bandwidth", DEVICES["A100 80GB SXM"].source, _bandwidth("A100 80GB SXM")),
    Fact(
        "80 GB", "an A100 80GB's or H100's memory", DEVICES["H100 SXM"].source, lambda: DEVICES["H100 SXM"].memory / 1e9
    ),
    # papers and peers
    Fact("21%", "the seed example's attention weight on 我 and on 爱", _SEED),
    Fact("58%", "the seed example's attention weight on AI", _SEED),
    Fact(
        "63 against 72 tokens/s",
        "Raschka's from-scratch GQA against its MHA, decoding (copies the heads)",
        "rasbt/LLMs-from-scratch, ch04/04_gqa README",
    ),
    Fact(
        "4–5×",
        "the cache's speedup in Raschka's from-scratch book, GPT-2 size, laptop CPU",
        "rasbt/LLMs-from-scratch, ch04/03_kv-cache README",
    ),
    Fact("20.4-38.2%", "share of KV memory holding tokens in systems before vLLM", "Kwon et al., arXiv:2309.06180, §1"),
    Fact(
        "2-4x", "vLLM's throughput over FasterTransformer and Orca at the same latency", "Kwon et al., arXiv:2309.06180"
    ),
    Fact("93.3%", "DeepSeek-V2's KV cache reduction against DeepSeek 67B", "DeepSeek-AI, arXiv:2405.04434, abstract"),
    Fact("5%", "GQA's uptraining budget, a share of pre-training compute", "Ainslie et al., arXiv:2305.13245, §2.1"),
    Fact("1.51 s", "T5-XXL MHA's time per sample", "Ainslie et al., arXiv:2305.13245, Table 1"),
    Fact("0.28 s", "T5-XXL GQA-8's time per sample", "Ainslie et al., arXiv:2305.13245, Table 1"),
    Fact("0.24 s", "T5-XXL MQA's time per sample", "Ainslie et al., arXiv:2305.13245, Table 1"),
    # notebook 05 (the memory wall): the roofline's arithmetic on the tables, and what engines reach
    Fact(
        "~1 FLOP/B",
        "one token through a 4096 x 4096 layer in 16-bit: 2 FLOPs per multiply-add on a 2-byte weight",
        "the roofline's count (Williams, Waterman and Patterson, CACM 2009; Pope et al., arXiv:2211.05102)",
        lambda: 2 * 4096 * 4096 / ((4096 + 4096 * 4096 + 4096) * 2),
    ),
    Fact(
        "~10x faster than it moves data",
        "Article 2's A100: its FP32 ridge, peak FLOP/s over bandwidth (true of the FP32 cores only)",
        f"{_SEED}; {DEVICES['A100 80GB PCIe'].source}",
        lambda: DEVICES["A100 80GB PCIe"].ridge(torch.float32),
    ),
    Fact(
        "ridge is ~16x higher",
        "the A100's 16-bit tensor-core ridge over its FP32 one",
        DEVICES["A100 80GB PCIe"].source,
        lambda: DEVICES["A100 80GB PCIe"].ridge(torch.float16) / DEVICES["A100 80GB PCIe"].ridge(torch.float32),
    ),
    Fact(
        "13.2 GB",
        "Llama-2-7B's matrix weights in 16-bit: what one decode step reads (the embedding is a lookup)",
        REAL_MODELS["Llama-2-7B"].source,
        lambda: matrix_params(REAL_MODELS["Llama-2-7B"].config) * 2 / 1e9,
    ),
    Fact(
        "~154 tokens/s",
        "Llama-2-7B at batch 1 in 16-bit on an A100 80GB SXM, by the roofline: its bandwidth over a step's bytes",
        f"{REAL_MODELS['Llama-2-7B'].source}; {DEVICES['A100 80GB SXM'].source}",
        lambda: (
            DEVICES["A100 80GB SXM"].bandwidth
            / (matrix_params(REAL_MODELS["Llama-2-7B"].config) * 2 + _kv_bytes("Llama-2-7B"))
        ),
    ),
    Fact(
        "A100 80GB",
        "the A100 with 80 GB of memory (a device's name)",
        DEVICES["A100 80GB SXM"].source,
        lambda: DEVICES["A100 80GB SXM"].memory / 1e9,
    ),
    Fact(
        "104.9 tokens/s",
        "gpt-fast: Llama-2-7B in bf16, batch 1, on an A100-80GB at 330 W",
        "pytorch-labs/gpt-fast README",
    ),
    Fact(
        "1,397 GB/s: 69%",
        "gpt-fast's Llama-2-7B decode on an A100-80GB: the bandwidth it reached, and its share of the 2,039 GB/s",
        "pytorch-labs/gpt-fast README; NVIDIA A100 Tensor Core GPU datasheet",
        lambda: 1397e9 / DEVICES["A100 80GB SXM"].bandwidth * 100,
    ),
    # notebook 06 (GQA): what sharing key/value heads saves, from each model's config.json
    Fact("8x 甚至更多", "Article 2's claim: MQA shrinks the cache 8x or more (it shrinks it by n_heads)", _SEED),
    Fact(
        "Llama-2-7B's by 32x",
        "MQA against MHA in Llama-2-7B's shape: one key/value head where MHA keeps n_heads",
        REAL_MODELS["Llama-2-7B"].source,
        lambda: REAL_MODELS["Llama-2-7B"].config.n_heads,
    ),
    Fact(
        "Falcon-7B's by 71x",
        "Falcon-7B (MQA): one key/value head for its 71 query heads, against MHA's 71",
        REAL_MODELS["Falcon-7B"].source,
        lambda: REAL_MODELS["Falcon-7B"].config.n_heads // REAL_MODELS["Falcon-7B"].config.n_kv_heads,
    ),
)

BY_TEXT = {f.text: f for f in FACTS}
if len(BY_TEXT) != len(FACTS):
    raise ValueError("two facts in kvlib/core/facts.py are written the same way: merge them")


# ---------------------------------------------------------------------------------------------
# The check of a notebook's markdown (tests/test_facts.py runs it on every notebook)

_UNITS = (
    r"GB/s|TB/s|MB/s|tokens/s|tok/s|TFLOP/s|GFLOP/s|FLOP/B|FLOPs|bytes|KiB|MiB|GiB|KB|MB|GB|TB|ms|µs|us|seconds|minutes"
)
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUMBER}(?:\s?[-–]\s?{_NUMBER})?"
# a number (or a range) with a unit after a space or none, or a ratio or share written onto it (4x, 2-4x, 93.3%)
_WITH_UNIT = re.compile(rf"(?<![\w.\-/^])~?{_RANGE}(?:\s?(?:{_UNITS})(?![\w/])|\s(?:s)(?![\w/])|(?:x|×|%)(?![\w]))")
_MAPPING = re.compile(rf"(?<![\w.]){_NUMBER}\s*(?:->|→)\s*{_NUMBER}")
_MEMORY = re.compile(r"\b(HBM\w*|GDDR\w*)")
_HIDDEN = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\]\([^)]*\)|<!--.*?-->", re.S)


def _sentences(text: str):
    """(start, end, sentence) over text: split after . ! ? and at blank lines and list items."""
    start = 0
    for m in re.finditer(r"(?<=[.!?])\s+(?=[A-Z*(\"'\[])|\n\s*\n|\n(?=\s*[-*>] )", text):
        yield start, m.start(), text[start : m.start()]
        start = m.end()
    yield start, len(text), text[start:]


def unsourced(markdown: str) -> list[str]:
    """What a markdown cell states without a source: numbers with a unit (or a ratio or share) and dimension mappings
    ("768 -> 2048") that are not a Fact, and a memory type (HBM, GDDR) said of no device, or of one that has another.
    A question (a sentence ending in "?") may offer numbers: it states none. Code, math and links are not read.
    Example: unsourced("GPU bandwidth is that of its HBM.") -> ["'HBM' said of no device in kvlib/core/devices.py: ..."]
    """
    text = _HIDDEN.sub(lambda m: " " * len(m.group(0)), markdown)
    text = text.replace("**", "  ")
    covered = [False] * len(text)
    for fact in FACTS:
        for m in re.finditer(re.escape(fact.text), text):
            covered[m.start() : m.end()] = [True] * (m.end() - m.start())
    problems = []
    for start, end, sentence in _sentences(text):
        if sentence.rstrip().rstrip(")*_").endswith("?"):
            continue
        for pattern in (_WITH_UNIT, _MAPPING):
            for m in pattern.finditer(sentence):
                a, b = start + m.start(), start + m.end()
                if not all(covered[a:b]):
                    problems.append(
                        f"{m.group(0)!r} is no fact of kvlib/core/facts.py: print it from the run, or add it "
                        f"with its source ({' '.join(sentence.split())[:100]!r})"
                    )
        types = _MEMORY.findall(sentence)
        if types:
            named = [d for d in DEVICES.values() if re.search(rf"\b{re.escape(d.name.split()[0])}\b", sentence)]
            for kind in sorted(set(types)):
                family = "HBM" if kind.startswith("HBM") else "GDDR"
                if not named:
                    problems.append(
                        f"{kind!r} said of no device in kvlib/core/devices.py: name the GPUs it is true of "
                        f"({' '.join(sentence.split())[:100]!r})"
                    )
                elif not any(d.memory_type.startswith(kind if kind != family else family) for d in named):
                    problems.append(
                        f"{kind!r} is not the memory of {', '.join(d.name for d in named)} "
                        f"({', '.join(d.memory_type for d in named)})"
                    )
    return problems
