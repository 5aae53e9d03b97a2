"""Batches and losses for training the draft (`workbench.draft_training`).

The EAGLE head drafts its 2nd..k-th tokens from its *own* predicted features, which it never sees if trained
only on the target's features. So training unrolls it (as EAGLE-3's "training-time test" does): step s feeds
step s-1's predictions back in, and `UnrolledAttention` lets each step's query see exactly the keys it would
see while drafting — the true context up to the draft's start, then the earlier draft steps of its own chain.
Both draft kinds are trained on the same two signals: regression onto the target's final hidden state
(smooth L1) and cross-entropy against the target's top-k next-token probabilities. An EAGLE head's first
step reads the target's features (its tapped layers, fused, when it has ``taps``); later steps its own output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from workbench.draft_training.data import DraftSample
from workbench.spec.draft_head import DraftModule


@dataclass(slots=True)
class Batch:
    """Samples padded to a common length L; ``valid`` marks real tokens, ``response`` marks rows whose next
    token is drafted in practice (from the last prompt token on)."""

    tokens: torch.Tensor  # [B, L]
    features: torch.Tensor  # [B, L, hidden]
    top_ids: torch.Tensor  # [B, L, K]
    top_probs: torch.Tensor  # [B, L, K], rows renormalised to 1
    tapped: torch.Tensor | None  # [B, L, len(taps) * hidden] when the samples have tapped layers
    valid: torch.Tensor  # [B, L] bool
    response: torch.Tensor  # [B, L] bool

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(None if t is None else t.to(device, non_blocking=True) for t in (
            self.tokens, self.features, self.top_ids, self.top_probs, self.tapped, self.valid, self.response)))


def make_batch(samples: list[DraftSample]) -> Batch:
    n = max(len(s.tokens) for s in samples)
    b, h, k = len(samples), samples[0].features.shape[1], samples[0].top_ids.shape[1]
    tokens = torch.zeros(b, n, dtype=torch.long)
    features = torch.zeros(b, n, h)
    top_ids = torch.zeros(b, n, k, dtype=torch.long)
    top_probs = torch.zeros(b, n, k)
    valid = torch.zeros(b, n, dtype=torch.bool)
    response = torch.zeros(b, n, dtype=torch.bool)
    has_taps = all(getattr(s, "tapped", None) is not None for s in samples)  # old pickles lack the slot
    tapped = torch.zeros(b, n, samples[0].tapped.shape[1]) if has_taps else None
    for i, s in enumerate(samples):
        m = len(s.tokens)
        tokens[i, :m], features[i, :m], top_ids[i, :m] = s.tokens, s.features, s.top_ids
        top_probs[i, :m] = s.top_probs / s.top_probs.sum(-1, keepdim=True)
        valid[i, :m] = True
        response[i, s.prompt_len - 1:m] = True
        if tapped is not None:
            tapped[i, :m] = s.tapped
    return Batch(tokens, features, top_ids, top_probs, tapped, valid, response)


def length_buckets(samples: list[DraftSample], batch_tokens: int, generator: torch.Generator) -> list[list[int]]:
    """Index batches of similar-length samples (little padding), in a seeded random order."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * len(samples[i].tokens) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class UnrolledAttention:
    """Attention for step s of an unrolled draft over a padded [B, L] batch (rows laid out flat, b-major).

    The query at row j of step s belongs to the draft chain that started at row j-s+1: it sees step 1's
    keys (computed from the target's true features) at rows <= j-s+1, and step i's key at row j-s+i for
    i = 2..s. Step 1 alone is ordinary causal attention."""

    def __init__(self, batch: int, rows: int, scale: float):
        self.b, self.l, self.scale = batch, rows, scale
        self.kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def _heads(self, x: torch.Tensor, groups: int) -> torch.Tensor:
        x = x.view(self.b, self.l, x.shape[1], x.shape[2])
        return x.repeat_interleave(groups, dim=2).transpose(1, 2)  # [B, H, L, D]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        steps = self.kv.setdefault(layer, [])
        steps.append((k, v))
        s, g = len(steps), q.shape[1] // k.shape[1]
        qh = self._heads(q, 1)
        k1, v1 = self._heads(steps[0][0], g), self._heads(steps[0][1], g)
        scores = (qh @ k1.transpose(-1, -2)) * self.scale
        allowed = torch.ones(self.l, self.l, dtype=torch.bool, device=q.device).tril(diagonal=1 - s)
        scores = [scores.masked_fill(~allowed, float("-inf"))]
        diag_values = []
        for i in range(2, s + 1):  # the chain's own earlier steps: one key each, shifted by s - i rows
            shift = s - i
            ki, vi = (F.pad(self._heads(t, g), (0, 0, shift, 0))[:, :, :self.l] for t in steps[i - 1])
            scores.append((qh * ki).sum(-1, keepdim=True) * self.scale)
            diag_values.append(vi)
        probs = torch.cat(scores, dim=-1).softmax(-1)
        out = probs[..., :self.l] @ v1
        for i, vi in enumerate(diag_values):
            out = out + probs[..., self.l + i:self.l + i + 1] * vi
        return out.transpose(1, 2).reshape(q.shape)


def vocab_index(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token id -> its row in a draft vocabulary's LM head (``vocab``: the ids, sorted), -1 outside it."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[vocab.cpu()] = torch.arange(len(vocab))
    return index


def restrict_to_vocab(batch: Batch, index: torch.Tensor) -> Batch:
    """``batch`` with the target's top-k ids renumbered into a draft vocabulary (``index`` from `vocab_index`):
    outside ids become -1 with probability 0, and each row is renormalised over the ids the draft can name."""
    ids = index[batch.top_ids]
    probs = batch.top_probs * (ids >= 0)
    return replace(batch, top_ids=ids, top_probs=probs / probs.sum(-1, keepdim=True).clamp_min(1e-12))


def soft_cross_entropy(logits: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft's logits against the target's (renormalised) top-k distribution; ids of -1
    (outside a reduced draft vocabulary) must carry probability 0."""
    logp = logits.float().log_softmax(-1)
    return -(top_probs * logp.gather(-1, top_ids.clamp_min(0))).sum(-1).mean()


@dataclass(slots=True)
class LossWeights:
    # EAGLE's own balance (regression 1.0, classification 0.1) under-trained the logits here: on a 2-epoch run
    # cls 0.1 -> 0.5 raised position-1 acceptance; later steps count less since they matter only if earlier
    # ones are accepted.
    regression: float = 1.0
    classification: float = 0.5
    step_decay: float = 0.8


def _step_loss(draft: DraftModule, lm_head: torch.Tensor, pred: torch.Tensor, target_feats: torch.Tensor,
               rows: torch.Tensor, ce_rows: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor,
               w: LossWeights) -> tuple[torch.Tensor, float]:
    reg = F.smooth_l1_loss(pred[rows], target_feats[rows])
    hidden = pred[ce_rows]
    logits = F.linear(hidden.to(lm_head.dtype), lm_head)
    ce = soft_cross_entropy(logits, top_ids[ce_rows], top_probs[ce_rows])
    acc = float((logits.argmax(-1) == top_ids[ce_rows][:, 0]).float().mean()) if hidden.shape[0] else 0.0
    return w.regression * reg + w.classification * ce, acc


def eagle_loss(draft: DraftModule, lm_head: torch.Tensor, batch: Batch, unroll: int,
               w: LossWeights) -> tuple[torch.Tensor, list[float]]:
    """Loss of an EAGLE head unrolled ``unroll`` steps; returns it and the top-1 agreement per step."""
    b, n = batch.tokens.shape
    device = batch.tokens.device
    rows = n - 1  # row j reads (feature j, token j+1) and predicts feature j+1
    ids, positions = batch.tokens[:, 1:].reshape(-1), torch.arange(rows, device=device).repeat(b)
    target_feats = batch.features[:, 1:].reshape(b * rows, -1)
    top_ids, top_probs = batch.top_ids[:, 1:].reshape(b * rows, -1), batch.top_probs[:, 1:].reshape(b * rows, -1)
    valid, response = batch.valid[:, 1:], batch.response[:, :-1]
    attention = UnrolledAttention(b, rows, draft.attention_scale)
    feats = draft.fuse_features(draft.target_source(batch)[:, :-1].reshape(b * rows, -1))
    total, accs = torch.zeros((), device=device), []
    for step in range(unroll):
        pred = draft(ids, feats, positions, attention)
        row_ok = (valid & (torch.arange(rows, device=device) >= step)).reshape(-1)
        loss, acc = _step_loss(draft, lm_head, pred, target_feats, row_ok, row_ok & response.reshape(-1),
                               top_ids, top_probs, w)
        total = total + w.step_decay ** step * loss
        accs.append(acc)
        # the next step reads this step's prediction for the row before it
        feats = F.pad(pred.view(b, rows, -1), (0, 0, 1, 0))[:, :rows].reshape(b * rows, -1)
    return total, accs


def layers_loss(draft: DraftModule, lm_head: torch.Tensor, batch: Batch, w: LossWeights
                ) -> tuple[torch.Tensor, list[float]]:
    """Loss of a token-only draft: its final hidden state at j should be the target's, and so its next token."""
    b, n = batch.tokens.shape
    attention = UnrolledAttention(b, n, draft.attention_scale)
    pred = draft(batch.tokens.reshape(-1), torch.arange(n, device=batch.tokens.device).repeat(b), attention)
    valid = batch.valid.reshape(-1)
    loss, acc = _step_loss(draft, lm_head, pred, batch.features.reshape(b * n, -1), valid,
                           valid & batch.response.reshape(-1), batch.top_ids.reshape(b * n, -1),
                           batch.top_probs.reshape(b * n, -1), w)
    return loss, [acc]
