"""One request, pass by pass: what the proposer drafted, what the target accepted, and what it added itself.

The engine runs a single request while the proposer's drafts are recorded (`workbench.spec_experiments.methods
.TimedProposer`); each step's output delta and the step record's accepted count say how each draft fared. The
HTML view colours every token by its fate, so a reader sees the accepted runs and the rejections without a
kernel: it is stored with the panel's status line.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from workbench.config import SamplingParams
from workbench.spec_experiments.methods import PLAIN, TimedProposer, make_engine

ACCEPTED, REJECTED, UNTESTED, CORRECTION, BONUS, PLAIN_TOKEN = (
    "#c7e9c0", "#fcbba1", "#e0e0e0", "#fdd49e", "#c6dbef", "transparent")
LEGEND = [(ACCEPTED, "draft accepted"), (REJECTED, "draft rejected (first mismatch)"),
          (UNTESTED, "draft never tested (after a rejection)"), (CORRECTION, "target's token at the rejection"),
          (BONUS, "target's bonus token (every draft accepted)"), (PLAIN_TOKEN, "no drafts: a plain step")]


@dataclass(slots=True)
class Pass:
    """One engine step of the request: its drafts, how many were accepted, and the tokens it emitted."""

    drafts: list[int]
    accepted: int
    emitted: list[int]

    @property
    def kind(self) -> str:
        if not self.drafts:
            return "plain"
        return "all accepted" if self.accepted == len(self.drafts) else "rejection"


@dataclass(slots=True)
class RequestTrace:
    passes: list[Pass]  # the first is the prefill step (its one token has no drafts)
    output_ids: list[int]
    plain_ids: list[int] | None  # plain greedy output of the same request (None when sampling)
    k: int

    @property
    def same_as_plain(self) -> bool | None:
        return None if self.plain_ids is None else self.output_ids == self.plain_ids

    def frame(self) -> pd.DataFrame:
        """One row per verification pass (steps that drafted): drafted, accepted, emitted."""
        rows = [{"pass": i + 1, "drafted": len(p.drafts), "accepted": p.accepted,
                 "rejected": int(p.accepted < len(p.drafts)), "untested": max(len(p.drafts) - p.accepted - 1, 0),
                 "emitted": len(p.emitted)} for i, p in enumerate(q for q in self.passes if q.drafts)]
        return pd.DataFrame(rows, columns=["pass", "drafted", "accepted", "rejected", "untested", "emitted"])

    def target_passes(self) -> int:
        """Target forwards after the prefill: one per step, whether or not it verified drafts."""
        return len(self.passes) - 1


def trace_request(model, tokenizer, prompt: str, method: str, k: int, *, max_tokens: int = 48,
                  temperature: float = 0.0, seed: int = 0, draft=None) -> RequestTrace:
    """Run one request with ``method`` ('ngram' or 'draft') and record every pass; at temperature 0 also run it
    plainly, to check the speculative output token for token."""
    if method == PLAIN:
        raise ValueError("trace a speculative method: 'ngram' or 'draft'")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    engine = make_engine(model, tokenizer, method, k, draft=draft)
    proposer: TimedProposer = engine.proposer
    request_id = engine.add_request(prompt, params, num_speculative_tokens=k)
    tokens: list[int] = []
    passes: list[Pass] = []
    while engine.has_unfinished_requests():
        calls = len(proposer.calls)
        mine = [o for o in engine.step() if o.request_id == request_id]
        new = mine[0].token_ids[len(tokens):] if mine else []
        if not new:
            continue  # a prefill chunk that produced no token yet
        tokens = list(mine[0].token_ids)
        # One request: the call's only entry is ours (a step without a call, or an empty draft, is a plain step).
        drafts = next(iter(proposer.calls[-1].drafts.values())) if len(proposer.calls) > calls else []
        passes.append(Pass(drafts, engine.metrics.steps[-1].num_accepted_tokens, new))
    plain = None
    if temperature == 0:
        plain_engine = make_engine(model, tokenizer, PLAIN, 1)
        plain = plain_engine.generate([prompt], params, progress=False)[0].token_ids
    return RequestTrace(passes, tokens, plain, k)


def _token_span(text: str, color: str, *, strike: bool = False, title: str = "") -> str:
    shown = html.escape(text).replace("\n", "↵<br>") or "&nbsp;"
    style = f"background:{color};padding:1px 0;border-radius:2px"
    if strike:
        style += ";text-decoration:line-through;color:#555"
    return f'<span style="{style}" title="{html.escape(title)}">{shown}</span>'


def pass_html(p: Pass, tokenizer) -> str:
    """One pass: accepted drafts, the rejected one and the untested rest (struck through), the target's token."""
    text = lambda t: tokenizer.decode([t])  # noqa: E731
    if not p.drafts:
        return "".join(_token_span(text(t), PLAIN_TOKEN) for t in p.emitted)
    parts = [_token_span(text(t), ACCEPTED, title="accepted draft") for t in p.drafts[:p.accepted]]
    if p.accepted < len(p.drafts):
        parts.append(_token_span(text(p.drafts[p.accepted]), REJECTED, strike=True, title="rejected draft"))
        parts += [_token_span(text(t), UNTESTED, strike=True, title="never tested") for t in p.drafts[p.accepted + 1:]]
    own = p.emitted[p.accepted:]  # the target's own token (absent if the request stopped inside the drafts)
    color, title = (BONUS, "bonus token") if p.accepted == len(p.drafts) else (CORRECTION, "target's correction")
    parts += [_token_span(text(t), color, title=title) for t in own]
    return "".join(parts)


def trace_html(trace: RequestTrace, tokenizer) -> str:
    """The whole answer, pass by pass, with a legend; thin bars separate the target's passes."""
    body = '<span style="color:#999">|</span>'.join(pass_html(p, tokenizer) for p in trace.passes)
    legend = " ".join(f'<span style="background:{c};border:1px solid #ccc;padding:0 6px">&nbsp;</span> {name}'
                      for c, name in LEGEND)
    return (f'<div style="font-family:monospace;font-size:13px;line-height:1.9;white-space:normal">{body}</div>'
            f'<div style="font-size:12px;color:#555;margin-top:4px">{legend}</div>')
