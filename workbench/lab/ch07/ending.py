"""Chapter 7's ending: the 'Try this' exercises (answers computed by `workbench.spec.theory`, or from a run the
notebook just measured) and the closing table that sets each of the book's five takeaways beside what the chapter
measured, with a verdict computed from the results by the conditions written next to each row."""

from __future__ import annotations

from workbench.lab.ch07.runs import AcceptanceRun, BatchRun, physical_r
from workbench.lab.ch07.trees import TreeComparison
from workbench.lab.kit.closing import ClosingTable, Takeaway
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
from workbench.spec.stats import expected_tokens_per_pass
from workbench.spec.theory import best_k, break_even_alpha
from workbench.spec_experiments.forward_cost import ForwardCurve
from workbench.spec_experiments.methods import PROPOSERS
from workbench.spec_experiments.sampling_check import SamplingCheck

LOOKUP, HEAD = "prompt lookup", "trained draft"
SEED_THRESHOLD = 0.70  # the book's "below ~70% acceptance it may not pay"


def exercises() -> dict[str, Exercise]:
    """The chapter's 'Try this' questions, each with its answer computed by the package."""
    return {
        "tokens_per_pass": Exercise(
            "Expected tokens per target pass at α = 0.8 with K = 5 drafts?",
            lambda: expected_tokens_per_pass(0.8, 5),
            why="(1 − 0.8⁶) ÷ (1 − 0.8): the accepted run of drafts plus the one token the target always adds",
            hint="sum α^i for i = 0 … K", rel_tol=0.01),
        "best_k": Exercise(
            "α = 0.6, each drafted token costs c = 0.1 of a target step, verification is free: which K (0-16) is "
            "fastest?",
            lambda: best_k(0.6, 0.1)[0],
            why="E(α, K) ÷ (1 + K·c) is 1.45, 1.63, 1.67, 1.65 for K = 1..4: the fourth draft adds less than it "
                "costs",
            hint="tabulate (1 − 0.6^(K+1)) ÷ 0.4 ÷ (1 + 0.1·K)", rel_tol=0.0),
        "break_even": Exercise(
            "K = 4, c = 0.05, verification free: below which α does speculation make decoding slower?",
            lambda: break_even_alpha(4, 0.05),
            why="the speedup is 1 where E(α, 4) = 1 + 4 × 0.05 = 1.2, i.e. α + α² + α³ + α⁴ = 0.2",
            hint="solve E(α, 4) = 1.2 (bisection works)", rel_tol=0.02),
    }


def measured_alpha_exercise(run: AcceptanceRun, proposer: str = HEAD) -> Exercise:
    """α from the counts an acceptance run measured (the answer follows that run)."""
    row = run.row(proposer)
    return Exercise(
        f"The acceptance panel's {proposer} drafted {int(row['drafted'])} tokens; {int(row['tested'])} were tested "
        f"(every earlier draft of their pass accepted) and {int(row['accepted'])} accepted. What α does the "
        "formula (1 − α^(K+1)) ÷ (1 − α) need?",
        lambda: float(row["accepted"] / row["tested"]),
        why="accepted ÷ tested: drafts after a rejection were never tested, so counting them (accepted ÷ drafted) "
            "understates the per-token acceptance", hint="which drafts had a chance to be accepted?", rel_tol=0.01)


def _amortize(curve: ForwardCurve, grounded: AcceptanceRun) -> Takeaway:
    lookup, k = grounded.row(LOOKUP), grounded.k
    tokens, r1 = float(lookup["tokens_per_pass"]), curve.ratio(k + 1)
    r = physical_r(r1)
    return Takeaway.judged(
        "several tokens per target pass amortize the weight reads",
        f"prompt lookup on grounded tasks: {tokens:.2f} tokens per pass; a forward over {k + 1} positions costs "
        f"r = {r1:.2f} forwards over 1 position at batch 1" + (" (below 1: timing noise, taken as 1)" if r1 < 1 else "")
        + f" (measured speedup {float(lookup['speedup']):.2f}x)",
        # Holds when a pass yields more tokens than its wider forward costs; caveat when verification is not free.
        Evidence.repeats(f"tokens per pass over r ({k + 1} positions)", [tokens / r], null=1.0,
                         n_label="run (prompt lookup, grounded)", unit="x"),
        caveat=r > 1.25,
        caveat_note=f"verifying {k + 1} positions is not free on this machine (r = {r:.2f}), so the yield must beat r",
        wrong_note=f"a pass yielded fewer tokens ({tokens:.2f}) than its wider forward cost (r = {r:.2f})")


def _acceptance(grounded: AcceptanceRun, chat: AcceptanceRun) -> Takeaway:
    points = [(run, label) for run in (grounded, chat) for label in PROPOSERS]
    be = {label: chat.break_even(label) for label in PROPOSERS}
    # For each proposer: the speedup of the task with the higher α over the other task's.
    evidence = []
    for p in PROPOSERS:
        hi, lo = (grounded, chat) if grounded.alpha(p) > chat.alpha(p) else (chat, grounded)
        evidence.append(Evidence.repeats(f"{p}: speedup on the higher-α task ({hi.task}) / on {lo.task}",
                                         [hi.speedup(p)], [lo.speedup(p)], n_label="run of each"))
    spread = abs(be[LOOKUP] - be[HEAD]) > 0.1 or all(abs(v - SEED_THRESHOLD) > 0.1 for v in be.values())
    return Takeaway.judged(
        "speedup depends on acceptance",
        "; ".join(f"{run.task}, {label}: α {run.alpha(label):.2f} → {run.speedup(label):.2f}x"
                  for run, label in points)
        + ". Break-even α on chat at batch 1 (measured c, r; r below 1 taken as 1): "
        + ", ".join(f"{v:.2f} for {p}" for p, v in be.items()),
        evidence, caveat=spread,
        caveat_note="the α where it stops paying depends on the proposer's cost c, on K and on the batch (at batch "
                    "1 break-even " + " and ".join(f"{v:.2f}" for v in be.values()) + " here; section 7 shows it "
                    "rising with the batch), not a fixed 70%",
        wrong_note="a higher α did not give a higher speedup for every proposer in this run",
        unmeasurable_note="one short run per task and proposer")


def _batch(batch: BatchRun) -> Takeaway:
    monotonic = all(batch.monotonic(p) for p in PROPOSERS)
    largest = batch.batches[-1]
    return Takeaway.judged(
        "batch size works against it",
        "; ".join(f"{p}: " + " → ".join(f"{s:.2f}x" for s in batch.speedups(p)) for p in PROPOSERS)
        + f" at batch {' / '.join(map(str, batch.batches))} ({batch.task}, {batch.max_tokens} tokens each, "
          f"K={batch.k})",
        [Evidence.repeats(f"{p}: speedup at batch {largest} / at batch 1", [batch.speedups(p)[-1]],
                          [batch.speedups(p)[0]], expect="below", n_label="run of each") for p in PROPOSERS],
        caveat=not monotonic,
        caveat_note="not monotonic across the batch sizes in this short run; and the batch where it stops paying is "
                    "this CPU's (section 7.4): on a GPU it is far larger",
        wrong_note="the speedup at the largest batch was not below batch 1's for every proposer")


def _trees(trees: TreeComparison, chat: AcceptanceRun) -> Takeaway:
    best = trees.best_tree
    tokens = trees.num_prompts * trees.max_tokens
    passes = {label: int(trees.frame.loc[label, "passes"]) for label in (best, trees.chain)}
    return Takeaway.judged(
        "tree drafts, Medusa and EAGLE raise the yield",
        f"{trees.sentence()}. The EAGLE-style head (trained on a lent H100, datasets/drafts/README.md) reaches α "
        f"{chat.alpha(HEAD):.2f} on open chat as a chain",
        # Holds when the best tree yields more tokens per pass than the chain at the same positions per pass,
        # by more than the pass counts' noise; caveat when it is not also faster end to end.
        Evidence.rate_ratio(f"tokens per pass, {best} / the chain", tokens, passes[best], tokens,
                            passes[trees.chain], n_label="target passes"),
        caveat=not trees.faster_too,
        caveat_note=f"{best} yields {trees.gain():.2f}x the chain's tokens per pass but is not faster than the chain "
                    "here (drafting and verifying the tree cost more)",
        wrong_note="the trees yielded fewer tokens per pass than the chain in this run",
        unmeasurable_note=f"one saved or lost pass moves the ratio by about {1 / max(passes.values()):.0%}; "
                          "telling a 5-10% gain apart needs hundreds of passes (benchmarks/bench_spec_decode.py "
                          "runs more)")


def _monitor(grounded: AcceptanceRun, chat: AcceptanceRun, sampling: SamplingCheck) -> Takeaway:
    g, c = grounded.row(LOOKUP), chat.row(LOOKUP)
    understated = abs(float(g["alpha"]) - float(g["accepted_per_drafted"])) > 0.05
    return Takeaway.judged(
        "monitor the acceptance rate: when it drops, the gain goes",
        f"the same prompt lookup: α {g['alpha']:.2f} on grounded tasks → {g['speedup']:.2f}x, α {c['alpha']:.2f} on "
        f"chat → {c['speedup']:.2f}x; vLLM's counters give accepted ÷ draft tokens, {g['accepted_per_drafted']:.2f} "
        f"on grounded tasks; sampled output still follows the target (χ² p = {sampling.p_value:.2f})",
        [Evidence.proportions("α grounded minus α chat (prompt lookup)", int(g["accepted"]), int(g["tested"]),
                              int(c["accepted"]), int(c["tested"]), n_label="tested drafts"),
         Evidence.repeats("speedup grounded / chat (prompt lookup)", [float(g["speedup"])], [float(c["speedup"])],
                          n_label="run of each"),
         Evidence.exact("χ² test of sampled tokens against the target: passed", float(sampling.passed), 0.5,
                        n=sampling.samples, n_label=f"{sampling.samples} samples", unit="")],
        caveat=understated,
        caveat_note="vLLM (V1) exports counters, and the rate they give (accepted ÷ draft tokens) is not α: watch "
                    "the same ratio over time (section 10)",
        wrong_note="lower α did not come with a lower speedup here" if sampling.passed
        else "the sampled output did not follow the target's distribution")


def closing_table(curve: ForwardCurve, grounded: AcceptanceRun, chat: AcceptanceRun, batch: BatchRun,
                  sampling: SamplingCheck, trees: TreeComparison, *, curve_contention: Contention | None = None,
                  grounded_contention: Contention | None = None, chat_contention: Contention | None = None,
                  batch_contention: Contention | None = None,
                  trees_contention: Contention | None = None) -> ClosingTable:
    """The book's five takeaways, what this chapter measured for each, and a computed verdict.

    The ``*_contention`` arguments are the panels' readings (``panel.contention``) of the runs each result came
    from (the acceptance panel's grounded and open-chat runs each their own). Every row reads a speedup or a
    forward's cost, so a row whose reading was busy says "the machine was busy" instead of concluding."""
    if grounded.task != "grounded" or chat.task != "open chat":
        raise ValueError(f"pass the grounded run, then the open-chat run (got {grounded.task!r}, {chat.task!r})")
    return ClosingTable([
        busy_takeaway(_amortize(curve, grounded), curve_contention, grounded_contention),
        busy_takeaway(_acceptance(grounded, chat), grounded_contention, chat_contention),
        busy_takeaway(_batch(batch), batch_contention),
        busy_takeaway(_trees(trees, chat), trees_contention),
        busy_takeaway(_monitor(grounded, chat, sampling), grounded_contention, chat_contention)])
