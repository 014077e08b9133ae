"""Every solution notebook runs top to bottom in reference mode (nbclient), as a presenter runs it."""

import os
import re
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from kvlib.app import release as course
from kvlib.app import sitting
from kvlib.grading.execute import SteppedNotebookClient

pytestmark = pytest.mark.slow  # every test here executes a whole notebook

NOTEBOOKS = [p for name in course.assignments() for p in sorted((ROOT / "solutions" / name).glob("*.ipynb"))]
_executed = {}


def execute(path):
    """Run a notebook once per session in reference mode, its claims recorded in a folder of its own; returns
    (notebook, seconds)."""
    if path not in _executed:
        nb = nbformat.read(path, as_version=4)
        env_before = os.environ.get("KVLIB_SOLUTIONS")
        os.environ["KVLIB_SOLUTIONS"] = "1"
        os.environ["KVLIB_CLAIMS_DIR"] = str(_claims_dir(path))  # the kernel inherits it
        start = time.perf_counter()
        try:
            # 120 s a cell, as nbgrader_config.py gives a graded cell (the slowest cell takes seconds). Stepped waits:
            # with plain NotebookClient, one run in 20 of notebook 01 waited the whole timeout for a reply the kernel had
            # sent (a lost zmq wake-up while the widget cell floods iopub); tests/test_notebook_stall.py keeps it fixed
            SteppedNotebookClient(
                nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
            ).execute()
        finally:
            os.environ["KVLIB_SOLUTIONS"] = env_before or ""
        _executed[path] = (nb, time.perf_counter() - start)
        if keep := os.environ.get("KVLIB_EXECUTED_DIR"):  # for `kvlib course site --executed` (CI builds the site)
            copy = Path(keep) / path.relative_to(ROOT / "solutions")
            copy.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, copy)
    return _executed[path]


def _claims_dir(path) -> Path:
    return Path(tempfile.gettempdir()) / f"kvlib-claims-{os.getpid()}" / course.part(path)


@pytest.fixture(scope="module", autouse=True)
def _remove_claims_records():
    yield
    shutil.rmtree(Path(tempfile.gettempdir()) / f"kvlib-claims-{os.getpid()}", ignore_errors=True)


def text_output(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def cell_text(nb, cell_id) -> str:
    """The printed output of one cell, by its id."""
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []))


def claims_03(nb) -> None:
    """Notebook 03's text says what holds by construction; its run must show it."""
    import re

    rows = [r.split() for r in cell_text(nb, "share").splitlines()[1:]]
    shares = [float(counted.rstrip("%")) for _, counted in rows]
    assert len(rows) == 3 and 50 < shares[0] < shares[1] < shares[2], rows  # "far more than half, the more the longer"
    rows = [r.split() for r in cell_text(nb, "causal-share").splitlines()[1:]]
    assert len(rows) == 3 and all(float(c.rstrip("%")) <= float(f.rstrip("%")) for _, f, c in rows), rows  # "less"
    ratios = re.findall(r"ratio (\S+)$", cell_text(nb, "ex3-1-try"), re.M)
    assert ratios and set(ratios) == {"1.000"}, f"your count != torch's: {ratios}"
    calls = re.search(r"makes (\d+) aten calls", cell_text(nb, "curve"))
    assert calls and int(calls.group(1)) > 50, "the aten count is not printed, or is implausibly small"
    flop_ratio = re.search(r"the FLOP count's ratio \(([\d.]+)\)", cell_text(nb, "attention-time"))
    assert flop_ratio and 100 < float(flop_ratio.group(1)) < 120, "the text says the step at 512 costs about 110 times"
    half = re.search(
        r"attention ([\d.]+)% of the FLOPs at (\d+) tokens, ([\d.]+)% at (\d+)", cell_text(nb, "ex3-4-try")
    )
    assert half and float(half.group(1)) < 50 <= float(half.group(3)), (
        f"3.4's length is not where torch finds half: {half}"
    )


CLAIMS = {"03-recompute": claims_03}  # what a notebook's text states by construction, checked on its run


@pytest.mark.parametrize("path", NOTEBOOKS, ids=course.label)
def test_solution_notebook_runs_top_to_bottom(path):
    """Check that the solution notebook executes without an error in reference mode, and that its printed output
    shows what its text states by construction (CLAIMS)."""
    nb, seconds = execute(path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors[0]
    CLAIMS.get(course.label(path), lambda nb: None)(nb)
    gap, after = longest_idle_gap(nb)
    assert gap < 20, f"the kernel sat idle {gap:.1f} s after cell {after} before the next: a lost wake-up (a stall)"
    print(f"{course.label(path)}: {seconds:.1f} s, longest idle gap between cells {gap:.2f} s")


def longest_idle_gap(nb) -> tuple[float, str]:
    """The longest time, on the kernel's own clock, between one code cell's end and the next one's start, and the
    cell after which it fell: the time the client took to notice a reply. A lost zmq wake-up made a plain nbclient
    wait a whole cell timeout there (notebook 01's widget cell once; notebook 09's tile slider, 1 run in 4 with plain
    nbclient, 2026-12-04); the stepped client every run here uses notices within a step (tests/test_notebook_stall.py)."""
    cells = [c for c in nb.cells if c.cell_type == "code" and "execution" in c.metadata]
    gaps = [
        (
            _clock(b.metadata["execution"]["iopub.status.busy"]) - _clock(a.metadata["execution"]["iopub.status.idle"]),
            a.id,
        )
        for a, b in zip(cells, cells[1:])
    ]
    return max(gaps, default=(0.0, "none"))


def _clock(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=course.label)
def test_recorded_printed_lines_match_the_run(path):
    """Check that the lines this run printed are those recorded for the sitting estimate (assets/sitting/outputs.json):
    the notebook's total within 10% or 5 lines, as a timing table's notes vary a little from run to run."""
    nb, _ = execute(path)
    rel = path.relative_to(ROOT / "solutions").as_posix()
    recorded = {cell_id: entry["lines"] for cell_id, entry in sitting.load_record().get(rel, {}).items()}
    now = {c["id"]: sitting.printed_lines(c) for c in nb.cells if c["cell_type"] == "code"}
    differ = {
        cell_id: (recorded.get(cell_id), lines) for cell_id, lines in now.items() if recorded.get(cell_id) != lines
    }
    before, after = sum(recorded.values()), sum(now.values())
    assert abs(after - before) <= max(5, 0.1 * before), (
        f"solutions/{rel} printed {after} lines, {before} recorded: run kvlib course plan --record {rel[:2]} "
        f"(cells that differ, recorded and now: {differ})"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=course.label)
def test_notebook_records_each_of_its_claims_true_to_its_values(path):
    """Check that the reference run evaluated every claim declared for this notebook (kvlib/course/claims_table.py),
    each recorded sentence saying what its values show (claims.check_record), and that the sentence was printed."""
    from kvlib.course import claims
    from kvlib.course.claims_table import CLAIMS as DECLARED

    nb, _ = execute(path)
    part = course.part(path)
    records = {r["id"]: r for r in claims.load(_claims_dir(path), notebooks=[part])}
    declared = [c.id for c in DECLARED if c.notebook == part]
    assert not set(declared) - set(records), f"declared, never evaluated by the run: {set(declared) - set(records)}"
    printed = text_output(nb)
    for claim_id in declared:
        assert claims.check_record(records[claim_id]) == [], records[claim_id]
        assert records[claim_id]["text"] in printed, f"{claim_id}: recorded but not printed"


def test_notebook_01_shows_the_seed_numbers():
    """Check that notebook 01 prints the seed's weights and outputs, unscaled then scaled."""
    nb, _ = execute(ROOT / "solutions" / "01-attention" / "attention.ipynb")
    text = text_output(nb)
    for expected in ("0.212 0.212 0.576", "1.94", "0.248 0.248 0.503", "1.759"):
        assert expected in text, f"{expected!r} not in the executed notebook's output"
    assert text.index("0.212 0.212 0.576") < text.index("0.248 0.248 0.503")
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "notebook 01 shows no figure (the causal heatmap)"
    widgets = [
        o
        for c in nb.cells
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets, "notebook 01 shows no widget"


def test_notebook_05_puts_no_measured_point_above_its_roof():
    """Check that notebook 05b's measured decode and prefill sit at or under its roof (the best of its runs, raised to a
    point that passed it while the roof cell's runs were slowed), its figures show, and what 05's text asks is printed
    (both models' cache crossings, why a narrow layer never reaches the ridge)."""
    nb, _ = execute(ROOT / "solutions" / "05-memory-wall" / "your_machine.ipynb")
    text = text_output(nb)
    shares = [int(s) for s in re.findall(r"= (\d+)% of the roof there", text)]
    assert len(shares) == 2, "notebook 05 no longer prints where decode and prefill sit against its roof"
    assert max(shares) <= 100, f"a measured point above the roof ({shares}%): a rate reached must raise it (lift_roof)"
    assert re.search(r"ridge \d+\.\d\d FLOP/B", text), "notebook 05 prints no measured ridge"
    assert "this machine's bandwidth: " in text, "notebook 05 prints its roof without roof_line's one sentence"
    busy = re.search(r"eager the GPU was busy at most (\d+)% of the step", text)
    assert busy and int(busy.group(1)) < 50, "the recording's text says eager decode leaves the GPU mostly idle"
    batching = next(c for c in nb.cells if c.get("id") == "23c126bb")
    assert any("image/png" in o.get("data", {}) for o in batching.get("outputs", [])), (
        "the batching figure is not shown"
    )
    # what the text asks, printed: both models' crossings, Mistral's window stopping its cache
    assert "Llama-2-7B, batch  16: the cache equals the weights at 1,607 tokens" in text
    assert "Mistral-7B, batch   1: never: the 4,096-token sliding window" in text
    paper = text_output(execute(ROOT / "solutions" / "05-memory-wall" / "memory_wall.ipynb")[0])
    assert "a narrow 64 x 64 layer on an H100: None; even a million rows reach only 32 FLOP/B" in paper, (
        "05a prints None for the 64 x 64 layer without its reason"
    )


def test_notebook_02_prints_what_its_run_shows():
    """Check that notebook 02a samples where its model is unsure, that 2,000 draws at t = 3 land near 2.7's
    predicted share for 巴, that it prints the held-out count with its misses, and counts the same aten calls at 8
    and 256 tokens."""
    import re

    nb, _ = execute(ROOT / "solutions" / "02-generation" / "generation.ipynb")
    text = text_output(nb)
    top = re.search(r"'.+?'  drawn \d\.\d+   probability (\d\.\d+)", text)
    assert top and float(top.group(1)) < 0.9, "the sampling demo should sit where the top token is far from sure"
    kinds = re.search(r"(\d+) different characters in 1,000 draws", text)
    assert kinds and int(kinds.group(1)) > 2, "1,000 draws at t = 1 should visibly vary"
    predicted, drawn = map(float, re.search(r"巴 at t = 3: predicted ([\d.]+), drawn ([\d.]+) of 2,000", text).groups())
    assert predicted < 0.25 and abs(predicted - drawn) < 0.03, (
        predicted,
        drawn,
    )  # 2,000 draws: a standard error of 0.01
    assert re.search(r"\d+ of 24 held-out questions answered exactly; wrong: ", text)
    calls = re.search(r"one forward makes (\d+) calls to torch's kernels at 8 tokens, (\d+) at 256", text)
    assert calls and calls.group(1) == calls.group(2), "a forward's aten calls should not depend on the prompt's length"


def test_notebook_02b_builds_the_models_forward():
    """Check that 02b's forward built from 2.4-2.6 gives the model's logits and its next token, 巴, and that 2.8's
    prediction of the tiny model's parameters is what the built model counts, part by part."""
    nb, _ = execute(ROOT / "solutions" / "02-generation" / "layer.ipynb")
    text = text_output(nb)
    diff = re.search(r"largest difference from model\(ids\): (\S+)", text)
    assert diff and float(diff.group(1)) < 1e-4
    assert "next token '巴'" in text
    rows = re.findall(r"^\s+(\w+(?: all)?)\s+predicted\s+([\d,]+)\s+counted\s+([\d,]+)", text, re.M)
    assert len(rows) == 6 and all(a == b for _, a, b in rows), rows
    assert "Llama-2-7B: 6.74 billion predicted (6.74 in kvlib's table" in text


def test_notebook_08a_prints_what_its_text_claims():
    """Check notebook 08a's printed claims: dequantising a share of its run, the reused buffer's time and the bandwidth
    behind every prediction printed, the int8 storage's parts adding up, 8.7's prediction equal to Int8KVCache's own
    bytes, the prompts used, and the key-axis study at 2 bits."""
    nb, _ = execute(ROOT / "solutions" / "08-compress" / "compress.ipynb")
    text = text_output(nb)
    shares = [int(s) for s in re.findall(r"(\d+)% dequantising\), into a reused buffer +[\d.]+ ms", text)]
    assert len(shares) == 2 and all(0 < s <= 100 for s in shares), shares
    assert re.search(r"this machine's bandwidth: [\d.]+ GB/s \(.*\); each prediction below is bytes / that", text)
    m = re.search(
        r"float32 (\d+) KiB; int8 (\d+) KiB = int8 numbers (\d+) \(a quarter of float32's\) \+ scales (\d+) \+ float residual (\d+)",
        text,
    )
    assert m, "the int8 storage line is missing"
    f32, total, numbers, scales, residual = map(int, m.groups())
    assert numbers * 4 == f32 and abs(numbers + scales + residual - total) <= 1
    predicted, held = re.search(r"per token: predicted ([\d,.]+) bytes, Int8KVCache holds ([\d,.]+)", text).groups()
    assert predicted == held, (predicted, held)
    assert re.search(r"\d+ prompts x 16 tokens", text) and re.search(r"2 bits: attention output error", text)


def test_notebook_08c_prints_what_its_text_claims():
    """Check notebook 08c's printed claims: a window as long as the questions answering as the full cache and a short
    one not, the questions used, and the uniform share the sinks are compared with."""
    nb, _ = execute(ROOT / "solutions" / "08-compress" / "window.ipynb")
    text = text_output(nb)
    right = dict(re.findall(r"^\s+(full cache|window \d+)\s+([\d.]+)%", text, re.M))
    assert right["window 32"] == right["full cache"] and float(right["window 8"]) < float(right["full cache"]), right
    shares = [float(s) for s in re.findall(r"attention on the first 4 tokens ([\d.]+)%", text)]
    if all(s < 2.9 for s in shares):  # "a model that formed none only loses window room to them"
        sinks = re.search(r"^\s+4 sinks \+ window 12\s+([\d.]+)%", text, re.M)
        assert sinks and float(sinks.group(1)) <= float(right["window 16"]), (sinks, right)
    assert re.search(r"\d+ questions of \d+-\d+ tokens", text)
    assert "uniform attention would give them 2.9%" in text


def test_notebook_08b_prints_the_prefill_and_the_table():
    """Check that 08b prints both MLA paths' prefill cost, 8.8's prediction equal to torch's count of 8.5 and 8.6,
    MLA's own saving against DeepSeek 67B beside the paper's 93.3%, every scheme's row, and no crossing of the
    weights past a model's context left unflagged."""
    nb, _ = execute(ROOT / "solutions" / "08-compress" / "mla.ipynb")
    text = text_output(nb)
    assert "a prefill of 8,192 tokens" in text
    counts = re.findall(r"predicted +([\d,]+), torch counted +([\d,]+) FLOPs", text)
    assert len(counts) == 4 and all(a == b for a, b in counts), counts
    assert re.search(r"\d+\.\d% less, both 16-bit; 93\.3% less with V2's latents at 6 bits", text)
    assert re.search(r"DeepSeek-V2\s+MLA", text), "the table of schemes has no MLA row"
    from kvlib.measure.bench_compress import bytes_table

    for r in bytes_table():  # every crossing past its model's context is flagged where it is printed
        if r["past_context"]:
            assert f"{r['outweighs_weights_at']:,} (past its {r['context']:,}-token context)" in text, r
    from kvlib.core.configs import MLA_MODELS, REAL_MODELS
    from kvlib.measure import bench_compress

    source = "".join(c.source for c in nb.cells if c.get("id") == "c32cc59d")
    assert "def schemes(context=65536, window=4096)" in source, "the ordering quiz's default moved: check it for ties"
    sizes = bench_compress.schemes_per_layer(REAL_MODELS["Llama-3-8B"].config, MLA_MODELS["DeepSeek-V2"], 65536, 4096)
    assert len(set(sizes.values())) == len(sizes), f"the ordering quiz has a tie at its default: {sizes}"


def test_notebook_07a_predicts_what_its_blocks_hold():
    """Check that 07a's prediction of how full the blocks are (7.6) equals the count its block tables (7.2) give at
    every block size, that blocks of max_seq_len give notebook 04's reservation, and that it ends with a Next."""
    nb, _ = execute(ROOT / "solutions" / "07-serving" / "paging.ipynb")
    text = text_output(nb)
    rows = re.findall(r"blocks of +(\d+): predicted +([\d.]+)%; [\d,]+ tokens in [\d,]+ slots held, +([\d.]+)%", text)
    assert [int(b) for b, _, _ in rows] == [1, 4, 16, 64, 512], rows
    assert all(p == held for _, p, held in rows), rows
    reserved = re.search(r"a finished request holds on average \d+ tokens, (\d+)% of 512 slots", text)
    assert reserved and round(float(rows[-1][2])) == int(reserved.group(1)), (reserved, rows[-1])


def test_notebook_07b_prints_what_holds_by_construction():
    """Check that notebook 07b's run shows the plain scheduler missing 7.7's budget by its recompute (what the guess
    asks) and the reference policy meeting it, labels a reservation's KV use as modelled beside the paper's measured
    range, runs each way in three rounds with inter-token latency and TPOT, draws notebook 05's roof in its one
    sentence, and shows its figures (the comparison, the block map, the batch roofline)."""
    nb, _ = execute(ROOT / "solutions" / "07-serving" / "serving.ipynb")
    text = text_output(nb)
    assert re.search(r"^plain Scheduler: .*: misses the recompute target$", text, re.M), "the guess's answer moved"
    assert re.search(r"^your Policy +: .*: meets the budget$", text, re.M)
    assert "KV in use with a reservation is modelled, from an assumed max_seq_len slots" in text
    assert "20.4-38.2%" in text and "continuous, reserved" in text and "ITL p99" in text and "TPOT" in text
    assert text.count("(medians of 3 rounds)") == 3, "each way of the equal-memory comparison runs three rounds"
    assert "iteration-level" not in text, "one name for one mechanism: continuous batching, reserved or paged"
    assert re.search(r"this machine's bandwidth: [\d.]+ GB/s \(.*\); ridge \d+\.\d\d FLOP/B", text)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3, (
        f"notebook 07b shows {len(images)} figures, expected the comparison, block map and roofline"
    )


def test_notebook_07c_shares_what_its_text_says():
    """Check that notebook 07c runs more requests at once with a shared prefix where blocks bind, and skips prefill."""
    nb, _ = execute(ROOT / "solutions" / "07-serving" / "sharing.ipynb")
    text = text_output(nb)
    more = re.search(r"where blocks bind, requests at once, sharing on / off: ([\d.]+), above", text)
    assert more and float(more.group(1)) > 1, "sharing a prefix should let more requests run at once where blocks bind"
    skipped = re.search(r"^sharing on: .*\((\d+) skipped\)", text, re.M)
    assert skipped and int(skipped.group(1)) > 0, "sharing on should skip the shared prefix's prefill"


def test_notebook_06_prints_what_its_text_says():
    """Check that notebook 06's text agrees with its run: the sizes and shapes its markdown states are the ones
    printed, the recording is predicted from the device table, no nan or negative fixed part is printed, and the
    questions its Going further asks (what the projections sharing shrinks take alone, 06b's recording against the
    paper) are answered in print."""
    nb, _ = execute(ROOT / "solutions" / "06-gqa" / "gqa.ipynb")
    text = text_output(nb)
    for expected in (
        "query heads 0-7 read key/value heads [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]",  # 6.1's try-it, reference mode
        "(n_layers, batch, n_kv_heads, max_seq_len, head_dim),  2048 KiB",  # the cache shape the text names
        "3,840 numbers",  # the copying path's largest tensor: n_heads copies of the keys, as the text says
        "at  25.7k tokens",  # Llama-2-7B's cache matches its weights (the text: about 26k)
        "at   1.6k tokens",  # ... for a batch of 16
        "at 122.5k tokens",  # Llama-3-8B: 4.8 times further out than Llama-2-7B's 25.7k, as the text says
        "at   7.7k tokens",  # ... and 4.8 times 1.6k for a batch of 16
        "4,800.0 GB/s (H200 SXM datasheet",  # the recording's predictions use the device table's bandwidth
    ):
        assert expected in text, f"{expected!r} not in notebook 06's output"
    assert "nan" not in text.replace("nans", "").lower().split(), "notebook 06 printed nan"
    assert "split-k" not in text and "goal:" not in text, "06 prints split-K rows or the project's goal line"
    fixed = re.findall(r" (\d+\.\d\d) \((\d+\.\d\d)-(\d+\.\d\d)\) ", text)  # fixed ms (q1-q3)
    assert all(float(lo) <= float(f) <= float(hi) for f, lo, hi in fixed), (
        f"a fixed part outside its quartiles: {fixed}"
    )
    assert "GB/s with its read kernel" not in text, "the GPU recording's own read rate differs from notebook 05's"
    assert "The course ends" not in text and "ends the path" not in "".join(
        "".join(c.source) for c in nb.cells if c.cell_type == "markdown"
    )
    diffs = text.split("difference from the GQA layer's own attention, query heads 0-7:")[1].split("\n")[0]
    diffs = [float(d) for d in re.findall(r"'([^']+)'", diffs)]
    assert len(diffs) == 8 and max(diffs) < 1e-6, "6.1's try-it: the text expects every head below 1e-6"
    assert "k_proj and v_proj alone: MHA's" in text, (
        "06a's Going further no longer times the projections sharing shrinks"
    )
    quality = text_output(execute(ROOT / "solutions" / "06-gqa" / "quality.ipynb")[0])
    # "Does the recording agree?" (with the paper's ranking of mean-pooling): answered from the recording
    assert "The paper ranks mean-pooling above one kept head after uptraining; here it is above at 3 of 3" in quality


def test_notebook_04_prints_what_its_text_says():
    """Check notebook 04's two parts: 04a counts a cached step growing by one row of attention per cached token, 04b
    names Llama-2-7B's KV and query heads apart from head_dim, prints the sequences that fit beside the weights and under
    an engine's share, the prediction's tiny-model allocation within its budget and one more over it, and what limits a
    cached step (optional part)."""
    nb, _ = execute(ROOT / "solutions" / "04-kv-cache" / "kv_cache.ipynb")
    text = text_output(nb)
    steps = [float(f) for f in re.findall(r"after +\d+ tokens: a decode step +([\d.]+) MFLOP", text)]
    assert len(steps) == 2 and steps[0] < steps[1] < 2 * steps[0], f"a cached step should grow a little: {steps}"
    assert "a decode step's FLOPs per cached token, counted: 2,048, equal to" in text
    nb, _ = execute(ROOT / "solutions" / "04-kv-cache" / "time_and_memory.ipynb")
    text = text_output(nb)
    assert "KV heads of 128" not in text and "32 KV heads for 32 query heads, head_dim 128" in text
    assert re.search(
        r"Llama-2-7B \(32 KV heads .* at 4,096 tokens: 30 sequences in all 80 GB, at most \d+ in 90% of it less", text
    )
    within = re.findall(r"tiny model, (\d+) caches of 512 tokens: torch holds [\d.]+ MiB, (within|over) a budget", text)
    assert [w for _, w in within] == ["within", "over"] and int(within[1][0]) == int(within[0][0]) + 1, within
    assert "a cached step:" in text and "the fixed cost's share of a cached step" in text, (
        "the step's limits are not printed"
    )


def test_notebook_09a_prints_what_holds_by_construction():
    """Check that notebook 09a's causal tiled loop computes the 17/32 of the scores its text gives and holds less than
    the textbook way at every length, which holds more than one score matrix ("several such matrices at once")."""
    nb, _ = execute(ROOT / "solutions" / "09-fused" / "fused.ipynb")
    text = text_output(nb)
    share = re.search(
        r"FLOPs counted by torch: tiled \d+ M, naive \d+ M: ([\d.]+)% \(16 tiles a row: 17/32 = 53\.1%\)", text
    )
    assert share and share.group(1) == "53.1", (
        "the causal tiled loop should compute 17/32 of the scores at 1,024 tokens"
    )
    rows = re.findall(r"peak naive +([\d.]+) MiB \(([\d.]+) score matrices\), tiled +([\d.]+) MiB", text)
    assert len(rows) == 3 and all(float(t) < float(n) and float(m) > 1 for n, m, t in rows), rows


def test_notebook_09b_prints_what_holds_by_construction():
    """Check that notebook 09b's splits are within 1.1 of the fewest key-steps on every GPU it names, folded int8
    answers as 8.2 does without a cache-sized tensor and reads fewer bytes, and its bandwidth line is notebook 05's
    roof, in the course's one sentence."""
    nb, _ = execute(ROOT / "solutions" / "09-fused" / "long_cache.ipynb")
    text = text_output(nb)
    splits = re.findall(r"SMs: your \d+ splits take [\d,]+ key-steps \(([\d.]+)x the fewest\)", text)
    assert len(splits) == 3 and all(float(x) <= 1.1 for x in splits), splits
    assert float(re.search(r"largest difference from 8\.2: (\S+)", text).group(1)) < 1e-5
    made = dict(
        re.findall(
            r"^(8\.2 int8_attention|9\.4 int8_folded_attention)\s+largest tensor made:\s+([\d.]+) MiB", text, re.M
        )
    )
    assert float(made["9.4 int8_folded_attention"]) < float(made["8.2 int8_attention"]) / 4, made
    for kv_len in (4096, 16384):
        reads = dict(re.findall(rf"^\s*{kv_len} tokens\s+(.+?)\s{{2,}}[\d.]+ ms\s+reads\s+([\d.]+) MiB", text, re.M))
        assert float(reads["int8, folded (9.4)"]) < float(reads["float32 SDPA"]) / 3, reads  # a quarter, plus scales
    assert re.search(r"this machine's bandwidth: [\d.]+ GB/s \(", text) and "bandwidth ceiling" not in text


def test_notebook_10a_prints_what_holds_by_construction():
    """Check that notebook 10a's greedy speculative decoding is identical in fewer passes than tokens, and that its
    forward timings are medians of paired per-round ratios."""
    nb, _ = execute(ROOT / "solutions" / "10-speculative" / "speculative.ipynb")
    text = text_output(nb)
    passes = re.search(r"identical: True \| model passes: (\d+) for 40 tokens", text)
    assert passes and int(passes.group(1)) < 40, "greedy speculative decoding should be identical in fewer passes"
    assert "median of each round's ratio" in text


def test_notebook_10b_prints_what_holds_by_construction():
    """Check that notebook 10b's prediction of the tokens a pass makes (10.5) is close to the count, that sampled
    acceptance matches sum(min(p, q)), that a round's parts are printed against what the formula charges, and that
    prompt lookup's counts bound its speedup below 2x on the repeated records and above 2x on the model's own
    document, which its continuation copies more of."""
    nb, _ = execute(ROOT / "solutions" / "10-speculative" / "speedup.ipynb")
    text = text_output(nb)
    passes = re.findall(r"a verify pass made ([\d.]+) tokens \(counted\), your prediction ([\d.]+)", text)
    assert len(passes) == 2 and all(abs(float(a) - float(b)) < 0.5 for a, b in passes), passes
    rate, expected = map(float, re.search(r"drafts kept ([\d.]+); .* = ([\d.]+)", text).groups())
    assert abs(rate - expected) < 0.03, "5,000 rounds: the acceptance rate should match sum(min(p, q))"
    assert re.search(r"a round [\d.]+, where the formula charges [\d.]+: the verify pass [\d.]+ \(charged 1\)", text)
    lookup = {
        name: (int(share), float(drafts), float(cap))
        for name, share, drafts, cap in re.findall(
            r"(repeated records|its own document): (\d+)% of the continuation copied; alpha [\d.]+, ([\d.]+) drafts "
            r"a pass; at most ([\d.]+)x by the counts",
            text,
        )
    }
    assert set(lookup) == {"repeated records", "its own document"}, "prompt lookup's two prompts are not printed"
    assert all(drafts <= 8 for _, drafts, _ in lookup.values()), "more drafts a pass than gamma allows"
    # "lookup gains only where the output copies its context": the counts' cap says so, whatever the clock
    assert lookup["its own document"][0] > lookup["repeated records"][0], lookup
    assert lookup["repeated records"][2] < 2 < lookup["its own document"][2], lookup


def test_notebook_10c_ends_the_course_with_the_claims_of_this_machine():
    """Check that the closing page prints the claims record's summary, a line per part (in this run, from a folder of
    its own, nothing recorded: each part with claims says so and names the command), and that its Next is the end."""
    nb, _ = execute(ROOT / "solutions" / "10-speculative" / "wrap_up.ipynb")
    text = text_output(nb)
    assert "not recorded here yet: run it, or `kvlib course claims 09a`" in text
    assert "This is the end of the course" in "".join(c.source for c in nb.cells if c.cell_type == "markdown")
