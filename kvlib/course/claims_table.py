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
    # --- 02b layer
    # --- 03 recompute
    Claim(
        "03.old-keys-unchanged",
        "Do the earlier positions' keys and values stay the same from one naive step to the next, up to float32 "
        "rounding (a change below 1e-5 of the largest entry)?",
        "below",
        "the causal mask: position i's key and value depend on tokens 0..i only (article 2's observation)",
    ),
    Claim(
        "03.kept-grows-slower",
        "Does the total FLOPs of a generation with every key and value kept grow more slowly with N than naive "
        "decoding's?",
        "below",
        "a kept step runs one token against t keys (a + c t), a naive one all t tokens (a t + c t^2): Exercise 3.3",
    ),
    Claim(
        "03.kept-above-linear",
        "At the tiny model's lengths (256-512 tokens), does the kept total grow faster than in proportion to N?",
        "above",
        "a kept step is a + c t: its attention part, c t, is a large share of it at these lengths (Exercise 3.4)",
    ),
    Claim(
        "03.clock-below-flops",
        "Does the naive step at 512 tokens take fewer times the step at 8 by the clock than by the FLOP count?",
        "below",
        "every forward pays a fixed cost (Python and its aten calls, the same number at every length) that the count "
        "leaves out, so short steps take longer than their FLOPs say",
    ),
    Claim(
        "03.attention-share-grows",
        "Does attention take a larger share of a naive step's time at 512 tokens than at 64?",
        "above",
        "its FLOPs grow with T^2, the rest's with T (Exercise 3.4's prediction)",
    ),
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
