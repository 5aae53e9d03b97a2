"""The engine with sliding-window layers beside full-attention ones (KV groups over one pool): greedy tokens equal a
dense forward with the same window masks and transformers' Qwen2 with the same layer_types, through chunked prefill,
batching, prefix-cache hits, preemption and forks; a window lets the engine serve sequences its pool could not hold
with full attention everywhere."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import workbench
from workbench.cache.grouped_attention import WindowedDenseAttention
from workbench.cache.kv_groups import KVGroupLayout
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models.weights import to_hf_state_dict

WINDOW, MAX_TOKENS = 8, 16
TYPES = tuple("full_attention" if i % 3 == 2 else "sliding_attention" for i in range(6))


@pytest.fixture(scope="module")
def model():
    """Qwen2-shaped (q/k/v biases), GQA 4:1, two windowed layers for every full one, random weights."""
    spec = workbench.model_spec("qwen2.5-7b").replace(
        num_heads=8, num_kv_heads=2, hidden_size=128, intermediate_size=160, num_layers=6, head_dim=16,
        vocab_size=300, max_position_embeddings=512, sliding_window=WINDOW, layer_types=TYPES)
    return workbench.random_model(spec, device="cpu", seed=3, std=0.1).prepare(pack=False)


@torch.inference_mode()
def reference_greedy(model, prompt: list[int], n: int = MAX_TOKENS, windows=None) -> list[int]:
    ids = list(prompt)
    backend = WindowedDenseAttention(windows or model.spec.layer_windows, model.attention_scale)
    for _ in range(n):
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), backend)
        ids.append(int(model.compute_logits(hidden[-1:]).argmax()))
    return ids[len(prompt):]


def prompts(*lengths: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in lengths]


def engine(model, *, num_blocks=200, budget=16, max_seqs=4, caching=True, kv="auto") -> LLMEngine:
    return LLMEngine(model, cache_config=CacheConfig(block_size=4, num_blocks=num_blocks, kv_cache_dtype=kv,
                                                     enable_prefix_caching=caching),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs))


def greedy(eng: LLMEngine, batch: list[list[int]], **params) -> list[list[int]]:
    outs = eng.generate(batch, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, **params), progress=False)
    return [o.outputs[0].token_ids for o in outs]


def test_layout_groups_layers_as_vllm_does(model):
    layout = KVGroupLayout.of(model.spec)
    assert [(g.window, g.layers) for g in layout.groups] == [(8, (0, 1)), (8, (3, 4)), (None, (2, 5))]
    smol = workbench.model_spec("smollm2-135m")
    what_if = smol.replace(sliding_window=512, layer_types=tuple(
        "full_attention" if i % 6 == 5 else "sliding_attention" for i in range(30)))
    groups = KVGroupLayout.of(what_if).groups
    assert len(groups) == 6 and {len(g.layers) for g in groups} == {5} and sum(not g.is_sliding for g in groups) == 1


@torch.inference_mode()
def test_greedy_tokens_equal_the_windowed_reference_and_transformers(model):
    batch = prompts(5, 23, 40)
    want = [reference_greedy(model, p) for p in batch]
    eng = engine(model)
    assert greedy(eng, batch) == want
    assert eng.blocks.num_slid_blocks > 0, "40 + 16 tokens should slide past an 8-token window"
    assert want != [reference_greedy(model, p, windows=(None,) * 6) for p in batch], "the window must matter here"
    config = AutoConfig.for_model(**model.spec.to_hf_config())
    theirs = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    theirs.load_state_dict(to_hf_state_dict(model), strict=False)
    assert config.layer_types == list(TYPES) and config.sliding_window == WINDOW
    for prompt, expected in zip(batch, want, strict=True):
        ids = list(prompt)
        for _ in range(MAX_TOKENS):
            ids.append(int(theirs(torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(prompt):] == expected


@torch.inference_mode()
def test_prefix_hits_preemption_forks_and_int8_keep_the_tokens(model):
    shared = prompts(30, seed=1)[0]
    batch = [shared + tail for tail in prompts(3, 9, 14, seed=2)]
    want = [reference_greedy(model, p) for p in batch]
    eng = engine(model)
    assert greedy(eng, batch[:1]) == want[:1]
    assert greedy(eng, batch[1:]) == want[1:]
    assert eng.blocks.stats.hit_tokens >= 2 * 28, "the later prompts reuse the first one's 28 cached tokens"
    short = prompts(10, 11, 12, seed=3)  # admitted at 9 blocks each, they grow to 13: someone is preempted
    tight = engine(model, num_blocks=24, max_seqs=3, caching=False)
    assert greedy(tight, short) == [reference_greedy(model, p) for p in short]
    assert sum(r.preemptions for r in tight.metrics.steps) > 0
    forked = engine(model).generate([batch[0]], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=2),
                                    progress=False)[0]
    assert [c.token_ids for c in forked.outputs] == [want[0], want[0]]
    int8 = greedy(engine(model, kv="int8"), batch[:1])[0]
    assert sum(a == b for a, b in zip(int8, want[0], strict=True)) >= MAX_TOKENS // 2


@torch.inference_mode()
def test_a_window_lets_a_small_pool_serve_a_long_sequence(model):
    """A block here holds 4 tokens of one group's two layers. A 56-token sequence with full attention in all six
    layers holds 14 blocks in each of three groups: 42 blocks, more than a pool of 30. With the windows, each
    windowed group holds at most ceil((8 - 1 + 16) / 4) + 1 = 7 blocks: 7 + 7 + 14 = 28 fit."""
    prompt = prompts(40)[0]
    eng = engine(model, num_blocks=30)
    assert eng.limits.blocks_for(56) == 7 + 7 + 14
    assert eng.blocks.group_demand(56) == [7, 7, 14]
    assert greedy(eng, [prompt]) == [reference_greedy(model, prompt)]
    assert eng.blocks.num_free_blocks == 30
    everywhere = model.spec.replace(layer_types=("full_attention",) * 6)  # one group: blocks of all six layers
    assert KVGroupLayout.of(everywhere).blocks_needed(56, 4, 16) * 6 == 42 * 2 > 30 * 2


def test_what_the_grouped_path_refuses(model):
    with pytest.raises(ValueError, match="fp8_e4m3"):
        engine(model, kv="fp8_e4m3")
    with pytest.raises(ValueError, match="speculative"):
        LLMEngine(model, cache_config=CacheConfig(num_blocks=64), spec_config=SpecConfig(method="ngram"))
    with pytest.raises(ValueError, match="batch_invariant"):
        LLMEngine(model, cache_config=CacheConfig(num_blocks=64), batch_invariant=True)
