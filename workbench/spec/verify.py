"""Verifying drafted tokens against the target model, exactly.

The target scores the newest token and all K drafts in one forward, giving K + 1 next-token distributions
p_0 .. p_K (p_i follows draft i, p_0 follows the last real token).

* Greedy: accept the longest prefix of drafts equal to the target's argmax, then emit the target's own argmax
  at the first mismatch (or after the last draft): the output is exactly what plain greedy decoding emits.
* Sampling (Leviathan et al. / Chen et al., 2023): accept draft d_i with probability min(1, p(d_i) / q(d_i)),
  where q is the distribution the draft sampled it from; at the first rejection, emit a token drawn from
  max(0, p - q) renormalized, and stop. If all are accepted, emit a token drawn from p_K. Each emitted token is
  then distributed exactly as the target's p, whatever q was. A deterministic proposer (n-gram) is the special
  case q = one-hot on its proposal.
"""

from __future__ import annotations

import torch


def verify_greedy(drafts: list[int], target_logits: torch.Tensor) -> tuple[int, list[int]]:
    """(accepted count a, emitted tokens = drafts[:a] + [target's next token]). target_logits: [K + 1, V]."""
    best = target_logits.argmax(-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == best[accepted]:
        accepted += 1
    return accepted, drafts[:accepted] + [best[accepted]]


def verify_sampled(drafts: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                   generator: torch.Generator | None = None) -> tuple[int, list[int]]:
    """Rejection sampling. draft_probs: [K, V] distributions the drafts were drawn from (None: deterministic
    proposals); target_probs: [K + 1, V] (temperature, top-k and top-p already applied)."""
    for i, token in enumerate(drafts):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(token), p.shape[-1]).to(p.dtype)
        ratio = float(p[token]) / max(float(q[token]), 1e-30)
        if float(torch.rand((), generator=generator)) < min(1.0, ratio):
            continue
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        # residual == 0 means p == q (up to rounding), where rejection has probability 0: fall back to p.
        distribution = residual / total if total > 1e-12 else p
        return i, drafts[:i] + [int(torch.multinomial(distribution, 1, generator=generator))]
    bonus = int(torch.multinomial(target_probs[len(drafts)], 1, generator=generator))
    return len(drafts), drafts + [bonus]
