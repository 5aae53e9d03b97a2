"""Offline acceptance of a draft: speculative decoding replayed over the target's own greedy responses.

With greedy verification, the target's output is fixed (its greedy response), so the draft's acceptance can be
measured without running the target step by step: at each verification the draft proposes ``k`` tokens
autoregressively from the accepted context, the accepted ones are the longest prefix equal to the target's
continuation, and the target's correction ("bonus") token follows, exactly as in the engine. The draft keeps
a real KV cache (`workbench.cache.contiguous`) and catches up on the accepted tokens each round, as it would
over the paged cache; an EAGLE head reads the target's features only where the target has computed them.
"""

from __future__ import annotations

import torch

from workbench.cache.contiguous import ContiguousKVCache
from workbench.draft_training.data import DraftSample, build_samples
from workbench.models.llama import LlamaModel
from workbench.spec.draft_head import DraftModule
from workbench.spec.stats import SpecCounters


class _Replay:
    """The state of one sequence being replayed: its context length ``m`` (tokens known to the target) and
    how many positions of the draft's cache hold values computed from the true context."""

    def __init__(self, slot: int, sample: DraftSample, k: int):
        self.slot, self.sample, self.k = slot, sample, k
        self.m = sample.prompt_len + 1  # the target's prefill produced the first response token itself
        self.valid = 0
        self.accepted: list[int] = []

    @property
    def active(self) -> bool:
        return self.m + self.k <= len(self.sample.tokens)


def _catch_up_rows(draft: DraftModule, r: _Replay) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ids, positions, features) of the true-context rows the draft's cache still lacks.

    An EAGLE head's row j reads (feature j, token j+1), so with m known tokens it can fill positions
    0..m-2 (the target's feature at m-1 does not exist yet); a token model fills 0..m-1."""
    tokens = r.sample.tokens
    if draft.needs_target_features:
        pos = torch.arange(r.valid, r.m - 1)
        rows = draft.target_source(r.sample)[pos].to(next(draft.parameters()).device)
        return tokens[pos + 1], pos, draft.fuse_features(rows)
    pos = torch.arange(r.valid, r.m)
    return tokens[pos], pos, None


def _forward(draft: DraftModule, cache: ContiguousKVCache, group: list[_Replay], rows: list[tuple],
             starts: list[int]) -> torch.Tensor:
    """One draft forward over several sequences' new rows; returns the last row's hidden state per sequence."""
    device = next(draft.parameters()).device
    ids = torch.cat([r[0] for r in rows]).to(device)
    pos = torch.cat([r[1] for r in rows]).to(device)
    lens = [len(r[0]) for r in rows]
    backend = cache.attention([g.slot for g in group], starts, lens)
    if draft.needs_target_features:
        feats = torch.cat([r[2] for r in rows]).to(device=device, dtype=next(draft.parameters()).dtype)
        hidden = draft(ids, feats, pos, backend)
    else:
        hidden = draft(ids, pos, backend)
    last = torch.tensor(lens).cumsum(0) - 1
    return hidden[last.to(device)]


@torch.no_grad()
def _replay_round(draft: DraftModule, cache: ContiguousKVCache, group: list[_Replay]) -> None:
    """One verification for every sequence in ``group``: catch up, draft k tokens, accept, advance."""
    k = group[0].k
    rows = [_catch_up_rows(draft, r) for r in group]
    hidden = _forward(draft, cache, group, rows, [r.valid for r in group])
    drafts = []
    for step in range(k):
        token = draft.compute_logits(hidden).argmax(-1)
        drafts.append(token.cpu())
        if step == k - 1:
            break
        # The next draft row sits one position further: (own predicted feature, drafted token) for an EAGLE head.
        pos = [r.m - 1 + step if draft.needs_target_features else r.m + step for r in group]
        step_rows = [(token[i:i + 1].cpu(), torch.tensor([p]), hidden[i:i + 1].cpu()) for i, p in enumerate(pos)]
        hidden = _forward(draft, cache, group, step_rows, pos)
    proposed = torch.stack(drafts, dim=1)  # [len(group), k]
    for r, guess in zip(group, proposed, strict=True):
        truth = r.sample.tokens[r.m:r.m + k]
        a = int((guess == truth).long().cumprod(0).sum())
        r.accepted.append(a)
        r.valid = r.m - 1 if draft.needs_target_features else r.m
        r.m += a + 1  # the accepted drafts plus the target's own next token


def acceptance_on_samples(draft: DraftModule, samples: list[DraftSample], k: int = 4,
                          batch: int = 16) -> dict[str, object]:
    """Replay greedy speculative decoding with ``k`` drafted tokens per verification over ``samples``.

    Returns the share of drafted tokens accepted (``acceptance``, accepted / drafted), the per-token ``alpha``
    of the (1 - a^(K+1)) / (1 - a) formula (accepted / tested, `workbench.spec.stats`), the share of
    verifications whose i-th draft token was accepted (``per_position``, i = 1..k; their mean is
    ``acceptance``), the same conditioned on the earlier ones being accepted (``alpha_per_position``), and
    the mean accepted length."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    accepted: list[int] = []
    device, dtype = next(draft.parameters()).device, next(draft.parameters()).dtype
    for start in range(0, len(samples), batch):
        chunk = samples[start:start + batch]
        cache = ContiguousKVCache(draft.spec, max_batch=len(chunk), max_len=max(len(s.tokens) for s in chunk) + k,
                                  dtype=dtype, device=device)
        replays = [_Replay(i, s, k) for i, s in enumerate(chunk)]
        while active := [r for r in replays if r.active]:
            _replay_round(draft, cache, active)
        accepted += [a for r in replays for a in r.accepted]
    if not accepted:
        raise ValueError("no verification fits: every response is shorter than k + 1 tokens")
    counters = SpecCounters()  # the engine's own bookkeeping: each verification drafts k, emits accepted + 1
    for a in accepted:
        counters.record(k, a, a + 1)
    table = counters.per_position()
    return {"acceptance": counters.acceptance_rate, "alpha": counters.alpha,
            "per_position": table["acceptance_rate"].tolist(), "alpha_per_position": table["alpha"].tolist(),
            "mean_accepted": counters.mean_accepted_length, "tokens_per_verification": counters.tokens_per_pass,
            "verifications": counters.passes, "k": k}


def evaluate_acceptance(target: LlamaModel, draft: DraftModule, tokenizer, prompts: list[str], k: int = 4, *,
                        max_tokens: int = 160, samples: list[DraftSample] | None = None,
                        progress: bool = False) -> dict[str, object]:
    """Acceptance of ``draft`` at ``k`` (greedy) on ``prompts``: the target answers them through the engine,
    then the draft is replayed over the answers (`acceptance_on_samples`). Pass ``samples`` to reuse answers."""
    if samples is None:
        samples = build_samples(target, tokenizer, prompts, max_tokens, taps=getattr(draft, "taps", ()),
                                progress=progress)
    return acceptance_on_samples(draft, samples, k)
