"""The kit's standard of evidence: a verdict is read off measured evidence, says "holds" or "wrong" only when the
effect clears its noise margin, and a row without evidence, or with a verdict its evidence does not allow, is
refused. Also: no chapter's ending types a verdict its results cannot change."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from workbench.lab.kit.closing import Takeaway, Verdict, unresolved_note
from workbench.lab.kit.evidence import TIMING_FLOOR, Evidence

LAB = Path(__file__).resolve().parents[2] / "workbench" / "lab"


def test_exact_evidence_resolves_on_either_side_and_not_at_the_null():
    assert Verdict.judge(Evidence.exact("bytes saved", 4.0, 1.0)) is Verdict.HOLDS
    assert Verdict.judge(Evidence.exact("bytes saved", 0.5, 1.0)) is Verdict.WRONG
    assert Verdict.judge(Evidence.exact("bytes saved", 1.0, 1.0)) is Verdict.WRONG  # no noise: equal is "no"
    assert Verdict.judge(Evidence.exact("slope", 1.8, 1.5, expect="below")) is Verdict.WRONG


def test_one_pass_of_sixteen_against_seventeen_is_not_measurable():
    """ch07's tree verdict: 17 target passes against 16, one run each, is inside a timing-free count's own
    granularity only if it has repeats; as single runs with the floor it is noise."""
    one_run = Evidence.repeats("chain passes / tree passes", [17], [16])
    assert one_run.effect == pytest.approx(17 / 16) and one_run.margin >= TIMING_FLOOR * one_run.effect - 1e-12
    assert Verdict.judge(one_run) is Verdict.NOT_MEASURABLE
    spread = Evidence.repeats("speedup", [1.9, 2.1, 2.0], null=1.0, unit="x")
    assert spread.resolved and spread.holds and spread.low <= 1.9 and spread.high >= 2.1


def test_a_ratio_of_096_is_not_a_loss():
    r = Evidence.repeats("cost of 5 positions over 1", [28.3], [29.6], null=1.0, expect="above")
    assert Verdict.judge(r) is Verdict.NOT_MEASURABLE
    assert "within its noise" in unresolved_note(r) and "n = 1 vs 1 runs" in unresolved_note(r)


def test_bootstrap_resolves_a_real_difference_and_not_a_reversal_in_the_noise():
    fast = [100.0 + 5 * math.sin(i) for i in range(40)]
    slow = [200.0 + 5 * math.cos(i) for i in range(40)]
    clear = Evidence.bootstrap("cache_aware / round_robin TTFT p50", fast, slow, expect="below")
    assert clear.resolved and clear.holds and clear.low < clear.effect < clear.high
    noisy = Evidence.bootstrap("p50 ratio", [100, 400, 150, 900, 120, 80, 300, 200],
                               [110, 350, 170, 800, 130, 90, 280, 210], expect="below")
    assert Verdict.judge(noisy) is Verdict.NOT_MEASURABLE


def test_two_items_per_length_cannot_resolve_recall():
    two = Evidence.proportions("recall int4 minus fp32", 2, 2, 2, 2, expect="below")
    assert Verdict.judge(two) is Verdict.NOT_MEASURABLE
    one_of_two = Evidence.proportions("recall int4 minus fp32", 1, 2, 2, 2, expect="below")
    assert Verdict.judge(one_of_two) is Verdict.NOT_MEASURABLE
    many = Evidence.proportions("recall int4 minus fp32", 20, 100, 95, 100, expect="below")
    assert Verdict.judge(many) is Verdict.HOLDS


def test_one_saved_target_pass_is_not_a_higher_yield():
    """ch07's trees: 32 tokens in 16 passes against 17 is 1.06x, far inside the counts' noise."""
    trees = Evidence.rate_ratio("tokens per pass, tree / chain", 32, 16, 32, 17)
    assert trees.effect == pytest.approx(17 / 16) and Verdict.judge(trees) is Verdict.NOT_MEASURABLE
    assert Verdict.judge(Evidence.rate_ratio("x", 600, 200, 400, 200)) is Verdict.HOLDS


def test_several_parts_one_against_is_wrong_one_in_the_noise_is_not_measurable():
    yes, no = Evidence.exact("a", 2, 1), Evidence.exact("b", 0.5, 1)
    noise = Evidence.repeats("c", [1.02], [1.0])
    assert Verdict.judge([yes, no]) is Verdict.WRONG
    assert Verdict.judge([yes, noise]) is Verdict.NOT_MEASURABLE
    assert Verdict.judge([no, noise]) is Verdict.WRONG
    assert Verdict.judge(Evidence.absent("traces")) is Verdict.NOT_MEASURABLE


def test_a_verdict_without_evidence_or_against_it_is_refused():
    with pytest.raises(ValueError, match="needs its evidence"):
        Takeaway("claim", "measured", Verdict.HOLDS)
    with pytest.raises(ValueError, match="does not follow from its evidence"):
        Takeaway("claim", "measured", Verdict.HOLDS, evidence=(Evidence.repeats("t", [1.01], [1.0]),))
    with pytest.raises(ValueError, match="does not follow"):
        Takeaway("claim", "measured", Verdict.WRONG, "no", evidence=(Evidence.exact("x", 2, 1),))
    with pytest.raises(ValueError, match="needs Evidence"):
        Verdict.judge(True)  # type: ignore[arg-type]
    row = Takeaway.judged("claim", "measured", Evidence.repeats("t", [1.01], [1.0]),
                          unmeasurable_note="three runs per point would")
    assert row.verdict is Verdict.NOT_MEASURABLE and "margin ±" in row.note and "three runs" in row.note
    assert "n = 1 vs 1 runs, margin ±0.10x" in row.evidence_text and "effect 1.01x" in row.evidence_text


def test_evidence_refuses_nonsense():
    with pytest.raises(ValueError, match="finite"):
        Evidence.repeats("t", [])
    with pytest.raises(ValueError, match="hits <= n"):
        Evidence.proportions("r", 3, 2, 1, 2)
    with pytest.raises(ValueError, match="about"):
        Evidence.exact(" ", 1, 0)


TYPED = {"HOLDS", "CAVEAT", "WRONG"}


def _judge_calls(path: Path) -> list[tuple[int, str]]:
    """Verdicts the results cannot change: Verdict.judge on a literal, Evidence.exact with a literal effect, and
    a Takeaway built with a typed HOLDS, CAVEAT or WRONG instead of a judged one. (A constant caveat is allowed:
    the verdict can still turn to WRONG or "not measurable here"; a typed "not measurable here" is allowed.)"""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "judge" and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, "judge on a literal"))
        if name == "exact" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            found.append((node.lineno, "exact evidence with a literal effect"))
        if name == "Takeaway" and any(isinstance(a, ast.Attribute) and a.attr in TYPED for a in node.args):
            found.append((node.lineno, "a typed verdict"))
    return found


ENDINGS = sorted(LAB.glob("ch*/ending*.py"))


@pytest.mark.parametrize("path", ENDINGS, ids=lambda p: p.parent.name)
def test_no_ending_types_a_verdict_its_results_cannot_change(path):
    assert _judge_calls(path) == []


def test_the_literal_check_catches_a_hard_coded_verdict(tmp_path):
    bad = tmp_path / "ending.py"
    bad.write_text("Verdict.judge(True, caveat=x)\nTakeaway('c', 'm', Verdict.HOLDS)\nEvidence.exact('a', 2, 1)\n"
                   "Takeaway('c', 'm', Verdict.NOT_MEASURABLE, 'why')\n")
    assert [why for _, why in _judge_calls(bad)] == ["judge on a literal", "a typed verdict",
                                                     "exact evidence with a literal effect"]
