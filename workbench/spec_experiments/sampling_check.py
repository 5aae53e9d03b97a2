"""Speculative sampling leaves the output distribution unchanged: a chi-square check small enough for a notebook.

Greedy speculation is easy to check (same tokens as plain decoding). With sampling, outputs differ run to run,
so the claim is about distributions: the tokens must follow the target's distribution, whatever the draft
proposed. To know that distribution *exactly* the check uses a tiny target with a 6-token vocabulary (random
weights: this is about the verification rule, not about quality), enumerates every continuation, and compares
the engine's speculative samples with it by Pearson's chi-square test. Tokens 2 and 3 are the ones that pass
through verification (token 1 comes from the prefill); the draft is another tiny random model, far from the
target, so a wrong rule would show. The same samples are also tested against the draft's own distribution: that
test must fail, or the check would have no power.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import workbench
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models.attention import NoCacheAttention

VOCAB = 6
PROMPT = [1, 2, 3, 4]
CHECK_PROPOSERS = {"draft model": "draft", "prompt lookup": "ngram"}


def tiny_model(seed: int):
    """A one-layer Llama with 6 tokens and random weights (std 0.5, so its distributions are far from uniform)."""
    spec = workbench.model_spec("smollm2-135m").replace(
        name="tiny-6-token", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
        num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    return workbench.random_model(spec, device="cpu", seed=seed, std=0.5)


@torch.inference_mode()
def exact_pair_distribution(model, prompt: list[int], temperature: float) -> torch.Tensor:
    """P(token 2 = b, token 3 = c) as a flat [VOCAB²] tensor, summing over every token 1."""
    def next_probs(ids: list[int]) -> torch.Tensor:
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), NoCacheAttention([len(ids)], model.attention_scale))
        return torch.softmax(model.compute_logits(hidden[-1:])[0] / temperature, -1)

    joint = torch.zeros(VOCAB, VOCAB)
    p1 = next_probs(prompt)
    for a in range(VOCAB):
        p2 = next_probs(prompt + [a])
        for b in range(VOCAB):
            joint[b] += p1[a] * p2[b] * next_probs(prompt + [a, b])
    return joint.flatten()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """Pearson's statistic, degrees of freedom and p-value; cells expecting fewer than 5 samples are pooled
    (the usual condition for the chi-square approximation)."""
    expected = probs.double() * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    # The chi-square survival function is the regularized upper incomplete gamma Q(df/2, x/2).
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p_value


@dataclass(slots=True)
class SamplingCheck:
    proposer: str
    temperature: float
    samples: int
    counts: torch.Tensor  # [VOCAB²] speculative samples of (token 2, token 3)
    target: torch.Tensor  # exact target distribution
    draft: torch.Tensor  # exact draft distribution (the draft model's; for prompt lookup too, as a foil)
    drafted: int
    accepted: int
    chi2: float
    df: int
    p_value: float
    p_value_vs_draft: float

    @property
    def passed(self) -> bool:
        """The samples fit the target (p above 0.1%) and do not fit the draft (p below it)."""
        return self.p_value > 1e-3 and self.p_value_vs_draft < 1e-3


def sampling_check(proposer: str = "draft model", *, temperature: float = 1.0, samples: int = 2000,
                   k: int = 2) -> SamplingCheck:
    """Sample tokens 2 and 3 ``samples`` times with speculation on, and test them against the exact target."""
    if proposer not in CHECK_PROPOSERS:
        raise ValueError(f"unknown proposer {proposer!r}: choose one of {list(CHECK_PROPOSERS)}")
    if not temperature > 0:
        raise ValueError(f"the check is about sampling: temperature must be > 0, got {temperature}")
    if not 100 <= samples <= 100_000:
        raise ValueError(f"samples must be in [100, 100000], got {samples}")
    target, draft = tiny_model(11), tiny_model(12)
    method = CHECK_PROPOSERS[proposer]
    engine = LLMEngine(target, None, cache_config=CacheConfig(num_blocks=4096, block_size=4),
                       scheduler_config=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=2048),
                       spec_config=SpecConfig(method, k), draft_model=draft if method == "draft" else None)
    params = [SamplingParams(max_tokens=3, temperature=temperature, seed=i) for i in range(samples)]
    counts = torch.zeros(VOCAB * VOCAB)
    for out in engine.generate([PROMPT] * samples, params, progress=False):
        counts[out.token_ids[1] * VOCAB + out.token_ids[2]] += 1
    want = exact_pair_distribution(target, PROMPT, temperature)
    draft_dist = exact_pair_distribution(draft, PROMPT, temperature)
    stat, df, p_value = chi_square(counts, want)
    spec = engine.metrics.spec_counters()
    return SamplingCheck(proposer, temperature, samples, counts, want, draft_dist, spec.drafted, spec.accepted,
                         stat, df, p_value, chi_square(counts, draft_dist)[2])
