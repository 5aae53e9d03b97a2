"""Token trees in the engine: greedy tree decoding emits exactly the plain greedy tokens (transformers on every
config family, the real model with its trained draft), the accepted path's KV is moved into place and no block
leaks, and sampling through trees keeps the target's distribution."""

from __future__ import annotations

import pytest
import torch
from chi_square import chi2, chi2_critical
from test_spec import PROMPTS, exact_pairs, tiny

import workbench
from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.generation import generate
from workbench.models.weights import to_hf_state_dict
from workbench.spec.draft_head import load_draft

SHAPES = dict(intermediate_size=160, num_layers=2, head_dim=16, vocab_size=300, max_position_embeddings=256)
FAMILIES = [("llama-3-8b", (8, 2)), ("qwen2.5-7b", (8, 2)), ("mistral-7b", (5, 1)), ("llama-2-7b", (3, 3)),
            ("smollm2-135m", (9, 3))]
NEW_TOKENS = 20


class SwappedDraft(torch.nn.Module):
    """The target as its own draft, with its first and second choices swapped: the target's token is always the
    draft's rank-1 candidate, so every accepted path runs through second children and its KV must be moved."""

    needs_target_features = False

    def __init__(self, target):
        super().__init__()
        self.target, self.spec, self.attention_scale = target, target.spec, target.attention_scale

    def forward(self, input_ids, positions, attention):
        return self.target(input_ids, positions, attention)

    def compute_logits(self, hidden):
        logits = self.target.compute_logits(hidden).clone()
        top = logits.topk(2, -1).indices
        rows = torch.arange(len(logits))
        first, second = logits[rows, top[:, 0]].clone(), logits[rows, top[:, 1]].clone()
        logits[rows, top[:, 0]], logits[rows, top[:, 1]] = second, first
        return logits


def check_idle(engine):
    assert not engine.has_unfinished_requests()
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
    check_block_manager(engine.blocks)


def tree_engine(target, spec, draft=None, *, num_blocks=128, block_size=4, **sched):
    sched = {"max_prefill_chunk": 16, "max_num_batched_tokens": 96, **sched}  # chunked prefill beside the trees
    return LLMEngine(target, None, cache_config=CacheConfig(num_blocks=num_blocks, block_size=block_size),
                     spec_config=spec, draft_model=draft, scheduler_config=SchedulerConfig(**sched))


def run(engine, prompts, new_tokens=NEW_TOKENS):
    outs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True), progress=False, chat=False)
    check_idle(engine)
    return [o.token_ids for o in outs]


def family(arch, heads):
    """Our model and transformers' on the same random weights (fp32, CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = workbench.model_spec(arch).replace(num_heads=heads[0], num_kv_heads=heads[1], hidden_size=16 * heads[0],
                                              **SHAPES)
    ours = workbench.random_model(spec, device="cpu", seed=3, std=0.3)
    theirs = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec.to_hf_config()), dtype=torch.float32)
    theirs.load_state_dict(to_hf_state_dict(ours), strict=False)
    return ours, theirs.eval()


@torch.inference_mode()
def hf_greedy(theirs, prompt, new_tokens=NEW_TOKENS):
    ids = list(prompt)
    for _ in range(new_tokens):
        ids.append(int(theirs(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def prompts_for(vocab, lens=(5, 17, 40, 3)):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lens]


# ----------------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize(("arch", "heads"), FAMILIES)
def test_greedy_trees_match_transformers_for_every_family(arch, heads, one_torch_thread):
    ours, theirs = family(arch, heads)
    prompts = prompts_for(ours.spec.vocab_size)
    expected = [hf_greedy(theirs, p) for p in prompts]
    swapped = tree_engine(ours, SpecConfig("draft", tree_branching=(2, 2, 2)), SwappedDraft(ours))
    assert run(swapped, prompts) == expected
    counters = swapped.metrics.spec_counters()
    # The target's token is always the draft's second: every pass keeps rank 1 at each depth, moving its KV.
    assert counters.accepted_rank_at[0][1] > 0 and sum(r[0] for r in counters.accepted_rank_at if r) == 0
    assert counters.tokens_per_pass > 3
    per_depth = counters.per_position()  # what the vLLM metric counts per position: here per depth
    assert per_depth["position"].tolist() == [1, 2, 3] and per_depth["drafted"].iloc[0] == 2 * counters.passes
    # (deeper levels are cut when fewer tokens remain than the tree is deep)
    assert 0 < per_depth["drafted"].iloc[2] <= 2 * per_depth["drafted"].iloc[1] <= 4 * per_depth["drafted"].iloc[0]
    assert (per_depth["accepted"] == per_depth["tested"]).all() and per_depth["accepted"].iloc[2] > 0
    dynamic = tree_engine(ours, SpecConfig("draft", 4, tree_budget=10, tree_top_k=3), SwappedDraft(ours))
    assert run(dynamic, prompts) == expected
    assert dynamic.metrics.spec_counters().accepted > 0


def test_greedy_prompt_lookup_trees_and_a_poor_draft(one_torch_thread):
    ours, theirs = family("llama-3-8b", (8, 2))
    # Repetitive prompts, so that several earlier continuations compete as branches (a random model's own
    # text rarely repeats: the real-model test below sees prompt lookup accepted).
    prompts = [(p * 4)[:50] for p in prompts_for(ours.spec.vocab_size)]
    expected = [hf_greedy(theirs, p) for p in prompts]
    ngram = tree_engine(ours, SpecConfig("ngram", 4, tree_budget=8, tree_top_k=3))
    assert run(ngram, prompts) == expected
    assert any(path[-1] > 0 for path in ngram.metrics.spec_counters().node_paths), "no second branch drafted"
    poor = workbench.random_model(ours.spec.replace(num_layers=1), device="cpu", seed=9, std=0.3)
    static = tree_engine(ours, SpecConfig("draft", tree_branching=(3, 2, 1)), poor)
    assert run(static, prompts) == expected


def test_trees_under_preemption_and_a_per_request_depth(one_torch_thread):
    ours, _ = family("mistral-7b", (5, 1))
    prompts = prompts_for(ours.spec.vocab_size, (30, 41, 25, 37))
    plain = run(tree_engine(ours, None, num_blocks=256), prompts, 24)
    # 4 sequences of ~60 tokens need ~60 blocks of 4, plus 14 slots each per tree pass: 40 blocks preempt.
    engine = tree_engine(ours, SpecConfig("draft", tree_branching=(2, 2, 2)), SwappedDraft(ours), num_blocks=40)
    assert run(engine, prompts, 24) == plain
    assert engine.metrics.step_frame()["preemptions"].sum() > 0
    engine = tree_engine(ours, SpecConfig("draft", tree_branching=(2, 2, 2)), SwappedDraft(ours))
    engine.add_request(prompts[0], SamplingParams(max_tokens=24, ignore_eos=True), num_speculative_tokens=1,
                       request_id="one", chat=False)
    engine.add_request(prompts[1], SamplingParams(max_tokens=24, ignore_eos=True), num_speculative_tokens=0,
                       request_id="off", chat=False)
    while engine.has_unfinished_requests():
        engine.step()
    done = {s.request_id: s for s in engine.metrics.finished}
    assert len(done["one"].spec.drafted_at) == 1 and done["off"].spec.passes == 0
    assert [done["one"].output_ids, done["off"].output_ids] == plain[:2]
    check_idle(engine)


def test_batch_invariant_mode_refuses_trees():
    with pytest.raises(ValueError, match="batch-invariant mode attends without a tree mask"):
        LLMEngine(tiny(1), None, cache_config=CacheConfig(num_blocks=16), batch_invariant=True,
                  spec_config=SpecConfig("ngram", 2, tree_budget=4))


@pytest.fixture(scope="module")
def expected(real_model, tokenizer):
    return [generate(real_model, tokenizer, p, SamplingParams(max_tokens=32)).token_ids for p in PROMPTS[:3]]


def test_real_model_with_its_trained_draft_head(real_model, tokenizer, expected):
    head = load_draft(real_model)
    for spec in (SpecConfig("draft", tree_branching=(3, 2, 1)), SpecConfig("draft", 4, tree_budget=12),
                 SpecConfig("ngram", 4, tree_budget=8)):
        engine = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=256), spec_config=spec,
                           draft_model=head if spec.method == "draft" else None,
                           scheduler_config=SchedulerConfig(max_prefill_chunk=16, max_num_batched_tokens=96))
        out = engine.generate(PROMPTS[:3], SamplingParams(max_tokens=32), progress=False)
        assert [o.token_ids for o in out] == expected
        counters = engine.metrics.spec_counters()
        assert counters.accepted > 0
        if spec.method == "draft":
            assert sum(row[1] for row in counters.accepted_rank_at if len(row) > 1) > 0, "no second candidate kept"
        check_idle(engine)


# ---------------------------------------------------------------------------------------------- sampled
@pytest.mark.slow
def test_sampling_through_trees_keeps_the_target_distribution_in_the_engine():
    """As test_spec's chain check: the 2nd and 3rd generated tokens, 2500 requests, against the exact joint."""
    target, draft = tiny(11), tiny(12)
    prompt, n = [1, 2, 3, 4], 2500
    want = exact_pairs(target, prompt, 1.0).flatten()
    for spec in (SpecConfig("draft", tree_branching=(3, 2)),  # sampled siblings: rejection against q
                 SpecConfig("draft", 2, tree_budget=5, tree_top_k=2),  # deterministic top-k siblings
                 SpecConfig("ngram", 2, tree_budget=4)):
        engine = LLMEngine(target, None, cache_config=CacheConfig(num_blocks=1024, block_size=4),
                           scheduler_config=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024),
                           spec_config=spec, draft_model=draft if spec.method == "draft" else None)
        params = [SamplingParams(max_tokens=3, temperature=1.0, seed=i) for i in range(n)]
        out = engine.generate([prompt] * n, params, progress=False)
        counts = torch.zeros(36)
        for o in out:
            counts[o.token_ids[1] * 6 + o.token_ids[2]] += 1
        assert engine.metrics.spec_counters().accepted > 0
        stat, df = chi2(counts, want)
        assert stat < chi2_critical(df), (spec, stat, df)
        check_idle(engine)


def test_chain_and_trees_compared_at_the_same_budget(one_torch_thread):
    """`compare_layouts` (chapter 7 and bench_spec_decode): equal positions per pass, the greedy output checked
    against plain decoding, and the measured yield beside the per-depth, per-rank model's."""
    from workbench.spec_experiments.tree_compare import compare_layouts, layouts_at_budget

    ours, _ = family("qwen2.5-7b", (8, 2))
    draft = SwappedDraft(ours)

    def make_engine(spec):
        return LLMEngine(ours, None, spec_config=spec, draft_model=draft if spec else None,
                         cache_config=CacheConfig(num_blocks=64, block_size=8),
                         scheduler_config=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256))

    frame = compare_layouts(make_engine, prompts_for(ours.spec.vocab_size, (9, 20)), layouts_at_budget(4),
                            max_tokens=16).set_index("layout")
    assert frame["positions"].tolist() == [1, 5, 5, 5] and frame.attrs["probe"] == "static (2, 1)"
    # The draft's first choice is always wrong and its second always right: a chain never gets past depth 1,
    # the static tree keeps its second root candidate and then fails (2 tokens a pass), the model agrees.
    assert frame.loc["chain K=4", "tokens_per_pass"] == 1.0
    assert frame.loc["static (2, 1)", ["tokens_per_pass", "expected_tokens"]].tolist() == [2.0, 2.0]
    assert frame.loc["chain K=4", "expected_from_probe"] == 1.0  # the probe never saw rank 0 accepted
    assert (frame["r"].iloc[1:] > 0).all() and (frame["decode_tokens_per_s"] > 0).all()
