"""kvlib/core/facts.py: every figure the notebooks' markdown states is a sourced fact, checked against kvlib's own
tables where they hold it; a result of the learner's run is printed by code, never written in markdown."""

import json
import re
from collections import Counter

import pytest
from conftest import ROOT

from kvlib.app.sitting import HEADER  # a notebook's generated minutes line: the estimate's, tests/test_sitting.py
from kvlib.core.configs import REAL_MODELS
from kvlib.core.devices import DEVICES
from kvlib.core.facts import FACTS, unsourced

NOTEBOOKS = sorted(ROOT.glob("solutions/[0-9]*/*.ipynb")) + sorted(ROOT.glob("notebooks/[0-9]*/*.ipynb"))

# What the markdown states today that is not yet a fact (issue 44's fixes remove them notebook by notebook). Each
# entry must still be found where it is listed: one removed from a notebook must be removed here too, so this list
# only shrinks; anything new fails.
KNOWN: dict[str, list[str]] = {}


def _stated(path) -> Counter:
    cells = json.loads(path.read_text())["cells"]
    found = Counter()
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for problem in unsourced(HEADER.sub("", "".join(cell["source"]))):
                found[re.match(r"'(.*?)' ", problem, re.S).group(1).replace("\\n", "\n")] += 1
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.stem}")
def test_markdown_states_only_sourced_facts(path):
    """Check that a notebook's markdown states no number with a unit, no ratio or share, no dimension mapping and no
    memory type that kvlib/core/facts.py does not hold with its source (beyond the shrinking KNOWN list)."""
    known = Counter(KNOWN.get(f"{path.parent.name}/{path.stem}", []))
    found = _stated(path)
    assert not found - known, f"not facts (print them from the run, or add them with a source): {list(found - known)}"
    assert not known - found, f"fixed in the notebook: remove from KNOWN in this file: {list(known - found)}"


def test_the_check_catches_what_issue_44_found():
    """Check that the lint flags a memory type said of no device or of the wrong one, a wrong MLP width and a run's
    result written in markdown, and passes a fact, a question's options, and code, math and links."""
    assert unsourced("GPU bandwidth is that of its HBM.")
    assert unsourced("The T4's HBM streams at 320 GB/s.")  # the T4 has GDDR6; 320 GB/s is no fact either
    assert unsourced("GPT-2's MLP is 768 -> 2048, with a gate.")
    assert unsourced("On this machine decode ran 1.4x faster.") and unsourced("It took 15 s.")
    assert not unsourced("GPT-2's MLP is 768 -> 3,072: GELU, no gate. The H100 SXM's HBM3 gives 3,350 GB/s.")
    assert not unsourced(
        "How much faster will it be, 1x, 2x or 3x? Compare `x = 4x` and $2x$ and [a link](https://x.org/1 GB)."
    )


@pytest.mark.parametrize("fact", [f for f in FACTS if f.value], ids=lambda f: f.text)
def test_each_tabled_fact_equals_kvlibs_table(fact):
    """Check that a fact kvlib's tables hold reads as the tables compute it, to the digits the text shows."""
    last = re.findall(r"\d[\d,]*(?:\.\d+)?", fact.text)[-1]
    decimals = len(last.split(".")[1]) if "." in last else 0
    assert round(fact.value(), decimals) == float(last.replace(",", "")), (fact.text, fact.value())


def test_real_models_facts_issue_44_corrected():
    """Check the tables against the primary sources for what the course once got wrong: GPT-2 small's MLP is
    768 -> 3,072 with GELU and no gate; Mistral-7B v0.1 was trained at 8,192 tokens with a 4,096-token window (its
    config.json's 32,768 is max_position_embeddings); Qwen2.5-7B was trained at 32,768 (its 131,072 is YaRN's reach,
    the Qwen2.5 report); which GPUs' bandwidth is HBM and which GDDR."""
    gpt2, mistral, qwen = REAL_MODELS["GPT-2 small"], REAL_MODELS["Mistral-7B"], REAL_MODELS["Qwen2.5-7B"]
    assert (gpt2.config.d_model, gpt2.config.hidden_dim, gpt2.mlp) == (768, 3072, "GELU")
    assert (mistral.context, mistral.sliding_window, mistral.config.max_seq_len) == (8192, 4096, 32768)
    assert (qwen.context, qwen.config.max_seq_len) == (32768, 131072)
    assert all(REAL_MODELS[m].mlp == "SwiGLU" for m in ("Llama-2-7B", "Llama-3-8B", "Mistral-7B", "Qwen2.5-7B"))
    memory = {name: d.memory_type for name, d in DEVICES.items()}
    assert {n for n, t in memory.items() if t.startswith("HBM")} == {
        "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM", "H100 SXM", "H100 PCIe", "H200 SXM"
    }  # fmt: skip
    assert memory["T4"] == memory["L4"] == "GDDR6" and memory["RTX 4090"] == "GDDR6X"
