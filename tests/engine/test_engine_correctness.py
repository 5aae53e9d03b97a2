"""The paged, batched engine produces exactly the tokens of the simplest loops (greedy, fp32, CPU).

Every comparison is against `workbench.generation.generate` with a contiguous cache, which is itself checked
against transformers in test_forward_vs_transformers.py. After every test, every block must be free again.
"""

from __future__ import annotations

import pytest

from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.generation import generate
from workbench.prompts import encode_prompt

PROMPTS = [
    "Write a haiku about autumn leaves.",
    "What is the capital of Japan? Answer with one sentence.",
    "List three uses of a paperclip.",
    "Explain recursion to a beginner programmer in detail, with an example.",
]
TOKENS = 16


def make_engine(model, tokenizer, *, num_blocks=256, block_size=16, prefix=True, **sched) -> LLMEngine:
    cache = CacheConfig(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=prefix)
    return LLMEngine(model, tokenizer, cache_config=cache, scheduler_config=SchedulerConfig(**sched))


@pytest.fixture
def engines():
    """Collects the engines a test makes and checks each leaked nothing once idle."""
    made: list[LLMEngine] = []
    yield made
    for engine in made:
        assert not engine.has_unfinished_requests()
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
        check_block_manager(engine.blocks)


@pytest.fixture(scope="module")
def expected(real_model, tokenizer):
    """Greedy tokens of each prompt from the contiguous-cache loop."""
    return {p: generate(real_model, tokenizer, p, SamplingParams(max_tokens=TOKENS)).token_ids for p in PROMPTS}


def run(engine, prompts, max_tokens=TOKENS, **kw):
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, **kw), progress=False)
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("prefix", [True, False])
def test_paged_batched_matches_contiguous(real_model, tokenizer, expected, engines, prefix):
    engine = make_engine(real_model, tokenizer, prefix=prefix)
    engines.append(engine)
    assert run(engine, PROMPTS) == [expected[p] for p in PROMPTS]


def test_one_at_a_time_matches_batched(real_model, tokenizer, expected, engines):
    engine = make_engine(real_model, tokenizer, max_num_seqs=1)
    engines.append(engine)
    for p in PROMPTS[:2]:
        assert run(engine, [p]) == [expected[p]]


@pytest.mark.parametrize("chunk", [5, 37])  # mid-block and past a block; 16 is the whole-block case of prefix tests
def test_chunked_prefill_matches_whole_prefill(real_model, tokenizer, expected, engines, chunk):
    engine = make_engine(real_model, tokenizer, max_prefill_chunk=chunk, max_num_batched_tokens=64, max_num_seqs=4)
    engines.append(engine)
    assert run(engine, PROMPTS) == [expected[p] for p in PROMPTS]
    assert engine.metrics.step_frame()["num_prefill_tokens"].max() <= 64


def test_whole_prefill_without_chunking(real_model, tokenizer, expected, engines):
    engine = make_engine(real_model, tokenizer, enable_chunked_prefill=False, max_num_batched_tokens=256)
    engines.append(engine)
    assert run(engine, PROMPTS) == [expected[p] for p in PROMPTS]


def test_forced_preemption_gives_the_same_tokens(real_model, tokenizer, expected, engines):
    # 4 prompts of ~40-50 tokens growing by 24 need ~20 blocks of 8; a pool of 12 forces preemptions.
    engine = make_engine(real_model, tokenizer, num_blocks=12, block_size=8)
    engines.append(engine)
    assert run(engine, PROMPTS) == [expected[p] for p in PROMPTS]
    assert engine.metrics.step_frame()["preemptions"].sum() > 0
    assert engine.metrics.request_frame()["preemptions"].sum() > 0


@pytest.mark.parametrize("prefix_len", [48, 40, 47, 16])  # block boundary, mid-block, one short, one block
def test_prefix_cache_hits_give_the_same_tokens(real_model, tokenizer, engines, prefix_len):
    shared = encode_prompt(tokenizer, "You are a meticulous assistant. " * 12, chat=False)[:prefix_len]
    tails = [encode_prompt(tokenizer, t, chat=False) for t in (" Name a colour.", " Name an animal.")]
    prompts = [shared + t for t in tails]
    want = [generate(real_model, tokenizer, p, SamplingParams(max_tokens=12)).token_ids for p in prompts]
    engine = make_engine(real_model, tokenizer)
    engines.append(engine)
    got = [run(engine, [p], max_tokens=12)[0] for p in prompts]  # second request runs after the first
    assert got == want
    common = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert common >= prefix_len
    hits = engine.metrics.request_frame()["cached_prompt_tokens"].tolist()
    assert hits == [0, (common // 16) * 16]


def test_repeated_prompt_hits_all_but_its_last_block(real_model, tokenizer, engines):
    prompt = encode_prompt(tokenizer, "Count from one to twenty in words. " * 3, chat=False)
    engine = make_engine(real_model, tokenizer)
    engines.append(engine)
    first, second = run(engine, [prompt], 8), run(engine, [prompt], 8)
    assert first == second
    assert engine.metrics.request_frame()["cached_prompt_tokens"].iloc[1] == (len(prompt) - 1) // 16 * 16


def test_n_completions_share_the_prompt_and_match_greedy(real_model, tokenizer, expected, engines):
    engine = make_engine(real_model, tokenizer)
    engines.append(engine)
    out = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=TOKENS, n=3), progress=False)[0]
    assert [o.token_ids for o in out.outputs] == [expected[PROMPTS[0]]] * 3


def test_n_sampled_completions_are_seeded_per_index(real_model, tokenizer, engines):
    engine = make_engine(real_model, tokenizer, block_size=4)  # short blocks: copy-on-write happens
    engines.append(engine)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=7, n=3, ignore_eos=True)
    a = [o.token_ids for o in engine.generate([PROMPTS[1]], params, progress=False)[0].outputs]
    b = [o.token_ids for o in engine.generate([PROMPTS[1]], params, progress=False)[0].outputs]
    assert a == b and len({tuple(x) for x in a}) == 3
    alone = SamplingParams(max_tokens=16, temperature=1.0, seed=8, ignore_eos=True)
    assert run(engine, [PROMPTS[1]], 16, temperature=1.0, seed=8, ignore_eos=True)[0] == a[1]
    assert generate(real_model, tokenizer, PROMPTS[1], alone).token_ids == a[1]


def test_stream_yields_deltas_that_add_up(real_model, tokenizer, expected, engines):
    engine = make_engine(real_model, tokenizer)
    engines.append(engine)
    tokens, text = [], ""
    for delta in engine.stream(PROMPTS[2], SamplingParams(max_tokens=TOKENS)):
        tokens += delta.outputs[0].new_token_ids
        text += delta.outputs[0].new_text
    assert tokens == expected[PROMPTS[2]] == delta.token_ids
    assert text == delta.text


def test_abort_mid_stream_frees_every_block(real_model, tokenizer, engines):
    engine = make_engine(real_model, tokenizer)
    engines.append(engine)
    other = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True))
    for i, _ in enumerate(engine.stream(PROMPTS[3], SamplingParams(max_tokens=40, ignore_eos=True))):
        if i == 3:
            break  # leaving the loop aborts the streamed request
    assert engine.blocks.num_used_blocks > 0  # the other request still holds its blocks
    engine.abort(other)
    frame = engine.metrics.request_frame()
    assert sorted(frame["finish_reason"]) == ["abort", "abort"]


def test_static_and_dynamic_batching_give_the_same_tokens(real_model, tokenizer, expected, engines):
    for mode in ("static", "dynamic"):
        engine = make_engine(real_model, tokenizer, batching=mode, max_num_seqs=2, dynamic_batch_size=2)
        engines.append(engine)
        assert run(engine, PROMPTS) == [expected[p] for p in PROMPTS]
        steps = engine.metrics.step_frame()
        assert steps["batch_size"].max() <= 2
