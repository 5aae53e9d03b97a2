"""Multi-step decoding (SchedulerConfig.num_scheduler_steps): several greedy decode steps per engine step, each
step's tokens fed to the next on the device, the host reading them once per group.

It must change nothing but when the host learns the tokens: the same greedy tokens as one step at a time
(fp32, CPU), stops and length limits inside a group honoured exactly, blocks all returned, and groups only when
every running sequence can take them.
"""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LENGTHS = (5, 17, 33, 9, 40, 12)


@pytest.fixture(scope="module")
def model():
    spec = workbench.model_spec("smollm2-135m").replace(num_layers=2, hidden_size=96, intermediate_size=192,
                                                        num_heads=3, num_kv_heads=1, vocab_size=400)
    return workbench.random_model(spec, device="cpu", seed=5, std=0.1)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in LENGTHS]


def _engine(model, steps: int, num_blocks: int = 128, max_num_seqs: int = 8) -> LLMEngine:
    return LLMEngine(model, None, cache_config=CacheConfig(num_blocks=num_blocks, block_size=8),
                     scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256,
                                                      num_scheduler_steps=steps))


def _run(engine: LLMEngine, prompts, params) -> list:
    outs = engine.generate(prompts, params, progress=False, chat=False)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
    check_block_manager(engine.blocks)
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]


def _grouped_steps(engine: LLMEngine) -> int:
    """Engine steps that decoded more tokens than they had decoding sequences (a multi-step group)."""
    frame = engine.metrics.step_frame()
    return int((frame["num_decode_tokens"] > frame["num_decode_seqs"]).sum())


@pytest.mark.parametrize("steps", [4, 8])
def test_groups_of_steps_give_the_tokens_of_one_step_at_a_time(model, steps):
    prompts = _prompts(model.spec.vocab_size)
    params = SamplingParams(max_tokens=23, ignore_eos=True)  # 23: the last group of each is cut short
    expected = _run(_engine(model, 1), prompts, params)
    engine = _engine(model, steps)
    assert _run(engine, prompts, params) == expected
    assert _grouped_steps(engine) > 0, "no multi-step group ran"
    assert len(engine.metrics.step_frame()) < 23, "a group should replace several engine steps"


def test_a_stop_token_inside_a_group_ends_the_sequence_there(model):
    prompts = _prompts(model.spec.vocab_size)
    plain = _run(_engine(model, 1), prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    # stop each request on the token it produced 6th (inside the second group of 4): its output ends there
    params = [SamplingParams(max_tokens=30, stop_token_ids=(tokens[5],)) for tokens, _ in plain]
    expected = _run(_engine(model, 1), prompts, params)
    assert all(reason == "stop" for _, reason in expected)
    assert _run(_engine(model, 4), prompts, params) == expected


def test_requests_arriving_while_others_decode_join_between_groups(model):
    prompts = _prompts(model.spec.vocab_size)
    params = SamplingParams(max_tokens=20, ignore_eos=True)

    def staggered(engine: LLMEngine) -> list[list[int]]:
        ids = [engine.add_request(p, params, chat=False) for p in prompts[:3]]
        requests = {rid: engine.requests[rid] for rid in ids}
        for step in range(200):
            if step == 3:  # the rest arrive once the first have been decoding a while
                for p in prompts[3:]:
                    rid = engine.add_request(p, params, chat=False)
                    requests[rid] = engine.requests[rid]
            if all(r.finished for r in requests.values()):
                break
            engine.step()
        return [list(r.seqs[0].output_ids) for r in requests.values()]

    assert staggered(_engine(model, 4)) == staggered(_engine(model, 1))


def test_no_group_runs_while_a_sampled_request_is_decoding(model):
    prompts = _prompts(model.spec.vocab_size)
    engine = _engine(model, 4)
    params = [SamplingParams(max_tokens=10, ignore_eos=True)] * 5 + [
        SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8, seed=1)]
    engine.generate(prompts, params, progress=False, chat=False)
    assert _grouped_steps(engine) == 0


def test_a_pool_too_small_for_the_groups_still_gives_the_same_tokens(model):
    prompts = _prompts(model.spec.vocab_size)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    # 24 blocks of 8 for six sequences of up to 64 tokens: the scheduler must preempt and recompute
    expected = _run(_engine(model, 1, num_blocks=24), prompts, params)
    assert _run(_engine(model, 8, num_blocks=24), prompts, params) == expected


@pytest.mark.parametrize("bad", [0, 65, 2.5])
def test_num_scheduler_steps_is_checked(bad):
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        SchedulerConfig(num_scheduler_steps=bad)
