"""Turning logits into next tokens: greedy, temperature, top-k and top-p, reproducible per request.

A module of its own, outside ``workbench.engine``, because three parts draw tokens the same way: the engine,
the single-sequence loops of ``workbench.generation``, and the speculative draft proposer (whose drafts must
come from the very distribution the verifier later compares against).

Each request with a seed owns a ``torch.Generator``, so its draws do not depend on which other requests
share the batch. ``probabilities`` is separate from ``sample`` because speculative decoding needs the
filtered distributions themselves (the rejection rule compares target and draft probabilities).
"""

from __future__ import annotations

import torch

from workbench.config import SamplingParams


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded from ``params.seed`` (None for greedy requests or unseeded ones)."""
    if params.greedy or params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: softmax(logits / T) restricted by top-k, then top-p.

    logits: [..., vocab]. For greedy params this is one-hot on the argmax (the limit T -> 0).
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p: drop a token once the mass *before* it is >= top_p.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One next token for one sequence (logits: [vocab])."""
    if params.greedy:
        return int(logits.argmax())
    probs = probabilities(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> list[int]:
    """Next tokens for a batch (logits: [N, vocab]); greedy rows share one argmax."""
    greedy = logits.argmax(-1).tolist()
    return [g if p.greedy else sample(logits[i], p, gen)
            for i, (g, p, gen) in enumerate(zip(greedy, params, generators, strict=True))]
