"""Claims as code: a sentence that judges a measurement is printed from it, and worded by it.

A notebook's markdown asks the question and explains the mechanism; the verdict on what this machine
measured comes from here, so no learner's run can contradict the text beside it. Each claim is declared
once, in CLAIMS (kvlib/course/claims_table.py): its id, its notebook, the question, and what the course's
argument expects. A notebook evaluates it on its own run with one verdict, which prints the sentence and
records it:

  compare(id, ratios, subject, baseline)   paired per-round ratios of two ways (> 1: subject faster). "faster"
                                           or "slower" only when every round agrees; otherwise the sentence
                                           says the ratio lies within this machine's run-to-run spread
  against(id, values, threshold, ...)      a measured value over its repeats against a threshold: above or
                                           below when every repeat is; straddling it, undecided on this run
  exact(id, value, threshold, ...)         a counted quantity (FLOPs, bytes), no noise: above, equal or below

The spread is measured (the rounds' or repeats' min-max), never assumed. With fewer than MIN_ROUNDS rounds
nothing is decided. Each verdict is recorded (KVLIB_CLAIMS_DIR, default ~/.cache/kvlib/claims/, one JSON
file per notebook, the last run of each claim) for `kvlib course claims`: holds, does not hold, or not
decided on this machine, with the values and the threshold. `check_record` re-derives a recorded
sentence's verdict from its values by separate rules, so a wording bug fails the tests.
The recorded sentence is English (check_record reads its words); the notebook prints it in the learner's language
(KVLIB_LANG, Verdict.shown): each sentence here is worded as `text = f"{head}: {tail}"`, so that kvlib.app.translate
finds every sentence the module can say as a template of the message catalogue.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kvlib.course import i18n
from kvlib.course.claims_table import BY_ID, CLAIMS, Claim

MIN_ROUNDS = 3  # fewer paired rounds or repeats measure no spread worth the name: nothing is decided

# outcome -> whether it decides anything
DECIDED = {
    "faster": True,
    "slower": True,
    "above": True,
    "below": True,
    "equal": True,
    "within spread": False,
    "undecided": False,
}


@dataclass
class Verdict:
    """One claim evaluated on one run: the sentence, the outcome, whether the expectation held, and what it read."""

    id: str
    kind: str  # compare, against or exact
    outcome: str  # faster, slower, within spread, above, below, equal, undecided
    text: str
    values: dict = field(default_factory=dict)
    threshold: float | None = None
    expect: str = ""
    at: str = ""

    @property
    def holds(self) -> bool | None:
        """True or False when the run decided; None when it could not (within the spread, or too few rounds)."""
        return (self.outcome == self.expect) if DECIDED.get(self.outcome) else None

    def shown(self) -> str:
        """The sentence in the learner's language (KVLIB_LANG): text, as recorded, through the message catalogue,
        whose templates are its sentences as this module words them (kvlib.app.translate finds each), the words a
        notebook fills in translated where the catalogue has them too."""
        return i18n.translate(self.text)

    def __str__(self) -> str:
        return self.shown()

    def _repr_pretty_(self, p, cycle):  # a verdict left as a cell's last line reads as its sentence
        p.text(self.shown())


def _claim(claim_id: str) -> Claim:
    try:
        return BY_ID[claim_id]
    except KeyError:
        raise ValueError(f"no claim {claim_id!r} in kvlib/course/claims_table.py: declare it there first") from None


def _spread(values, fmt: str) -> str:
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def compare(
    claim_id: str, ratios, subject: str, baseline: str, *, show: bool = True, what: str = "speed", fmt: str = "{:.2f}x"
) -> Verdict:
    """Paired ratios of two ways, one per interleaved round (subject's speed / baseline's; > 1: subject faster).

    faster: every round > 1; slower: every round < 1; within spread: the rounds straddle 1 (the median is printed,
    with the rounds' min-max as this machine's run-to-run spread); undecided: fewer than MIN_ROUNDS rounds.
    Example: compare("06.grouped-vs-mha", [1.4, 1.5, 1.3], "GQA-2 in place", "MHA").outcome -> "faster"
    """
    ratios = [float(r) for r in ratios]
    if not ratios or any(not r > 0 for r in ratios):
        raise ValueError(f"{claim_id}: ratios must be positive numbers, one per round, got {ratios}")
    claim, m, n = _claim(claim_id), statistics.median(ratios), len(ratios)
    head = f"{subject} ran at {fmt.format(m)} {baseline}'s {what}"
    if n < MIN_ROUNDS:
        outcome, tail = (
            "undecided",
            f"{n} round only, too few to measure a spread, so nothing is decided"
            if n == 1
            else f"{n} rounds only, too few to measure a spread, so nothing is decided",
        )
    elif min(ratios) > 1:
        outcome, tail = "faster", f"faster in every one of {n} paired rounds ({_spread(ratios, fmt)})"
    elif max(ratios) < 1:
        outcome, tail = "slower", f"slower in every one of {n} paired rounds ({_spread(ratios, fmt)})"
    else:
        outcome = "within spread"
        tail = (
            f"within this machine's run-to-run spread ({_spread(ratios, fmt)} over {n} paired rounds), "
            "so no difference is shown here"
        )
    text = f"{head}: {tail}"
    return _record(Verdict(claim.id, "compare", outcome, text, {"ratios": ratios}, 1.0, claim.expect), show)


def against(
    claim_id: str,
    values,
    threshold: float,
    subject: str,
    threshold_label: str,
    *,
    show: bool = True,
    fmt: str = "{:.2f}",
    positive: bool = False,
) -> Verdict:
    """A measured value over its repeats against a threshold: above (every repeat above), below (every repeat below),
    undecided (they straddle it, or fewer than MIN_ROUNDS repeats). The median is printed with the repeats' min-max.
    positive: the values are ratios whose meaning needs a positive denominator (a growth over another growth): a
    repeat at or below 0 means noise outran what was divided by, so the run decides nothing.
    Example: against("05.decode-bound", [0.8, 0.9, 0.85], 0.5, "measured / predicted", "half the prediction")
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"{claim_id}: no values to judge")
    claim, m, n = _claim(claim_id), statistics.median(values), len(values)
    head = f"{subject}: {fmt.format(m)} ({_spread(values, fmt)} over {n} repeats)"
    if n < MIN_ROUNDS:
        outcome, tail = "undecided", "too few repeats to measure a spread, so nothing is decided"
    elif positive and min(values) <= 0:
        outcome = "undecided"
        tail = "a repeat is not positive (the noise outran the growth it is a ratio of), so this run does not decide it"
    elif min(values) > threshold:
        outcome, tail = "above", f"above {threshold_label} ({fmt.format(threshold)}) in every repeat"
    elif max(values) < threshold:
        outcome, tail = "below", f"below {threshold_label} ({fmt.format(threshold)}) in every repeat"
    else:
        outcome = "undecided"
        tail = f"the repeats straddle {threshold_label} ({fmt.format(threshold)}), so this run does not decide it"
    text = f"{head}: {tail}"
    return _record(
        Verdict(
            claim.id, "against", outcome, text, {"values": values, "positive": positive}, float(threshold), claim.expect
        ),
        show,
    )


def exact(
    claim_id: str, value: float, threshold: float, subject: str, threshold_label: str, *, show: bool = True, fmt="{:,}"
) -> Verdict:
    """A counted quantity (FLOPs, bytes, tokens: no noise) against a threshold: above, equal or below.
    Example: exact("03.kept-grows-slower", 1.21, 2.0, "the kept generation's growth exponent", "naive's 2")
    """
    claim = _claim(claim_id)
    outcome = "above" if value > threshold else "below" if value < threshold else "equal"
    head, t = f"{subject}: {fmt.format(value)}", fmt.format(threshold)
    tail = {
        "above": f"above {threshold_label} ({t})",
        "below": f"below {threshold_label} ({t})",
        "equal": f"equal to {threshold_label} ({t})",
    }[outcome]
    text = f"{head}, {tail}"
    return _record(
        Verdict(claim.id, "exact", outcome, text, {"value": float(value)}, float(threshold), claim.expect), show
    )


# ---------------------------------------------------------------------------------------------
# The record: what `kvlib course claims` reports


def record_dir() -> Path:
    """KVLIB_CLAIMS_DIR, or $XDG_CACHE_HOME/kvlib/claims (~/.cache/kvlib/claims by default)."""
    if os.environ.get("KVLIB_CLAIMS_DIR"):
        return Path(os.environ["KVLIB_CLAIMS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlib" / "claims"


def _record(verdict: Verdict, show: bool) -> Verdict:
    """Check the verdict's sentence against its values, print it in the learner's language (shown) and record it."""
    verdict.at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    problems = check_record(asdict(verdict))
    if problems:  # a wording bug: never print a sentence its own values contradict
        raise AssertionError(f"claim {verdict.id}: " + "; ".join(problems))
    if show:
        print(verdict.shown())
    try:
        folder = record_dir()
        path = folder / f"{_claim(verdict.id).notebook}.json"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept = {}
        kept[verdict.id] = asdict(verdict)
        part = path.with_name(f"{path.name}.{os.getpid()}")  # written whole, then renamed: a reader never sees half
        part.write_text(json.dumps(kept, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(part, path)
    except (OSError, RuntimeError, KeyError):  # no home folder or a read-only one (a grading jail): not recorded
        pass
    return verdict


def load(folder: Path | None = None, notebooks: list[str] | None = None) -> list[dict]:
    """Every recorded verdict (the last run of each claim), in the table's order; only those notebooks if given."""
    folder = folder or record_dir()
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            found.update(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            continue
    order = [c.id for c in CLAIMS if notebooks is None or c.notebook in notebooks]
    return [found[i] for i in order if i in found]


def check_record(record: dict) -> list[str]:
    """What is wrong with a recorded verdict: its outcome re-derived from its values by rules of their own, and the
    sentence's verdict word and printed median against them. Empty when the sentence says what its values show."""
    kind, outcome, text, v, t = record["kind"], record["outcome"], record["text"], record["values"], record["threshold"]
    problems = []
    if kind == "compare":
        r = v["ratios"]
        n, lo, hi = len(r), min(r), max(r)
        want = "undecided" if n < MIN_ROUNDS else "faster" if lo > 1 else "slower" if hi < 1 else "within spread"
        words = {
            "faster": "faster in every",
            "slower": "slower in every",
            "within spread": "no difference is shown",
            "undecided": "nothing is decided",
        }
    elif kind == "against":
        r = v["values"]
        n, lo, hi = len(r), min(r), max(r)
        noise = v.get("positive") and lo <= 0
        want = "undecided" if n < MIN_ROUNDS or noise else "above" if lo > t else "below" if hi < t else "undecided"
        words = {"above": "above", "below": "below", "undecided": "decide"}
    elif kind == "exact":
        x = v["value"]
        want = "above" if x > t else "below" if x < t else "equal"
        words = {"above": "above", "below": "below", "equal": "equal to"}
    else:
        return [f"unknown kind {kind!r}"]
    if outcome != want:
        problems.append(f"the values make it {want!r}, the record says {outcome!r}")
    if outcome in words and words[outcome] not in text:
        problems.append(f"the sentence lacks {words[outcome]!r} for a {outcome!r} verdict: {text!r}")
    for other, word in words.items():
        if other != outcome and word in text and word not in words.get(outcome, ""):
            problems.append(f"the sentence says {word!r} for a {outcome!r} verdict: {text!r}")
    return problems


def report(records: list[dict]) -> str:
    """The claims report: per claim, holds / does not hold / not decided here, the sentence, and the values."""
    if not records:
        return "no claims recorded: run the notebooks first (kvlib course claims runs them)"
    lines, tally = [], {"holds": 0, "does not hold": 0, "not decided": 0}
    for r in records:
        claim = BY_ID.get(r["id"])
        holds = (r["outcome"] == r["expect"]) if DECIDED.get(r["outcome"]) else None
        status = "holds" if holds else "not decided" if holds is None else "does not hold"
        tally[status] += 1
        lines.append(f"{r['id']:<28} {status:<13} expected {r['expect']}, got {r['outcome']} ({r['at']})")
        if claim is not None:
            lines.append(f"{'':<28} Q: {claim.question}")
        lines.append(f"{'':<28} {r['text']}")
    lines.append(
        f"\n{len(records)} claims: {tally['holds']} hold, {tally['does not hold']} do not hold, "
        f"{tally['not decided']} not decided on this machine"
    )
    return "\n".join(lines)
