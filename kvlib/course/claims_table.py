"""Every claim of the course: a sentence whose truth depends on a run, declared once (kvlib.course.claims).

One section per notebook, in course order. An id is the notebook (01, 02a, 02b, 03, ..., 08a, 08b, 09, 10),
a dot and a name; `expect` is the outcome the course's argument predicts (faster, slower, above, below,
equal), and `why` that argument or its source. The notebook evaluates the claim on its own run with
claims.compare / against / exact; tests/test_notebooks.py checks that every claim declared for a notebook
is recorded by its reference run, each sentence true to its values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """A sentence of the course whose truth depends on a run: declared once, evaluated where the run happens."""

    id: str  # "06.grouped-vs-mha": the notebook (01, 02a, 02b, 03, ... 08b, 10), a dot, a name
    question: str  # what the text asks, answered by the run
    expect: str  # the outcome the course's argument predicts: faster, slower, above, below or equal
    why: str = ""  # the argument behind the expectation, or its source

    @property
    def notebook(self) -> str:
        return self.id.split(".", 1)[0]


CLAIMS: tuple[Claim, ...] = (
    # --- 01 attention
    # --- 02a generation
    Claim(
        "02a.held-out",
        "Asked in 24 phrasings it never read (held out), does the model answer more than half: did it learn the facts?",
        "above",
        "a held-out phrasing never appears in the training text, so only a fact learned apart from its wording "
        "answers it; half of 24 is the line between mostly right and mostly wrong",
    ),
    Claim(
        "02a.prefill-short",
        "Is a short prompt's TTFT mostly fixed cost: does doubling it (8 to 16 tokens) multiply the TTFT by under 1.5?",
        "below",
        "a forward costs a + b n: doubling n multiplies it by (a + 2bn) / (a + bn), below 1.5 when the fixed part a "
        "(a few hundred aten calls of Python and dispatch) outweighs the work b n of so few tokens",
    ),
    Claim(
        "02a.prefill-long",
        "Is a long prompt's TTFT mostly work: does doubling it (128 to 256 tokens) multiply the TTFT by over 1.5?",
        "above",
        "at 128 tokens the work b n outweighs the fixed part a, so a doubling costs more than 1.5x",
    ),
    Claim(
        "02a.decode-grows",
        "Over 128 new tokens, does a naive decode step (the whole sequence rerun) take longer as the sequence grows?",
        "above",
        "each naive step runs every token so far: the work grows with the length, the fixed part does not",
    ),
    # --- 02b layer
    # --- 03 recompute
    # --- 04 kv cache
    # --- 05 memory wall
    # --- 06 gqa
    Claim(
        "06.grouped-vs-mha",
        "At 8k cached tokens, does a GQA-2 decode step that reads the shared heads in place run faster than MHA's?",
        "faster",
        "it reads a quarter of MHA's cache bytes (notebook 05: a memory-bound step takes bytes / bandwidth)",
    ),
    # --- 07 serving
    # --- 08a compress
    # --- 08b mla
    # --- 09 fused
    # --- 10 speculative
)

BY_ID = {c.id: c for c in CLAIMS}
if len(BY_ID) != len(CLAIMS):
    raise ValueError("two claims share an id in kvlib/course/claims_table.py")
