"""Speculative decoding: exact greedy outputs, an unchanged sampling distribution, honest statistics."""

from __future__ import annotations

import pytest
import torch
from chi_square import chi2, chi2_critical
from tiny_models import tiny_model

import workbench
from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.generation import generate
from workbench.spec.draft_head import build_draft
from workbench.spec.ngram import propose_ngram
from workbench.spec.stats import SpecCounters, expected_draft_acceptance, expected_tokens_per_pass
from workbench.spec.verify import verify_greedy, verify_sampled

PROMPTS = ["Repeat exactly: the cat sat on the mat, the cat sat on the mat, the dog sat on the log.",
           "Write a haiku about autumn.", "List three uses of a paperclip.",
           "Copy this list: apples, pears, plums, apples, pears, plums, figs."]


# ------------------------------------------------------------------------------------------------- units
def test_verify_greedy_accepts_the_matching_prefix():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([3, 5, 7, 9]):
        logits[row, best] = 1.0
    assert verify_greedy([3, 5, 1], logits) == (2, [3, 5, 7])
    assert verify_greedy([3, 5, 7], logits) == (3, [3, 5, 7, 9])
    assert verify_greedy([4], logits[:2]) == (0, [3])


def test_rejection_sampling_preserves_the_target_distribution():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05, 0.0], [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([0.05, 0.05, 0.1, 0.2, 0.3, 0.3])  # a bad draft: mass where p has little
    n = 20000
    first, broken = torch.zeros(6), torch.zeros(6)
    for _ in range(n):
        draft = int(torch.multinomial(q, 1, generator=gen))
        accepted, emitted = verify_sampled([draft], q[None], p, gen)
        first[emitted[0]] += 1
        broken[draft] += 1  # what "always accept" would emit
    stat, df = chi2(first, p[0])
    assert stat < chi2_critical(df), (first / n, p[0])
    bad_stat, bad_df = chi2(broken, p[0])
    assert bad_stat > chi2_critical(bad_df)  # the test has the power to see a wrong rule


def test_deterministic_proposals_also_preserve_it():
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]])
    counts = torch.zeros(4)
    for _ in range(8000):
        counts[verify_sampled([2], None, p, gen)[1][0]] += 1
    stat, df = chi2(counts, p[0])
    assert stat < chi2_critical(df)


def test_ngram_proposer_takes_the_longest_latest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3]
    assert propose_ngram(tokens, 2) == [4, 5]  # the trigram [1, 2, 3] last continued with 4, 5
    assert propose_ngram([7, 8, 9], 3) == []
    assert propose_ngram(tokens, 0) == []
    assert propose_ngram([5, 6, 5], 3, ngram_min=1) == [6, 5]


def test_theory_and_counters():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    counters = SpecCounters()
    counters.record(4, 2, 3)
    counters.record(2, 2, 3)
    assert counters.acceptance_rate == pytest.approx(4 / 6)
    assert counters.alpha == pytest.approx(4 / 5)  # the 4th draft of the first pass was never tested
    table = counters.per_position()
    assert table["acceptance_rate"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert table["tested"].tolist() == [2, 2, 1, 0] and table["alpha"].tolist()[:3] == [1.0, 1.0, 0.0]
    assert counters.tokens_per_pass == 3.0
    merged = SpecCounters()
    merged.merge(counters)
    merged.merge(counters)
    assert merged.tested_at == [4, 4, 2, 0] and merged.alpha == counters.alpha
    with pytest.raises(ValueError):
        counters.record(2, 3, 4)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.8])
def test_alpha_estimate_recovers_independent_acceptance(alpha):
    """Simulated verifications where each draft passes with probability alpha independently: accepted / tested
    finds alpha again, and the formula at it predicts the measured tokens per pass; accepted / drafted does
    neither (it also counts the drafts after a rejection, which are never tested)."""
    gen, k, counters = torch.Generator().manual_seed(0), 4, SpecCounters()
    for _ in range(20_000):
        passes = (torch.rand(k, generator=gen) < alpha).long()
        accepted = int(passes.cumprod(0).sum())
        counters.record(k, accepted, accepted + 1)
    assert counters.alpha == pytest.approx(alpha, abs=0.01)
    assert counters.summary(k)["tokens_per_pass_theory"] == pytest.approx(counters.tokens_per_pass, rel=0.02)
    assert counters.acceptance_rate == pytest.approx(expected_draft_acceptance(alpha, k), abs=0.01)
    assert counters.acceptance_rate < alpha - 0.1


# ---------------------------------------------------------------------------------------- engine, greedy
@pytest.fixture(scope="module")
def expected(real_model, tokenizer):
    return [generate(real_model, tokenizer, p, SamplingParams(max_tokens=32)).token_ids for p in PROMPTS]


def spec_engine(model, tokenizer, spec, draft=None, **sched):
    sched = {"max_prefill_chunk": 16, "max_num_batched_tokens": 96, **sched}  # chunked prefill in play
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=256), spec_config=spec,
                     scheduler_config=SchedulerConfig(**sched), draft_model=draft)


def check_idle(engine):
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
    check_block_manager(engine.blocks)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("batch", [1, 4])
def test_ngram_speculation_is_token_identical(real_model, tokenizer, expected, k, batch):
    engine = spec_engine(real_model, tokenizer, SpecConfig("ngram", k))
    out = engine.generate(PROMPTS[:batch], SamplingParams(max_tokens=32), progress=False)
    assert [o.token_ids for o in out] == expected[:batch]
    assert engine.metrics.spec_counters().accepted > 0
    check_idle(engine)


def test_target_as_its_own_draft_accepts_everything(real_model, tokenizer, expected):
    engine = spec_engine(real_model, tokenizer, SpecConfig("draft", 4), draft=real_model)
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=32), progress=False)
    assert [o.token_ids for o in out] == expected
    assert engine.metrics.spec_counters().acceptance_rate == 1.0
    check_idle(engine)


def test_a_poor_draft_changes_nothing_but_speed(real_model, tokenizer, expected):
    draft = workbench.random_model(real_model.spec.replace(num_layers=1), device="cpu", seed=5)
    engine = spec_engine(real_model, tokenizer, SpecConfig("draft", 3), draft=draft)
    out = engine.generate(PROMPTS[:3], SamplingParams(max_tokens=32), progress=False)
    assert [o.token_ids for o in out] == expected[:3]
    check_idle(engine)


def test_the_trained_head_keeps_drafting_on_a_repeated_prompt(real_model, tokenizer, expected):
    """The second run of a greedy request fills blocks the first one cached, so the block manager swaps them in
    and the head must catch up from the swapped block's start: it used to lack the features there and stopped
    drafting for the rest of the request (20 of 48 steps drafted nothing)."""
    from workbench.spec.draft_head import load_draft

    engine = spec_engine(real_model, tokenizer, SpecConfig("draft", 4), draft=load_draft(real_model))
    first = engine.generate(PROMPTS[1:2], SamplingParams(max_tokens=32), progress=False)[0].token_ids
    engine.metrics.reset()
    again = engine.generate(PROMPTS[1:2], SamplingParams(max_tokens=32), progress=False)[0].token_ids
    assert first == again == expected[1]
    steps = engine.metrics.step_frame()
    decodes = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_seqs"] > 0)]
    assert (decodes["num_drafted_tokens"] == 0).sum() <= 1  # only a last step with one token left may skip
    check_idle(engine)


def test_k_per_request(real_model, tokenizer, expected):
    engine = spec_engine(real_model, tokenizer, SpecConfig("ngram", 4))
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=32), num_speculative_tokens=0, request_id="off")
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=32), num_speculative_tokens=2, request_id="two")
    while engine.has_unfinished_requests():
        engine.step()
    frame = engine.metrics.request_frame().set_index("request_id")
    assert frame.loc["off", "drafted_tokens"] == 0 and frame.loc["two", "drafted_tokens"] > 0
    two = next(s for s in engine.metrics.finished if s.request_id == "two")
    assert len(two.spec.drafted_at) <= 2
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        engine.add_request("hi", num_speculative_tokens=17)
    plain = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=16))
    with pytest.raises(ValueError, match="speculative decoding is off"):
        plain.add_request("hi", num_speculative_tokens=2)
    check_idle(engine)


def test_speculation_with_preemption_and_stops(real_model, tokenizer, expected):
    engine = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=14, block_size=8),
                       spec_config=SpecConfig("ngram", 4))
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=32), progress=False)
    assert [o.token_ids for o in out] == expected
    assert engine.metrics.step_frame()["preemptions"].sum() > 0
    check_idle(engine)


def test_bad_spec_config():
    with pytest.raises(ValueError, match="method"):
        SpecConfig("medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpecConfig("ngram", 0)
    with pytest.raises(ValueError, match="ngram_min"):
        SpecConfig("ngram", 2, ngram_min=3, ngram_max=2)


# -------------------------------------------------------------------------------------- engine, sampled
def tiny(seed: int):
    """A 6-token vocabulary, so that the distribution of generated pairs can be enumerated exactly."""
    return tiny_model(seed=seed, std=0.5, vocab_size=6, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)


def exact_pairs(model, prompt: list[int], temperature: float) -> torch.Tensor:
    """Exact distribution of the 2nd and 3rd generated tokens, by enumerating the first two."""
    from workbench.models.attention import NoCacheAttention

    def next_probs(ids):
        ids_t = torch.tensor(ids)
        hidden = model(ids_t, torch.arange(len(ids)), NoCacheAttention([len(ids)], model.attention_scale))
        return torch.softmax(model.compute_logits(hidden[-1:])[0] / temperature, -1)

    v = model.spec.vocab_size
    joint = torch.zeros(v, v)
    with torch.inference_mode():
        p1 = next_probs(prompt)
        for a in range(v):
            p2 = next_probs(prompt + [a])
            for b in range(v):
                joint[b] += p1[a] * p2[b] * next_probs(prompt + [a, b])
    return joint  # joint[b, c] = P(token 2 = b, token 3 = c)


@pytest.mark.slow
def test_speculative_sampling_keeps_the_target_distribution_in_the_engine():
    target, draft = tiny(11), tiny(12)
    prompt, temperature, n = [1, 2, 3, 4], 1.0, 3000
    want = exact_pairs(target, prompt, temperature).flatten()

    def sample(spec, draft_model=draft):
        engine = LLMEngine(target, None, cache_config=CacheConfig(num_blocks=512, block_size=4),
                           scheduler_config=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512),
                           spec_config=spec, draft_model=draft_model if spec else None)
        params = [SamplingParams(max_tokens=3, temperature=temperature, seed=i) for i in range(n)]
        out = engine.generate([prompt] * n, params, progress=False)
        counts = torch.zeros(36)
        for o in out:
            counts[o.token_ids[1] * 6 + o.token_ids[2]] += 1
        return counts, engine

    # An EAGLE head that cannot name token 5 (a reduced draft vocabulary): q = 0 there, so every 5 comes from the
    # residual distribution, and the output must still be the target's.
    head = build_draft(target, "eagle", 1, vocab=torch.tensor([0, 1, 2, 3, 4]))
    with torch.no_grad():
        for name, param in head.named_parameters():
            param.copy_(torch.ones_like(param) if "norm" in name else torch.randn_like(param) * 0.5)
    head.eval().requires_grad_(False).prepare()
    for spec, draft_model in ((SpecConfig("draft", 2), draft), (SpecConfig("ngram", 2), None),
                              (SpecConfig("draft", 2), head)):
        counts, engine = sample(spec, draft_model)
        assert engine.metrics.spec_counters().drafted > 0
        stat, df = chi2(counts, want)
        assert stat < chi2_critical(df), (spec.method, type(draft_model).__name__, stat, df)
    # Power check: the draft's own distribution is far from the target's and must be rejected.
    draft_pairs = exact_pairs(draft, prompt, temperature).flatten()
    stat, df = chi2(draft_pairs * n, want)
    assert stat > chi2_critical(df)
