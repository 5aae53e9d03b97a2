"""Chapter 11's systems table, 'Try this' exercises and closing table, computed from the chapter's own results.

Chapter 11 has no seed chapter: its claims are the ones the serving systems with a second tier make (each with its
source, in ``datasets/kv_tiers/systems.csv``), checked by this chapter's measurements where this machine can.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.lab.ch11.restart import RestartRun
from workbench.lab.ch11.runs import BLOCK_SIZE, TIERS, GpuCase, TierCosts
from workbench.lab.ch11.sessions import SessionsRun
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.closing import ClosingTable, Takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
from workbench.paths import DATASETS_DIR
from workbench.timing import describe_machine

SYSTEMS = DATASETS_DIR / "kv_tiers" / "systems.csv"


def systems_table(sessions: SessionsRun, restart: RestartRun, costs: TierCosts) -> pd.DataFrame:
    """What each system does and the number it publishes, and this workbench's measured here beside them: four
    columns (the stored file's seven, joined), so that the table fits a page."""
    table = _with_ours(pd.read_csv(SYSTEMS), sessions, restart, costs)
    return pd.DataFrame({
        "system": table["system"],
        "what it keeps, where, and when it writes": table["where the KV goes"] + "; writes " + table["when it writes"]
        + "; " + table["restore or recompute"],
        "restart and sharing": table["restart and sharing"],
        "published figure (source)": table["their published number"] + " (" + table["source"] + ")"})


def _with_ours(table: pd.DataFrame, sessions: SessionsRun, restart: RestartRun, costs: TierCosts) -> pd.DataFrame:
    arm = sessions.tier_arms[0]
    ours = {"system": "this workbench (LLMEngine(kv_offload=...), workbench serve --kv-offload)",
            "where the KV goes": "host memory (pinned under CUDA) or one checked file per block on disk",
            "when it writes": "write_back (on eviction, and at a clean shutdown) or write_through",
            "restore or recompute": "restore when the costs measured at start-up say so "
                                    f"({costs.per_token_s * 1e3:.2f} ms per token to recompute here)",
            "restart and sharing": "the disk tier outlives a restart; servers may share a directory",
            "their published number": f"measured here: returning turns {sessions.ratio(arm):.1f}x sooner with the "
                                      f"{arm}; a restarted server {restart.speedup:.1f}x sooner on a "
                                      f"{restart.frame['prompt_tokens'].iloc[0]}-token prompt",
            "source": "this notebook"}
    return pd.concat([table, pd.DataFrame([ours])], ignore_index=True)


def exercises(costs: TierCosts, sweep: pd.DataFrame, case: GpuCase | None) -> dict[str, Exercise]:
    out = {
        "block": Exercise(
            f"How many bytes does one {BLOCK_SIZE}-token block of this model's KV take in the {costs.kv_format} "
            "format (what every restore moves)?",
            lambda: costs.bytes_per_block,
            why="keys and values of every layer for 16 tokens: 2 x 30 layers x 3 KV heads x 64 dims x 4 bytes x 16 "
                "(int8 and int4 add their scales)", rel_tol=0.0),
        "bandwidth": Exercise(
            "How fast (MB/s) must a tier deliver blocks to break even with recomputing them here?",
            lambda: costs.bytes_per_block / (costs.per_token_s * BLOCK_SIZE) / 1e6,
            why="a block's bytes over the time recomputing its 16 tokens takes: any tier faster than that, once its "
                "fixed cost is paid, wins", rel_tol=0.05),
        "sessions": Exercise(
            "With the hit-rate panel's device blocks and no tier, up to how many sessions cycling round robin still "
            "find anything of their history in the cache?",
            lambda: int(sweep[sweep["device only"] > 0]["sessions"].max()),
            why="LRU under round robin: once the sessions' history outgrows the pool, each returns after its blocks "
                "were evicted, so the hit rate falls off a cliff (chapter 2); the tier moves the cliff out",
            rel_tol=0.0),
    }
    if case is not None:
        out["gpu"] = Exercise(
            f"On the {case.device}, how many ms does restoring a 4,096-token Llama-3-8B prefix (bf16) over the host "
            "link take?",
            lambda: float(case.restore_s(4096, case.host_bytes_per_s)) * 1e3,
            why=f"4,096 tokens x {case.kv_bytes_per_token:,} bytes of KV per token over "
                f"{case.host_bytes_per_s / 1e9:.1f} GB/s "
                + ("(measured)" if case.host_measured else "(PCIe 5.0 x16's datasheet figure: not measured yet)"))
    return out


def _tier_ratio(costs: TierCosts, tier: str, tokens: int = 512) -> Evidence:
    return Evidence.repeats(f"recompute / restore from {tier}, {tokens}-token prefix", [costs.speedup(tier, tokens)],
                            null=1.0, unit="x", n_label="timed ratio (fastest of 3 transfers; a line through 4 "
                                                        "prefills)")


def closing_table(costs: TierCosts, sweep: pd.DataFrame, check, sessions: SessionsRun, restart: RestartRun,
                  cases: list[GpuCase]) -> ClosingTable:
    arm = sessions.tier_arms[0]
    alone, tiered = check.engine["device only"], check.engine["device + tier"]
    gain = (sum(tiered[1:]) - sum(alone[1:])) / alone[0]
    gpu = cases[-1] if cases else None
    same = sessions.frame.groupby(["session", "turn"])["output"].nunique().eq(1)
    return ClosingTable([
        Takeaway.judged(
            "Restoring a prefix's KV from a lower tier is cheaper than recomputing it (the premise of vLLM's "
            "offloading connector, LMCache, HiCache and Dynamo's KVBM).",
            f"here {costs.per_token_s * 1e3:.2f} ms per token to recompute; a 512-token prefix restores "
            + ", ".join(f"{costs.speedup(t, 512):,.0f}x faster from {t}" for t in TIERS),
            [_tier_ratio(costs, TIERS[0]), _tier_ratio(costs, TIERS[2])], caveat=True,
            caveat_note="on this CPU a small model's prefill is slow next to any copy, even a cold read from disk; "
                        "where the model is small and the device fast the margin shrinks (the GPU case below)",
            wrong_note="a tier here was slower than recomputing"),
        Takeaway.judged(
            "On a GPU the host link is fast enough that restoring beats recomputing (vLLM's blog: 2-22x faster "
            "TTFT for prompts found in CPU memory, on an H100).",
            (f"Llama-3-8B on the {gpu.device}: recomputing costs {gpu.per_token_s * 1e6:.1f} µs per token (stored "
             f"prefill steps); restoring over {gpu.host_bytes_per_s / 1e9:.0f} GB/s would be {gpu.ratio(4096):.0f}x "
             "faster" if gpu else "no GPU roofline file is stored"),
            [Evidence.exact("recompute / restore over the host link (arithmetic on stored steps)",
                            gpu.ratio(4096) if gpu else math.nan, 1.0, n=1 if gpu else 0),
             Evidence.absent("host-to-device copy bandwidth on the GPU") if not (gpu and gpu.host_measured) else
             Evidence.exact("host-to-device bandwidth measured (GB/s)", gpu.host_bytes_per_s / 1e9, 0.0)],
            unmeasurable_note="the host link's bandwidth is PCIe 5.0's datasheet figure: no host-device copy has "
                              "been timed on a lent GPU yet (the GPU session's gpu_chapters.py --chapter ch11 "
                              "does)"),
        Takeaway.judged(
            "A second tier keeps the hit rate up when the working set outgrows the device's cache (HiCache, "
            "Novita: hit rate 40% to 80%).",
            f"{check.sessions} sessions round robin through {check.device_blocks} device blocks: "
            f"{sum(alone[1:]) / alone[0]:.0%} of prompt tokens not recomputed alone, "
            f"{sum(tiered[1:]) / tiered[0]:.0%} with {check.tier_blocks} tier blocks (engine counts, equal to the "
            "simulator's)",
            Evidence.exact("hit-rate gain with the tier (engine counts)", gain, 0.0, n=alone[0],
                           n_label=f"{alone[0]} prompt tokens", unit="pts",
                           settings={"device blocks": check.device_blocks, "tier blocks": check.tier_blocks}),
            wrong_note="the tier did not add hits on this stream"),
        Takeaway.judged(
            "Multi-turn sessions that return after being evicted get their first token sooner with a tier (HiCache: "
            "up to 80% lower TTFT; LMCache: 3-10x lower delay in multi-round QA).",
            f"returning turns: median TTFT {sessions.returns('no tier').median():,.0f} ms without a tier, "
            f"{sessions.returns(arm).median():,.0f} ms with the {arm} ({sessions.ratio(arm):.1f}x)",
            Evidence.bootstrap("median TTFT of returning turns, no tier / tier", sessions.returns("no tier"),
                               sessions.returns(arm), n_label="returning requests",
                               settings={"device blocks": sessions.device_blocks}),
            wrong_note="the tier did not lower TTFT here"),
        Takeaway.judged(
            "A disk tier survives a restart (LMCache's disk backend, llama.cpp's slot files).",
            f"the restarted server read {restart.frame['cached_tokens'].iloc[1]} of "
            f"{restart.frame['prompt_tokens'].iloc[1]} prompt tokens from disk and answered {restart.speedup:.1f}x "
            "sooner",
            [Evidence.exact("prompt tokens read from disk after the restart", restart.frame["cached_tokens"].iloc[1],
                            0.5, n=1, n_label="1 restart", unit=""),
             Evidence.repeats("TTFT before / after the restart", [restart.speedup], null=1.0, unit="x",
                              n_label="restart")],
            wrong_note="the restarted server recomputed the prompt"),
        Takeaway.judged(
            "Restoring changes nothing in the answers: a restored block is the block that was computed.",
            f"{int(same.sum())} of {len(same)} (session, turn) requests got the same greedy answer in every arm "
            "and run",
            Evidence.exact("share of requests whose answer differed between arms", 1 - float(same.mean()),
                           0.5 / len(same), expect="below", n=len(same), n_label=f"{len(same)} requests", unit="%"),
            wrong_note="an answer changed with the tier: a restore is not exact here"),
    ], claim_header="the claim (and who makes it)")


def chapter_baseline(costs: TierCosts, model) -> Baseline:
    longest = costs.prefill.loc[costs.prefill["context"].idxmax()]
    return Baseline("ch11", describe_machine(model.device), str(model.dtype).removeprefix("torch."),
                    "CrossoverLab (measure_prefill_steps, fastest of 2)",
                    prefill_ms_per_token=float(longest["step_s"]) * 1e3 / int(longest["context"]),
                    prefill_tokens=int(longest["context"]))
