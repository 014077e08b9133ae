"""kvlib/app/wrap_up.py (notebook 10c, the closing page): one line per notebook part from the claims record, whatever
is recorded, and every recorded verdict's sentence as a table. No notebook runs here: made-up records."""

from conftest import ROOT

from kvlib.app import release, wrap_up
from kvlib.course.claims_table import CLAIMS


def _record(claim_id: str, outcome: str, text: str) -> dict:
    expect = next(c.expect for c in CLAIMS if c.id == claim_id)
    return {"id": claim_id, "outcome": outcome, "expect": expect, "text": text}


def test_summary_has_one_line_per_part_saying_how_its_claims_came_out():
    """Check that the summary names every notebook part once, in course order with its title: a part with verdicts
    counts them as expected, not, or not decided (and how many are recorded), one with none recorded names the
    command that records it, one that declares none says so; and that the line count does not depend on the record."""
    parts = sorted(release.part(p) for p in ROOT.glob("notebooks/[0-9][0-9]-*/*.ipynb"))
    declared = [c for c in CLAIMS if c.notebook == "09a"]
    records = [
        _record(declared[0].id, declared[0].expect, "held"),
        _record(declared[1].id, "within spread", "spread"),
    ]
    lines = wrap_up.summary(records).splitlines()
    assert [line.split()[0] for line in lines] == parts
    by_part = {line.split()[0]: line for line in lines}
    assert by_part["09a"].endswith(f"1 as expected, 1 not decided (2 of its {len(declared)} claims recorded)")
    assert "Fused attention: the scores in tiles" in by_part["09a"]
    assert by_part["10b"].endswith("not recorded here yet: run it, or `kvlib course claims 10b`")
    assert by_part["10c"].endswith("no claims declared")
    assert len(wrap_up.summary([])) and len(wrap_up.summary([]).splitlines()) == len(lines)


def test_table_gives_every_recorded_sentence_with_its_status():
    """Check that the table has a row per recorded verdict, marked NOT as expected where the run decided against the
    course's expectation, and says so when nothing is recorded."""
    claim = next(c for c in CLAIMS if c.expect == "faster")
    against = "slower" if claim.expect == "faster" else "faster"
    table = wrap_up.table([_record(claim.id, against, "it ran | slower")])
    assert (
        table.splitlines()[2]
        == f"| {claim.notebook} | {claim.id.split('.', 1)[1]} | NOT as expected | it ran / slower |"
    )
    assert wrap_up.table([]) == "*No claim is recorded on this machine yet.*"


def test_the_closing_page_speaks_the_learners_language(monkeypatch):
    """Check that with KVLIB_LANG=zh-CN the summary titles each part as its Chinese notebook does and counts in
    Chinese, and the table shows each recorded (English) sentence as the notebook printed it, in Chinese."""
    from kvlib.course import i18n

    monkeypatch.setenv(i18n.ENV, "zh-CN")
    claim = next(c for c in CLAIMS if c.id == "06a.grouped-vs-mha")
    text = "GQA-2 read in place ran at 1.40x MHA's speed: faster in every one of 3 paired rounds (1.30x-1.50x)"
    lines = {line.split()[0]: line for line in wrap_up.summary([_record(claim.id, "faster", text)]).splitlines()}
    declared = sum(c.notebook == "06a" for c in CLAIMS)
    assert "手算注意力" in lines["01"] and lines["06a"].endswith(f"1 条符合预期（它的 {declared} 条结论中记录了 1 条）")
    assert wrap_up.table([_record(claim.id, "faster", text)]).splitlines()[2] == (
        "| 06a | grouped-vs-mha | 符合预期 | 原地读取的 GQA-2 的速度是 MHA 的 1.40x：3 轮配对测量中每一轮都更快（1.30x-1.50x） |"
    )
