"""Multi-turn sessions that come back after other sessions pushed them out of the device's cache, run on the
engine without a second KV tier and with one (`workbench.cache.tier`): what chapter 11 shows and
benchmarks/bench_kv_tiers.py measures.

Sessions are token ids, not text: what a turn costs depends on how many tokens it carries, and ids keep every
length exact. Each session starts from its own ``history`` tokens; every turn is the whole conversation so far
(its history, then each earlier answer and the user's next ``new`` tokens), as a chat API receives it. Turns go
round robin over the sessions, one request at a time, so a session returns after every other session has run once:
with a device pool smaller than the sessions' working set, its blocks are gone by then (recomputed without a tier,
restored with one). The two arms run the same stream, alternately, ``repeats`` times each.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.cache.tier.config import KVOffloadConfig
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.intmath import ceil_div

BLOCK_SIZE = 16
ARMS = ("no tier", "host tier", "disk tier")


def session_starts(sessions: int, history: int, seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(history)] for _ in range(sessions)]


def device_blocks_for(sessions: int, history: int, turns: int, new: int, max_tokens: int) -> int:
    """A device pool holding the longest turn and about half of the others': every session is evicted before it
    returns when there are three or more."""
    longest = ceil_div(history + turns * (new + max_tokens), BLOCK_SIZE) + 1
    return max(longest + 2, int(longest * max(1.5, sessions / 2)))


def _engine(model, arm: str, device_blocks: int, folder: Path) -> LLMEngine:
    tier = {"host tier": KVOffloadConfig("host", size_gib=1.0),
            "disk tier": KVOffloadConfig("disk", size_gib=1.0, directory=folder)}.get(arm)
    return LLMEngine(model, None, cache_config=CacheConfig(block_size=BLOCK_SIZE, num_blocks=device_blocks),
                     scheduler_config=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2048), kv_offload=tier)


def _run_arm(model, arm: str, starts: list[list[int]], *, turns: int, new: int, max_tokens: int, device_blocks: int,
             run: int, folder: Path, seed: int) -> list[dict]:
    engine = _engine(model, arm, device_blocks, folder)
    rng = random.Random(seed)
    conversations = [list(s) for s in starts]
    rows = []
    for turn in range(1, turns + 1):
        for session, prompt in enumerate(conversations):
            output = engine.generate([list(prompt)], SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                     progress=False, chat=False)[0]
            record = engine.metrics.request_frame().iloc[-1]
            seq_id = engine.metrics.finished[-1].seq_id
            restored = engine.blocks.restored_tokens(seq_id) if engine.kv_offload is not None else 0
            rows.append({"run": run, "arm": arm, "session": session, "turn": turn, "prompt_tokens": len(prompt),
                         "cached_tokens": int(record["cached_prompt_tokens"]), "restored_tokens": restored,
                         "ttft_ms": float(record["ttft_s"]) * 1e3, "output": tuple(output.outputs[0].token_ids)})
            prompt += list(output.outputs[0].token_ids) + [rng.randrange(100, 40000) for _ in range(new)]
    engine.close()
    return rows


@dataclass
class SessionsRun:
    """Every request of every run: run, arm, session, turn, prompt/cached/restored tokens, ttft_ms, output."""

    frame: pd.DataFrame
    device_blocks: int

    def returns(self, arm: str) -> pd.Series:
        """TTFT (ms) of the turns after the first (the ones a tier can serve), every run."""
        f = self.frame
        return f[(f["arm"] == arm) & (f["turn"] > 1)]["ttft_ms"]

    def ratio(self, arm: str) -> float:
        """Median TTFT of returning turns without a tier over the same with ``arm``."""
        return float(self.returns("no tier").median() / self.returns(arm).median())

    @property
    def tier_arms(self) -> list[str]:
        return [a for a in self.frame["arm"].unique() if a != "no tier"]

    @property
    def outputs_identical(self) -> bool:
        """Every request's greedy answer the same in every arm and run."""
        return bool(self.frame.groupby(["session", "turn"])["output"].nunique().eq(1).all())

    def summary(self) -> pd.DataFrame:
        f = self.frame[self.frame["turn"] > 1]
        return f.groupby(["arm", "run"]).agg(requests=("ttft_ms", "size"), median_ttft_ms=("ttft_ms", "median"),
                                             cached_share=("cached_tokens", "sum"), prompt=("prompt_tokens", "sum"),
                                             restored_tokens=("restored_tokens", "sum")).assign(
            cached_share=lambda t: t["cached_share"] / t["prompt"]).drop(columns="prompt").reset_index()


def multi_turn(model, *, sessions: int = 4, turns: int = 3, history: int = 256, new: int = 24, max_tokens: int = 4,
               arms: tuple[str, ...] = ARMS[:2], repeats: int = 2, seed: int = 0, progress=None) -> SessionsRun:
    starts = session_starts(sessions, history, seed, model.spec.vocab_size)
    device_blocks = device_blocks_for(sessions, history, turns, new, max_tokens)
    rows, total = [], repeats * len(arms)
    with tempfile.TemporaryDirectory(prefix="ch11-sessions-") as folder:
        for run in range(repeats):
            for i, arm in enumerate(arms):  # alternating, so both arms see the machine as it is
                if progress is not None:
                    progress(run * len(arms) + i, total, f"run {run + 1} of {repeats}: {arm}")
                rows += _run_arm(model, arm, starts, turns=turns, new=new, max_tokens=max_tokens,
                                 device_blocks=device_blocks, run=run, folder=Path(folder) / f"{arm}-{run}",
                                 seed=seed + 1)
    return SessionsRun(pd.DataFrame(rows), device_blocks)
