"""Chapter 4's streaming run: one greedy request streamed token by token and the same request unstreamed, timed in
alternating order after an uncounted warm-up (`stream_vs_buffered` -> `StreamRun`).

The first version ran the streamed request once, first, on a fresh engine and with the live text box updated
after every token, then the buffered one once, and found streaming 30% slower in total (issue 30). That compared
unlike runs: the first request on a fresh engine finds its prompt outside the prefix cache (the second finds it
cached) and pays one-off costs, and the streamed one also paid for updating the text box. Now the request runs
once uncounted, streamed into the text box (its total, its first token and the time spent in the text box are
kept: ``cold_*``), so that every timed run finds the same cache state; then the two modes alternate which goes
first for ``rounds`` rounds, without the text box. Each mode's total is its fastest round, and every round is
kept in ``StreamRun.rounds``. No widgets here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from workbench.config import SamplingParams
from workbench.engine.llm_engine import LLMEngine

STREAMED, BUFFERED = "streamed", "buffered"
# Streamed totals within this fraction of the buffered ones count as "the same total time".
SAME_TOTAL = 0.10


@dataclass(frozen=True)
class StreamRun:
    """The streamed and buffered runs of one request: arrivals of the fastest streamed round, every round's totals."""

    text: str
    arrivals: pd.DataFrame  # one row per streamed delta: seconds since the request, tokens seen so far, text
    rounds: pd.DataFrame  # one row per timed run: round, mode, first (ran first in its round), total_s, ttft_s
    cold_total_s: float  # the uncounted first run: streamed on the fresh engine, into the live text box
    cold_ttft_s: float
    cold_display_s: float  # of the first run's time, what the live text box (``on_text``) took
    same_text: bool

    def _totals(self, mode: str) -> pd.Series:
        return self.rounds.loc[self.rounds["mode"] == mode, "total_s"]

    @property
    def tokens(self) -> int:
        return int(self.arrivals["tokens_seen"].iloc[-1])

    @property
    def ttft_s(self) -> float:
        """When the first text was on screen, streamed (the fastest streamed round)."""
        return float(self.arrivals["seconds"].iloc[0])

    @property
    def streamed_total_s(self) -> float:
        return float(self._totals(STREAMED).min())

    @property
    def buffered_total_s(self) -> float:
        """When the reader sees anything at all, unstreamed: the whole request (fastest round)."""
        return float(self._totals(BUFFERED).min())

    @property
    def total_ratio(self) -> float:
        """Streamed total over buffered total (fastest rounds)."""
        return self.streamed_total_s / self.buffered_total_s

    @property
    def same_total(self) -> bool:
        return abs(self.total_ratio - 1) <= SAME_TOTAL

    @property
    def first_run_penalty(self) -> float:
        """How much longer the uncounted first (cold) run took than the fastest streamed round, as a fraction."""
        return self.cold_total_s / self.streamed_total_s - 1

    @property
    def cold_prefill_extra_s(self) -> float:
        """How much later the first token came in the first run than in the fastest streamed round."""
        return self.cold_ttft_s - self.ttft_s

    @property
    def order_effect(self) -> float:
        """Mean total of runs that went first in their round over those that went second, minus 1."""
        first = self.rounds.loc[self.rounds["first"], "total_s"].mean()
        second = self.rounds.loc[~self.rounds["first"], "total_s"].mean()
        return float(first / second - 1)

    @property
    def tokens_per_s(self) -> float:
        """The streamed decode rate: tokens after the first over the time after the first."""
        return (self.tokens - 1) / (self.streamed_total_s - self.ttft_s)


def _streamed(engine: LLMEngine, prompt: str, params: SamplingParams,
              on_text: Callable[[str], None] | None) -> tuple[str, pd.DataFrame, float, float]:
    """(text, arrivals, total seconds, seconds spent in ``on_text``)."""
    rows, text, display = [], "", 0.0
    start = time.perf_counter()
    for output in engine.stream(prompt, params):
        now = time.perf_counter() - start
        delta = output.outputs[0]
        text += delta.new_text
        rows.append({"seconds": now, "tokens_seen": len(delta.token_ids), "new_text": delta.new_text})
        if on_text is not None:
            shown = time.perf_counter()
            on_text(text)
            display += time.perf_counter() - shown
    total = time.perf_counter() - start
    return text, pd.DataFrame(rows, columns=["seconds", "tokens_seen", "new_text"]), total, display


def _buffered(engine: LLMEngine, prompt: str, params: SamplingParams) -> tuple[str, float]:
    start = time.perf_counter()
    output = engine.generate([prompt], params, progress=False)[0]
    return output.text, time.perf_counter() - start


def stream_vs_buffered(engine: LLMEngine, prompt: str, max_tokens: int, *, rounds: int = 2,
                       on_text: Callable[[str], None] | None = None) -> StreamRun:
    """Stream one greedy request once uncounted (``on_text`` sees the text so far after every delta), then time it
    streamed and unstreamed ``rounds`` times each, alternating which goes first."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    params = SamplingParams(max_tokens=max_tokens)
    text, cold_arrivals, cold, display = _streamed(engine, prompt, params, on_text)
    rows, fastest, texts = [], None, {text}
    for r in range(rounds):
        order = (STREAMED, BUFFERED) if r % 2 else (BUFFERED, STREAMED)
        for position, mode in enumerate(order):
            if mode == STREAMED:
                out, arrivals, total, _ = _streamed(engine, prompt, params, None)
                ttft = float(arrivals["seconds"].iloc[0])
                if fastest is None or total < fastest[1]:
                    fastest = (arrivals, total)
            else:
                (out, total), ttft = _buffered(engine, prompt, params), float("nan")
            texts.add(out)
            rows.append({"round": r + 1, "mode": mode, "first": position == 0, "total_s": total, "ttft_s": ttft})
    return StreamRun(text, fastest[0], pd.DataFrame(rows), cold, float(cold_arrivals["seconds"].iloc[0]), display,
                     len(texts) == 1)
