"""Every claim of the course: a sentence whose truth depends on a run, declared once (kvlib.course.claims).

One section per notebook, in course order. An id is the notebook (01, 02a, 02b, 03, 04a, 04b, ..., 07a, 07b, 08a, 08b, 08c, 09a, 09b, 10a, 10b),
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

    id: str  # "06a.grouped-vs-mha": the notebook (01, 02a, 02b, 03, ... 08b, 10), a dot, a name
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
        "03.attention-time-above-flops",
        "At 8 tokens, does attention take a larger share of a naive step's time than of its FLOPs?",
        "above",
        "each layer's attention call has a fixed cost of its own, large beside its few FLOPs at 8 tokens",
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
    # --- 05a memory wall
    # --- 05b your machine
    Claim(
        "05b.decode-slower-than-its-bytes",
        "Does a decode step of the timing model take longer than reading its weights at this machine's roof would?",
        "above",
        "the roof is the best rate any kernel reached here, and a step also runs small operations and Python",
    ),
    Claim(
        "05b.batching-pays",
        "Does decoding 64 sequences at once make more tokens per second than decoding one?",
        "faster",
        "a decode step reads the weights once whatever the batch (below the ridge, the roofline predicts 64 times)",
    ),
    Claim(
        "05b.step-grows-below-ridge",
        "Below the ridge, where the roofline gives every batch the same step time, does a larger batch's step take "
        "longer than batch 1's?",
        "above",
        "on a CPU the routine, not the bytes, sets the step: torch hands one row to a matrix-vector routine and several "
        "to a matrix-matrix one, each at its own rate (notebook 05b's timing model is far below its roof)",
    ),
    Claim(
        "05b.tall-weights-column-major",
        "Does one core stream GPT-2 small's widening MLP weight faster stored column after column, the order "
        "kvlib's Decoder gives tall weights, than row after row?",
        "faster",
        "kvlib.core.model.decode_layout: 1.2-1.7x on the CPU the course was built on (docs/benchmarks.md)",
    ),
    # --- 06a gqa
    Claim(
        "06a.grouped-vs-mha",
        "At 8k cached tokens, does a GQA-2 decode step that reads the shared heads in place run faster than MHA's?",
        "faster",
        "it reads a quarter of MHA's cache bytes (notebook 05: a memory-bound step takes bytes / bandwidth)",
    ),
    Claim(
        "06a.copied-slower-than-mha",
        "At 8k cached tokens, does GQA-2 copied out (repeat_kv, then MHA attention) decode slower than MHA?",
        "below",
        "every step writes n_heads heads of copies and reads them back: more traffic than MHA's (Raschka's "
        "from-scratch GQA decoded at 63 against its MHA's 72 tokens/s)",
    ),
    Claim(
        "06a.speedup-below-prediction",
        "Does GQA-2's decode step at 8k cached tokens speed up as much as the bytes it reads shrink (Exercise 6.5)?",
        "below",
        "a step also pays a cost per operation (Python, small kernels) that sharing key/value heads does not shrink",
    ),
    Claim(
        "06a.fixed-parts-differ",
        "Is GQA-2's fixed part (the intercept of its line over kv_len) lower than MHA's by more than the time the "
        "bytes of k_proj and v_proj it sheds take at the roof?",
        "above",
        "k_proj and v_proj are small matrix-vector products that stream far below the roof: on the CPU the course was "
        "built on (one core, 2026-12-05) MHA's took 0.91 ms alone and GQA-2's 0.28, where the roof reads the "
        "difference in 0.18 ms; the intercepts differed by 0.44 ms in the same sitting (docs/benchmarks.md)",
    ),
    Claim(
        "06a.projections-below-roof",
        "Do MHA's k_proj and v_proj, timed alone as a step reads them, stream their weights slower than the roof?",
        "below",
        "a matrix-vector product on a 512 x 512 weight keeps too few reads in flight: 9 GB/s against a 35 GB/s roof on "
        "the CPU the course was built on (2026-12-05)",
    ),
    Claim(
        "06a.cache-part-shrinks-less",
        "From 4k to 8k cached tokens, does MHA's step grow by less than 4 times GQA-2's growth, though it adds 4 "
        "times the cache bytes?",
        "below",
        "attention's scores, softmax and weighted values are computed per query head (Exercise 5.3's count): sharing "
        "cuts the bytes, not that work, so GQA's attention does group_size times the FLOPs per cached byte",
    ),
    # --- 06b quality
    Claim(
        "06b.uptraining-recovers",
        "Do twenty steps of uptraining bring GQA-2's held-out loss below its loss right after conversion?",
        "below",
        "Ainslie et al., arXiv:2305.13245: a little uptraining recovers most of the quality conversion costs",
    ),
    # --- 07a paging
    # --- 07b serving
    Claim(
        "07b.continuous-vs-static",
        "In the same reserved memory, does continuous batching serve the trace at a higher throughput than static "
        "batching?",
        "faster",
        "a static batch computes every row until its longest member is done; continuous batching (Orca's "
        "iteration-level scheduling) computes no finished row and fills its place at once",
    ),
    Claim(
        "07b.paged-vs-reserved",
        "At equal KV memory, does continuous batching on paged memory serve the trace at a higher throughput than in "
        "reserved memory?",
        "faster",
        "paging runs more requests at once in the same memory (PagedAttention, arXiv 2309.06180: 2-4x on GPUs, "
        "where a larger batch costs little more per step)",
    ),
    Claim(
        "07b.paged-tpot",
        "Does each request of the paged way get its tokens at a higher rate (a shorter time per output token) than "
        "in reserved memory?",
        "slower",
        "paged steps carry more rows, so each takes longer, and prefill-first admission stalls the running rows "
        "more often",
    ),
    Claim(
        "07b.paged-runs-more",
        "Does the paged way run more requests in a step, on average, than the reserved one?",
        "above",
        "a request holds only the blocks it fills, not max_seq_len slots",
    ),
    # --- 07c sharing
    Claim(
        "07c.sharing-runs-more",
        "Where blocks bind, do more requests run at once with a shared system prompt's blocks shared?",
        "above",
        "the prefix's blocks are held once, not once per request (SGLang's RadixAttention, arXiv 2312.07104)",
    ),
    Claim(
        "07c.sharing-fewer-steps",
        "Does the trace take fewer scheduler steps with prefixes shared?",
        "below",
        "more requests run at once, so the same tokens take fewer batched forwards",
    ),
    Claim(
        "07c.sharing-throughput",
        "Does sharing the system prompt's blocks serve the trace at a higher throughput?",
        "faster",
        "its prefill is skipped and more requests run at once; against it, more rows per step and a copy-on-write "
        "for each request that writes into a shared block",
    ),
    # --- 08a compress
    Claim(
        "08a.int8-agreement",
        "Does the int8 cache pick float32's greedy token at more positions than the course's goal?",
        "above",
        "8-bit keys per channel and values per token err by at most half a step of a small scale (KIVI, "
        "arXiv 2402.02750, keeps quality at far fewer bits)",
    ),
    Claim(
        "08a.int8-step-vs-float32",
        "At 16k cached tokens, does the int8 cache part of a decode step (8.2: dequantise, then attend) run faster "
        "than float32's?",
        "slower",
        "8.2 writes a float32 copy of the cache and attention reads it back: more bytes than float32 reads alone; "
        "only a kernel that reads int8 directly gains (notebook 09)",
    ),
    Claim(
        "08a.int8-fresh-copy",
        "At 16k cached tokens, does 8.2's int8 path run faster when its float32 copy goes into a buffer reused from "
        "step to step than into fresh memory each step?",
        "faster",
        "fresh memory must be mapped and zeroed by the operating system before its first write (page faults); the "
        "as-run byte count leaves that cost out",
    ),
    Claim(
        "08a.int8-reused-vs-float32",
        "With its float32 copy in a reused buffer, is the int8 path still slower than float32 at 16k cached tokens?",
        "slower",
        "it reads the int8 cache and its scales, writes a float32 copy and reads that back: more bytes than "
        "float32 reads alone (the as-run prediction)",
    ),
    Claim(
        "08a.keys-per-channel",
        "At 2 bits, is the attention error with keys rounded per token larger than per channel?",
        "above",
        "outlier channels set a per-token scale and crush the other channels (KIVI, arXiv 2402.02750)",
    ),
    # --- 08b mla
    Claim(
        "08b.decode-absorbed-fewer-flops",
        "For one new token over 8,192 DeepSeek-V2 latents, does the absorbed path need fewer FLOPs than rebuilding?",
        "above",
        "rebuilding multiplies every latent by each head's up-projections at every step; absorbed, each query "
        "pays that once (counted by Exercise 8.8, checked against torch's FLOP counter)",
    ),
    Claim(
        "08b.prefill-rebuild-fewer-flops",
        "For a prefill of 8,192 tokens, does rebuilding keys and values need fewer FLOPs than the absorbed path?",
        "below",
        "a prefill's 8,192 queries share one rebuild, while absorbed each scores kv_rank + rope_dim = 576 numbers "
        "per key instead of nope_dim + rope_dim = 192 (vLLM's MLA backend rebuilds for prefill)",
    ),
    # --- 08c window
    Claim(
        "08c.window-holding-the-question",
        "Does a rolling window of 32 tokens, longer than the questions, answer as many capitals as the full cache?",
        "equal",
        "a window that still holds every token of the question changes nothing the answer attends to",
    ),
    Claim(
        "08c.window-evicting-the-question",
        "Does a window of 8 tokens answer fewer capitals than the full cache?",
        "below",
        "8 tokens cannot hold the question's country: the answer's evidence is evicted",
    ),
    Claim(
        "08c.sinks-cost-room",
        "Do 4 sinks plus a window of 12 answer fewer capitals than a plain window of 16 on the tiny model?",
        "below",
        "a model that formed no attention sinks gains nothing from keeping its first tokens, and loses 4 slots of "
        "recent context to them (StreamingLLM, arXiv 2309.17453: sinks form in pre-training)",
    ),
    Claim(
        "08c.sinks-formed",
        "Does any layer of the tiny model give the first 4 tokens more attention than uniform attention would?",
        "below",
        "the tiny model was trained on short question-and-answer rows, where no position is always present to "
        "park surplus attention on",
    ),
    # --- 09 fused
    Claim(
        "09a.tiled-under-one-matrix",
        "At 2,048 tokens, does the tiled loop hold less memory at its peak than one score matrix?",
        "below",
        "only a tile x tile block of scores and each query's running maximum, sum and output exist at once "
        "(FlashAttention, arXiv 2205.14135)",
    ),
    Claim(
        "09a.tiled-vs-naive",
        "At 2,048 tokens, does the tiled loop in Python run faster than the textbook way?",
        "faster",
        "the textbook way writes and reads back the whole score matrix several times (scores, mask, probabilities): "
        "memory traffic that grows with T x S, FlashAttention's IO argument (arXiv 2205.14135, Theorem 2)",
    ),
    Claim(
        "09a.tiled-vs-sdpa",
        "At 2,048 tokens, does the tiled loop in Python run slower than torch's fused SDPA kernel?",
        "slower",
        "SDPA runs the same tiles compiled; the loop pays a dozen Python operations per tile, each with a fixed cost "
        "(notebook 04)",
    ),
    Claim(
        "09b.folded-vs-copy",
        "At 16,384 cached tokens, does int8 attention with folded scales (9.4) run faster than 8.2's dequantised copy?",
        "faster",
        "8.2 writes a float32 copy four times the int8 cache's size and reads it again; folding converts a block at "
        "a time",
    ),
    Claim(
        "09b.folded-vs-float32",
        "At 16,384 cached tokens, does eager int8 attention with folded scales run faster than float32 SDPA?",
        "slower",
        "it reads a quarter of the bytes, but as a Python loop of small operations per block (each with notebook 04's "
        "fixed cost), against one compiled kernel",
    ),
    Claim(
        "09b.compiled-vs-float32",
        "At 16,384 cached tokens, does int8 attention written as 8.2's dequantise-then-attend, compiled by "
        "torch.compile, run faster than float32 SDPA?",
        "faster",
        "inductor fuses the int8 conversion and the scales into the loops that read the cache, so no float copy is "
        "stored: a quarter of float32's bytes, read once",
    ),
    # --- 10 speculative
    Claim(
        "10a.eight-tokens-under-two-steps",
        "Does one forward of the tiny model over 8 tokens through its cache cost less than two forwards over 1?",
        "below",
        "8 tokens read the weights once and share a step's fixed costs, which at this size are most of it (notebook "
        "04); on a GPU in 16-bit, 8 tokens also stay far below the ridge (notebook 05)",
    ),
    Claim(
        "10b.below-the-formula",
        "At gamma 4, does the drafter model speed decoding up by less than Leviathan et al.'s formula predicts from "
        "the measured alpha and c?",
        "below",
        "the formula charges a round gamma c + 1 steps: a verify pass of gamma + 1 tokens as one step, the drafting "
        "as gamma draft steps timed alone, nothing for the rest of the round (Leviathan et al., arXiv 2211.17192)",
    ),
    Claim(
        "10b.verify-over-a-step",
        "At gamma 4, does a verify pass over the newest token and 4 drafts cost more than one plain decode step?",
        "above",
        "5 tokens do more arithmetic and build a mask a 1-token step does not; at this size neither weights nor "
        "arithmetic dominate (notebook 04), so the extra work shows: the formula's one step is a lower bound",
    ),
    Claim(
        "10b.drafting-over-c",
        "At gamma 4, does a round's drafting cost more than 4 draft steps timed alone (4c)?",
        "above",
        "the drafter also feeds the tokens the model kept or replaced since its last proposal, and its loop makes "
        "a tensor and reads a token back at every step",
    ),
    Claim(
        "10b.lookup-records",
        "Can prompt lookup at gamma 8 reach 2x plain decoding on the repeated records: do its counts allow it (a pass "
        "costing at least a step)?",
        "below",
        "the tiny model writes a record of its own after them, so lookup's drafts are rarely kept: the tokens a "
        "verify pass makes cap the speedup",
    ),
    Claim(
        "10b.lookup-document",
        "Does prompt lookup at gamma 8 reach 2x plain decoding on the model's own document given back?",
        "above",
        "the model writes its text again where its context reads the same, so lookup's drafts are kept pass after "
        "pass (issue 28's goal for a prompt that repeats text)",
    ),
)

BY_ID = {c.id: c for c in CLAIMS}
if len(BY_ID) != len(CLAIMS):
    raise ValueError("two claims share an id in kvlib/course/claims_table.py")
