"""Every claim of the course: a sentence whose truth depends on a run, declared once (kvlib.course.claims).

One section per notebook, in course order. An id is the notebook (01, 02a, 02b, 03, 04a, 04b, ..., 08a, 08b, 09, 10),
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
    # --- 04 kv cache (04a: build it; 04b: what it buys, what it costs)
    Claim(
        "04a.step-grows-by-one-row",
        "Does a cached decode step's FLOP count grow, per cached token, by exactly one row of attention "
        "(4 x layers x query heads x head_dim)?",
        "equal",
        "the step's query meets one more key and one more value per cached token; its projections do not grow",
    ),
    Claim(
        "04b.tokens-identical",
        "Do greedy tokens with the cache equal full recompute's in every run (float32, 200 new tokens)?",
        "equal",
        "the cache holds exactly the keys and values recompute would compute again (notebook 03's causal mask)",
    ),
    Claim(
        "04b.logits-within-rounding",
        "Do the cached step's logits stay within 1e-4 of full recompute's at every step?",
        "below",
        "the same products summed in another order: float32 rounding, far below a bug's whole units",
    ),
    Claim(
        "04b.same-as-transformers",
        "Does transformers' own cached generation on the same weights give the same greedy tokens (the first 100)?",
        "equal",
        "two implementations of one model and one cache: a shared mistake would have to be made twice",
    ),
    Claim(
        "04b.cache-faster",
        "Is generating 200 tokens with the cache faster than without, in every paired run?",
        "faster",
        "a cached step runs one token, a naive step all of them (notebook 03's count)",
    ),
    Claim(
        "04b.gain-grows",
        "Is the cache's speedup larger at 200 new tokens than at 25, in every run?",
        "above",
        "the naive step grows with the length, the cached one hardly (notebook 03: ~N^2 against ~N)",
    ),
    Claim(
        "04b.cached-grows-slower",
        "Does the total time with the cache grow with a smaller exponent of N than without, in every run?",
        "above",
        "a cached step's work hardly grows with N; a naive step's grows in proportion to it",
    ),
    Claim(
        "04b.cache-outweighs-weights",
        "On an 80 GB GPU filled with Llama-2-7B conversations of 4,096 tokens, do the caches outweigh the weights?",
        "above",
        "each sequence keeps its own cache, 512 KiB a token in float16; the weights are stored once",
    ),
    Claim(
        "04b.step-fixed-cost",
        "Does the fixed cost of its torch operations take more than half of the tiny model's cached step?",
        "above",
        "its 3 MB of weights stay in the CPU's cache and its arithmetic is small; each of its aten calls costs "
        "microseconds of Python and dispatch whatever its size",
    ),
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
