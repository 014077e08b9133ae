"""kvlib/course/claims.py: a verdict on a measurement is worded by its values, with the spread they measured, and
recorded for `kvlib course claims`; kvlib/course/claims_table.py declares each claim once."""

import json
import re

import pytest
from conftest import ROOT

from kvlib.app import release
from kvlib.app.cli import main
from kvlib.course import claims
from kvlib.course.claims_table import CLAIMS


@pytest.fixture(autouse=True)
def record_here(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLIB_CLAIMS_DIR", str(tmp_path / "claims"))
    return tmp_path / "claims"


CLAIM = next(c.id for c in CLAIMS if c.expect == "faster")  # a claim that expects "faster", as the tests below do


@pytest.mark.parametrize(
    "ratios, outcome, word",
    [
        ([1.3, 1.2, 1.5], "faster", "faster in every one of 3 paired rounds (1.20x-1.50x)"),
        ([0.8, 0.9, 0.7, 0.95], "slower", "slower in every one of 4 paired rounds"),
        ([1.1, 0.97, 1.4], "within spread", "within this machine's run-to-run spread (0.97x-1.40x over 3 paired"),
        ([1.9, 2.0], "undecided", "2 rounds only, too few to measure a spread, so nothing is decided"),
    ],
)
def test_compare_says_faster_only_when_every_round_does(ratios, outcome, word, capsys):
    """Check that compare's word comes from the paired rounds: faster or slower only when every round agrees, the
    rounds' min-max printed as the spread, nothing decided from too few rounds; the sentence is printed."""
    v = claims.compare(CLAIM, ratios, "A", "B")
    assert v.outcome == outcome and word in v.text and capsys.readouterr().out.strip() == v.text
    assert v.holds is ({"faster": True, "slower": False}.get(outcome) if outcome in ("faster", "slower") else None)


def test_against_and_exact_decide_only_what_their_values_show():
    """Check against (every repeat on one side, else undecided) and exact (a count: above, equal or below)."""
    assert claims.against(CLAIM, [0.8, 0.9, 0.85], 0.5, "m/p", "half", show=False).outcome == "above"
    assert claims.against(CLAIM, [0.4, 0.45, 0.3], 0.5, "m/p", "half", show=False).outcome == "below"
    straddle = claims.against(CLAIM, [0.4, 0.6, 0.55], 0.5, "m/p", "half", show=False)
    assert straddle.outcome == "undecided" and "does not decide" in straddle.text and straddle.holds is None
    noise = claims.against(CLAIM, [3.1, -2.0, 3.5], 4.0, "growth / growth", "four", show=False, positive=True)
    assert noise.outcome == "undecided" and "not positive" in noise.text  # all below 4, but a round is noise
    assert claims.check_record(vars(noise)) == []
    assert claims.check_record(vars(noise) | {"outcome": "below"})  # a record calling that round "below" is caught
    assert claims.exact(CLAIM, 2, 2, "x", "two", show=False).text == "x: 2, equal to two (2)"
    assert claims.exact(CLAIM, 1.21, 2, "p", "naive's", show=False, fmt="{:.2f}").outcome == "below"


def test_bad_input_is_refused_with_the_claim_named():
    """Check that an undeclared claim id, a non-positive ratio and no values are refused, naming the problem."""
    with pytest.raises(ValueError, match="no claim 'nope.x' in kvlib/course/claims_table.py"):
        claims.compare("nope.x", [1.0, 1.1, 1.2], "A", "B")
    with pytest.raises(ValueError, match="ratios must be positive"):
        claims.compare(CLAIM, [1.0, 0.0, 1.2], "A", "B")
    with pytest.raises(ValueError, match="no values"):
        claims.against(CLAIM, [], 1.0, "A", "B")


def test_check_record_catches_a_sentence_its_values_contradict():
    """Check that a recorded verdict re-derived from its values by separate rules catches a wrong outcome and a
    sentence whose verdict word disagrees with them (a rendering bug), and passes a true one."""
    good = claims.compare(CLAIM, [1.3, 1.2, 1.5], "A", "B", show=False)
    record = vars(good).copy()
    assert claims.check_record(record) == []
    assert claims.check_record(record | {"values": {"ratios": [1.3, 0.9, 1.5]}})  # the rounds straddle 1 now
    lying = record | {"text": "A ran at 1.30x B's speed: within the spread, so no difference is shown here"}
    assert any("lacks 'faster in every'" in p for p in claims.check_record(lying))


def test_verdicts_are_recorded_per_notebook_and_reported(record_here):
    """Check that each verdict lands in <KVLIB_CLAIMS_DIR>/<notebook>.json (the last run of a claim wins), and that
    load and report read them back with holds / not decided counted; `kvlib course claims --last` prints them."""
    claims.compare(CLAIM, [0.5, 0.6, 0.7], "A", "B", show=False)
    claims.compare(CLAIM, [1.1, 0.9, 1.0], "A", "B", show=False)
    kept = json.loads((record_here / f"{CLAIM.split('.')[0]}.json").read_text())
    assert list(kept) == [CLAIM] and kept[CLAIM]["outcome"] == "within spread"
    text = claims.report(claims.load())
    assert "not decided" in text and "1 claims: 0 hold, 0 do not hold, 1 not decided" in text
    assert claims.report([]).startswith("no claims recorded")


def test_kvlib_course_claims_last_reports_the_record(capsys):
    """Check that `kvlib course claims --last --json` runs nothing and prints the recorded verdicts."""
    claims.compare(CLAIM, [1.3, 1.2, 1.5], "A", "B", show=False)
    capsys.readouterr()
    assert main(["course", "claims", "--last", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [CLAIM]
    assert main(["course", "claims", "99", "--last"]) == 2  # no such notebook: a message, exit 2


def test_every_claim_is_declared_well_and_evaluated_by_its_notebook():
    """Check each declared claim: an id of a notebook part that exists, an expected outcome a verdict can give, a
    question, and a call of it in that notebook's solution (the run itself is checked in tests/test_notebooks.py)."""
    parts = {release.part(p): p for p in ROOT.glob("solutions/[0-9]*/*.ipynb")}
    for c in CLAIMS:
        assert re.fullmatch(r"\d\d[a-h]?\.[a-z0-9-]+", c.id), c.id
        assert c.notebook in parts, f"{c.id}: no notebook part {c.notebook} (parts: {sorted(parts)})"
        assert c.expect in {"faster", "slower", "above", "below", "equal"} and c.question.endswith("?"), c
        code = "".join(
            "".join(cell["source"])
            for cell in json.loads(parts[c.notebook].read_text())["cells"]
            if cell["cell_type"] == "code"
        )
        assert f'"{c.id}"' in code, f"{c.id} is declared but its notebook never evaluates it"


def test_a_verdict_prints_in_the_learners_language_and_records_english(record_here, monkeypatch, capsys):
    """Check that with KVLIB_LANG=zh-CN a verdict prints in Chinese, the words the notebook filled in translated
    where the catalogue has them, while its text and its record stay English (check_record reads the record's
    words; `kvlib course claims` reports them)."""
    from kvlib.course import i18n

    monkeypatch.setenv(i18n.ENV, "zh-CN")
    v = claims.compare("06a.grouped-vs-mha", [1.4, 1.5, 1.3], "GQA-2 read in place", "MHA")
    shown = capsys.readouterr().out.strip()
    assert shown == str(v) == "原地读取的 GQA-2 的速度是 MHA 的 1.40x：3 轮配对测量中每一轮都更快（1.30x-1.50x）"
    assert (
        v.text == "GQA-2 read in place ran at 1.40x MHA's speed: faster in every one of 3 paired rounds (1.30x-1.50x)"
    )
    e = claims.exact("08c.window-holding-the-question", 0.9, 0.95, "a window of 32", "the full cache's", fmt="{:.1%}")
    assert e.shown() == "大小为 32 的窗口：90.0%，低于完整缓存的（95.0%）"
    recorded = {r["id"]: r for r in claims.load(record_here)}
    assert recorded["06a.grouped-vs-mha"]["text"] == v.text and not claims.check_record(recorded[e.id])
