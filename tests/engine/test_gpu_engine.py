"""The engine on CUDA: Triton kernels in a whole model, against transformers on the same GPU and weights.

The kernel tests check each kernel alone; these check the paged, batched engine end to end on a GPU (greedy,
float32, so the tokens must be identical), with and without CUDA graphs, for every config family in a shrunken
shape, then the real model when its checkpoint is on the machine. All skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.cuda_graphs import bucket_sizes
from workbench.engine.llm_engine import LLMEngine
from workbench.models.weights import to_hf_state_dict

pytestmark = pytest.mark.gpu

SHAPES = dict(intermediate_size=512, num_layers=2, head_dim=64, vocab_size=1000, max_position_embeddings=1024)
FAMILIES = [("llama-3-8b", (8, 2)), ("qwen2.5-7b", (8, 2)), ("mistral-7b", (5, 1)), ("llama-2-7b", (4, 4)),
            ("smollm2-135m", (9, 3))]
PROMPT_LENS = [5, 17, 40, 70, 3]
NEW_TOKENS = 20


def _pair(arch: str, heads: tuple[int, int]):
    """Our model and transformers' on the same random weights, both on CUDA in float32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = workbench.model_spec(arch).replace(num_heads=heads[0], num_kv_heads=heads[1],
                                              hidden_size=64 * heads[0], **SHAPES)
    ours = workbench.random_model(spec, device="cuda", seed=3, std=0.1)
    config = AutoConfig.for_model(**spec.to_hf_config())
    theirs = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    theirs.load_state_dict({k: v.cpu() for k, v in to_hf_state_dict(ours).items()}, strict=False)
    return ours, theirs.cuda(), spec


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@torch.inference_mode()
def _hf_greedy(theirs, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' argmax token after each prefix (a plain loop: no stopping rule, no logit processors)."""
    ids = list(prompt)
    for _ in range(new_tokens):
        logits = theirs(torch.tensor([ids], device="cuda")).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def _engine(model, *, graphs: bool, max_num_seqs: int = 8, **cache) -> LLMEngine:
    return LLMEngine(model, None, cache_config=CacheConfig(num_blocks=128, block_size=16, **cache),
                     scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256),
                     cuda_graphs=graphs)


def _run(engine: LLMEngine, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    outs = engine.generate(prompts, params, progress=False, chat=False)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
    check_block_manager(engine.blocks)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("arch,heads", FAMILIES)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_engine_on_cuda_is_token_identical_to_transformers(arch, heads, graphs):
    ours, theirs, spec = _pair(arch, heads)
    prompts = _prompts(spec.vocab_size)
    expected = [_hf_greedy(theirs, p, NEW_TOKENS) for p in prompts]
    engine = _engine(ours, graphs=graphs)
    assert _run(engine, prompts) == expected
    if graphs:
        assert engine.runner.graphs is not None and engine.runner.graphs.captured_sizes, "no graph was replayed"
    else:
        assert engine.runner.graphs is None


def test_graph_buckets_pad_without_touching_real_rows():
    """3 and 5 sequences replay the 4- and 8-row graphs: padding rows must neither write KV nor change tokens."""
    ours, _, spec = _pair("llama-3-8b", (8, 2))
    prompts = _prompts(spec.vocab_size)
    eager = _run(_engine(ours, graphs=False), prompts)
    engine = _engine(ours, graphs=True)
    assert _run(engine, prompts[:3]) == eager[:3]
    assert _run(engine, prompts) == eager
    assert {4, 8} <= set(engine.runner.graphs.captured_sizes)
    assert bucket_sizes(8) == [1, 2, 4, 8]


@pytest.mark.parametrize("kv", ["fp8_e4m3", "int8"])
def test_quantized_kv_cache_graphs_match_eager(kv):
    ours, _, spec = _pair("llama-3-8b", (8, 2))
    prompts = _prompts(spec.vocab_size)
    eager = _run(_engine(ours, graphs=False, kv_cache_dtype=kv), prompts)
    assert _run(_engine(ours, graphs=True, kv_cache_dtype=kv), prompts) == eager


def test_speculative_decoding_on_cuda_keeps_greedy_tokens():
    ours, _, spec = _pair("llama-3-8b", (8, 2))
    # Repetitive prompts so that n-gram drafts get accepted sometimes.
    prompts = [(p * 4)[:60] for p in _prompts(spec.vocab_size)]
    plain = _run(_engine(ours, graphs=True), prompts, 32)
    engine = LLMEngine(ours, None, cache_config=CacheConfig(num_blocks=128, block_size=16),
                       scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
                       spec_config=SpecConfig(method="ngram", num_speculative_tokens=4))
    assert _run(engine, prompts, 32) == plain


def _bf16_model(arch: str = "smollm2-135m", heads: tuple[int, int] = (9, 3)):
    spec = workbench.model_spec(arch).replace(num_heads=heads[0], num_kv_heads=heads[1], hidden_size=64 * heads[0],
                                              **{**SHAPES, "num_layers": 4})
    return workbench.random_model(spec, device="cuda", dtype=torch.bfloat16, seed=3, std=0.1), spec


@torch.inference_mode()
def test_fused_layer_ops_are_as_accurate_as_the_plain_layers_in_bfloat16():
    """Fused and plain bf16 layers round at different places (the fused kernels round less), so neither is the
    other's bits; both are held against the same weights in float32: the fused path's error must be no larger."""
    import copy

    from workbench.models.attention import NoCacheAttention

    spec = workbench.model_spec("smollm2-135m").replace(num_heads=9, num_kv_heads=3, hidden_size=576,
                                                        **{**SHAPES, "num_layers": 4})
    exact = workbench.random_model(spec, device="cuda", dtype=torch.float32, seed=3, std=0.05)
    model = copy.deepcopy(exact).to(torch.bfloat16)
    ids = torch.randint(0, spec.vocab_size, (70,), generator=torch.Generator().manual_seed(0)).cuda()
    positions = torch.cat([torch.arange(40), torch.arange(30)]).cuda()
    attention = NoCacheAttention([40, 30], model.attention_scale)
    reference = exact.compute_logits(exact(ids, positions, attention))
    errors, agree = {}, {}
    for fused in (False, True):
        model.fused_layer_ops = fused
        logits = model.compute_logits(model(ids, positions, attention))
        errors[fused] = float((logits - reference).abs().max())
        agree[fused] = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
    scale = float(reference.abs().max())
    assert errors[True] <= 1.25 * errors[False] + 1e-3 * scale, (errors, scale)
    assert agree[True] >= agree[False] - 0.03, agree


def test_a_graphed_decode_step_waits_for_the_device_only_for_its_tokens():
    """Between replays the host builds the next batch in pinned memory and copies it without waiting; the one
    synchronising call per step is reading the sampled tokens back (torch's sync debug mode counts them)."""
    import warnings

    model, spec = _bf16_model()
    engine = _engine(model, graphs=True)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in _prompts(spec.vocab_size):
        engine.add_request(prompt, params, chat=False)
    for _ in range(12):  # prefill, then a few decode steps (the graph is captured on the first)
        engine.step()
    steps = 6
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                assert engine.step(), "the engine ran out of work"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= steps, syncs
    assert engine.runner.graphs.captured_sizes == [8]


def test_multi_step_groups_replay_the_graph_and_give_the_same_tokens():
    """num_scheduler_steps: the graph is replayed once per step of a group, each step fed the previous step's
    tokens on the device; the tokens equal one step at a time, and a group reads tokens back once."""
    import warnings

    ours, _, spec = _pair("llama-3-8b", (8, 2))
    prompts = _prompts(spec.vocab_size)
    expected = _run(_engine(ours, graphs=True), prompts, 33)
    engine = LLMEngine(ours, None, cache_config=CacheConfig(num_blocks=128, block_size=16),
                       scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                                        num_scheduler_steps=8))
    assert _run(engine, prompts, 33) == expected
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params, chat=False)
    engine.step()  # the prefill: a group needs every sequence decoding
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    frame = engine.metrics.step_frame()
    assert int(frame["num_decode_tokens"].iloc[-1]) == 8 * len(prompts)
    assert len([w for w in caught if "synchroniz" in str(w.message)]) <= 1


@pytest.fixture(scope="module")
def real_cuda():
    from workbench.models.registry import checkpoint_dir

    if not (checkpoint_dir() / "config.json").is_file():
        pytest.skip("the real checkpoint is not on this machine (`workbench fetch`)")
    model, tokenizer = workbench.load_model(device="cuda", dtype=torch.float32)
    reference = workbench.load_reference_model(device="cuda", dtype=torch.float32)
    return model, tokenizer, reference


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_real_model_on_cuda_is_token_identical_to_transformers(real_cuda, graphs):
    from workbench.data import load_prompts
    from workbench.prompts import encode_prompt

    model, tokenizer, reference = real_cuda
    prompts = [encode_prompt(tokenizer, p, chat=True) for p in load_prompts("draft_heldout")[:6]]
    expected = [_hf_greedy(reference, p, 48) for p in prompts]
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=256, block_size=16),
                       cuda_graphs=graphs)
    assert _run(engine, prompts, 48) == expected
