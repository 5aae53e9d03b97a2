"""Turning logits into next tokens: penalties, greedy, temperature, min-p, top-k and top-p, reproducible per request.

A module of its own, outside ``workbench.engine``, because three parts draw tokens the same way: the engine,
the single-sequence loops of ``workbench.generation``, and the speculative draft proposer (whose drafts must
come from the very distribution the verifier later compares against).

Each request with a seed owns a ``torch.Generator``, so its draws do not depend on which other requests
share the batch. ``probabilities`` is separate from ``sample`` because speculative decoding needs the
filtered distributions themselves (the rejection rule compares target and draft probabilities).

The order is vLLM's: ``apply_history`` first (min_tokens masks the stop tokens; repetition, then frequency and
presence penalties), on the raw logits, so greedy decoding sees them too; then temperature, min-p, top-k, top-p.
The history step depends on every token before, so it is applied only where one token is drawn per sequence and
step (``SamplingParams.one_token_per_step`` keeps such sequences out of speculative decoding).
``token_logprob`` reports a drawn token's log-probability, as the OpenAI API's ``logprobs`` asks, and
``prompt_logprobs`` each prompt token's under the rows before it (vLLM's ``prompt_logprobs``, OpenAI's ``echo``).

One row's numbers never break another row. Values a caller may legally ask for can still be extreme (a
``repetition_penalty`` of 1e-38 sends a logit to infinity), so ``probabilities`` saturates instead of overflowing
(+inf becomes the largest float, NaN drops its token) and top-p always keeps the most likely token (as vLLM's
filter does). What is still not a distribution (a row of NaN logits from the model) raises ``SamplingError`` for
that row only: ``sample_batch`` hands it back in the row's place, and the engine fails that sequence alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench.config import SamplingParams


class SamplingError(ValueError):
    """One row's logits give nothing to draw from (NaN from the model, or no token left with a finite logit)."""


NAN_LOGITS = "the model's logits for this sequence hold NaN: no next token can be chosen"


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model's raw distribution (before penalties, temperature
    and the filters, as vLLM's default ``raw_logprobs``), with the most likely alternatives, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None  # 1 for the most likely token (set for prompt tokens, which vLLM reports it for)


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded from ``params.seed`` (None for greedy requests or unseeded ones)."""
    if params.greedy or params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def apply_history(logits: torch.Tensor, params: SamplingParams, token_ids: list[int], num_prompt_tokens: int,
                  stop_ids: set[int] | frozenset[int]) -> torch.Tensor:
    """One sequence's next-token logits ([vocab]) adjusted for what came before it: ``stop_ids`` (EOS unless
    ignored, and the stop token ids) masked while fewer than ``min_tokens`` are generated, then the repetition
    penalty over prompt and output, then frequency and presence penalties over the output. Returns a new tensor
    (or ``logits`` itself when the params ask for none of this)."""
    if not params.reads_history:
        return logits
    logits = logits.float().clone()
    output = token_ids[num_prompt_tokens:]
    masked = [t for t in stop_ids if t < logits.shape[-1]]
    if len(output) < params.min_tokens and masked:
        logits[masked] = float("-inf")
    if params.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if output and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output, device=logits.device), minlength=logits.shape[-1]).float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: softmax(logits / T) restricted by min-p, top-k, then top-p.

    logits: [..., vocab]. For greedy params this is one-hot on the argmax (the limit T -> 0).
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = _saturated(logits / params.temperature)
    if params.min_p > 0:  # keep tokens with p >= min_p * p_max, i.e. logit >= max logit + log(min_p)
        floor = logits.max(-1, keepdim=True).values + math.log(params.min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p: drop a token once the mass *before* it is >= top_p.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop_sorted[..., 0] = False  # the most likely token always stays (a top_p that rounds to 0 in float32)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _saturated(logits: torch.Tensor) -> torch.Tensor:
    """Logits that overflowed to +inf become the largest float (the limit they stand for: the most likely), and
    NaN ones are dropped (-inf), so the softmax of a row with any finite or +inf logit is a distribution."""
    return torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)


def check_distribution(probs: torch.Tensor) -> None:
    """Raise ``SamplingError`` unless every row of ``probs`` ([..., vocab]) is finite, >= 0 and has mass."""
    if not bool((torch.isfinite(probs).all(-1) & (probs >= 0).all(-1) & (probs.sum(-1) > 0)).all()):
        raise SamplingError("the next-token probabilities are not a distribution (no token has a finite logit)")


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One next token for one sequence (logits: [vocab]); ``SamplingError`` if its logits give no distribution."""
    if bool(torch.isnan(logits).any()):
        raise SamplingError(NAN_LOGITS)
    return int(logits.argmax()) if params.greedy else _draw(logits, params, generator)


def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    probs = probabilities(logits, params)
    check_distribution(probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> list[int | SamplingError]:
    """Next tokens for a batch (logits: [N, vocab]); greedy rows share one argmax. A row that gives no distribution
    gets its ``SamplingError`` in its place, and the other rows are drawn exactly as they would be without it."""
    # One read-back for both (on a GPU each read-back waits for the device: a decode step has only this one)
    greedy, unusable = torch.stack((logits.argmax(-1), torch.isnan(logits).any(-1).long())).tolist()
    tokens: list[int | SamplingError] = []
    for i, (token, p, gen) in enumerate(zip(greedy, params, generators, strict=True)):
        try:
            if unusable[i]:
                raise SamplingError(NAN_LOGITS)
            tokens.append(token if p.greedy else _draw(logits[i], p, gen))
        except SamplingError as exc:
            tokens.append(exc)
    return tokens


def token_logprob(logits: torch.Tensor, token: int, num_top: int) -> TokenLogprob:
    """``token``'s log-probability under softmax(logits) ([vocab], raw: before penalties and temperature) and the
    ``num_top`` most likely tokens with theirs."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logprobs, num_top) if num_top else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
    return TokenLogprob(token, float(logprobs[token]), pairs)


def prompt_logprobs(logits: torch.Tensor, tokens: list[int], num_top: int) -> list[TokenLogprob]:
    """Each of ``tokens``'s log-probability under the raw logits row before it (``logits``: [len(tokens), vocab],
    row i predicting tokens[i]), its rank (1 = the most likely) and the ``num_top`` most likely tokens with theirs."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(tokens, device=logprobs.device).unsqueeze(1)
    chosen = logprobs.gather(1, ids)
    ranks = (logprobs > chosen).sum(dim=1) + 1
    top = torch.topk(logprobs, num_top) if num_top else None
    top_ids = top.indices.tolist() if top is not None else [[] for _ in tokens]
    top_values = top.values.tolist() if top is not None else [[] for _ in tokens]
    return [TokenLogprob(token, value, tuple(zip(ids_, values, strict=True)), rank)
            for token, value, rank, ids_, values in zip(tokens, chosen.squeeze(1).tolist(), ranks.tolist(), top_ids,
                                                        top_values, strict=True)]
