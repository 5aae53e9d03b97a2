"""The engine's bookkeeping under random traffic, on a 2-layer random-weight model (milliseconds per step).

Hypothesis drives random sequences of add / abort / step against engines with tiny KV pools (so preemption,
prefix hits, copy-on-write and speculative lookahead all happen) and checks after every action that:

- the block manager's own invariants hold and no block is held by anything but a running sequence;
- every request ends exactly once (a finished output, or an abort), never runs past ``max_tokens``, and a
  request that stopped on a stop token ended on it;
- once idle, every block is free again and the metrics saw each sequence finish once.

Token values are meaningless here (random weights); the real-model tests check the tokens themselves.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tiny_models import SMALL, tiny_model

from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine

BLOCK_SIZE = 4
MAX_PROMPT = 14
MAX_TOKENS = 9
# Tokens drawn from a tiny alphabet, so prompts share prefixes (prefix-cache hits) and repeat n-grams (drafts).
ALPHABET = st.integers(1, 5)
STOP_IDS = tuple(range(0, 256, 8))  # one token in 8 stops a request that asks for it: stops happen often


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@cache
def small_model(num_layers: int = 2):
    return tiny_model(seed=num_layers, num_layers=num_layers, **SMALL)


class EngineUnderTraffic(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(7, 14), prefix=st.booleans(), batching=st.sampled_from(
        ["continuous", "continuous", "static", "dynamic"]), chunked=st.booleans(),
        chunk=st.sampled_from([None, 3, 5]),
        spec=st.sampled_from([None, None, ("ngram", 1), ("ngram", 3), ("draft", 2)]))
    def make_engine(self, num_blocks, prefix, batching, chunked, chunk, spec):
        self.now = 0.0
        scheduler = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=24 if chunked else 32,
                                    enable_chunked_prefill=chunked, max_prefill_chunk=chunk if chunked else None,
                                    batching=batching, dynamic_batch_size=2, dynamic_max_wait_s=0.03)
        self.engine = LLMEngine(
            small_model(), None, cache_config=CacheConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE,
                                                         enable_prefix_caching=prefix),
            scheduler_config=scheduler, spec_config=SpecConfig(spec[0], spec[1]) if spec else None,
            draft_model=small_model(1) if spec and spec[0] == "draft" else None)  # a 1-layer model drafts
        self.engine.clock = lambda: self.now  # dynamic batching waits on this clock, not the wall
        self.params: dict[str, SamplingParams] = {}
        self.ended: set[str] = set()
        self.aborted: set[str] = set()

    # ------------------------------------------------------------------------------------------------ rules
    @rule(prompt=st.lists(ALPHABET, min_size=1, max_size=MAX_PROMPT), max_tokens=st.integers(1, MAX_TOKENS),
          n=st.sampled_from([1, 1, 2]), sampled=st.booleans(), stop=st.sampled_from([(), STOP_IDS]))
    def add(self, prompt, max_tokens, n, sampled, stop):
        params = SamplingParams(max_tokens=max_tokens, n=n, temperature=0.9 if sampled else 0.0,
                                seed=len(self.params) if sampled else None, stop_token_ids=stop)
        request_id = self.engine.add_request(prompt, params, arrival_time=self.now)
        assert request_id not in self.params
        self.params[request_id] = params

    @precondition(lambda self: self.params.keys() - self.ended)
    @rule(data=st.data())
    def abort(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.params.keys() - self.ended)))
        self.engine.abort(request_id)
        self.ended.add(request_id)
        self.aborted.add(request_id)
        with pytest.raises(ValueError, match="unknown request id"):
            self.engine.abort(request_id)

    @rule()
    def step(self):
        self.now += 0.01
        for output in self.engine.step():
            assert output.request_id not in self.ended, f"{output.request_id} produced output after it ended"
            params = self.params[output.request_id]
            for completion in output.outputs:
                assert len(completion.token_ids) <= params.max_tokens
                if completion.finish_reason == "stop":
                    assert completion.token_ids[-1] in params.stop_token_ids
                    assert not set(completion.token_ids[:-1]) & set(params.stop_token_ids)
                elif completion.finish_reason == "length":
                    assert len(completion.token_ids) == params.max_tokens
            if output.finished:
                self.ended.add(output.request_id)

    # ------------------------------------------------------------------------------------------ invariants
    @invariant()
    def blocks_are_held_only_by_running_sequences(self):
        engine = self.engine
        check_block_manager(engine.blocks)
        running = engine.scheduler.running
        assert len(running) <= engine.scheduler_config.max_num_seqs
        held = set()
        for seq in running:
            assert not seq.is_finished
            held.update(engine.blocks.block_table(seq.seq_id))
        assert engine.blocks.num_used_blocks == len(held), "a block is held by a sequence that is not running"
        assert engine.has_unfinished_requests() == bool(self.params.keys() - self.ended)

    def teardown(self):
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        for _ in range(400):  # far more steps than the remaining work needs: running out means a livelock
            if not engine.has_unfinished_requests():
                break
            self.step()
            self.blocks_are_held_only_by_running_sequences()
        assert self.ended == set(self.params), "a request never ended"
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
        finished = [seq.seq_id for seq in engine.metrics.finished]
        assert len(finished) == len(set(finished)) == sum(p.n for p in self.params.values())
        assert {seq.request_id for seq in engine.metrics.finished if seq.finish_reason.value == "abort"} == self.aborted


# No shrinking phase: on a failure it replays hundreds of engine runs (minutes); the unshrunk example and the
# seed it prints are enough to reproduce it, and shrinking can be switched back on while debugging.
EngineUnderTraffic.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
test_engine_under_random_traffic = EngineUnderTraffic.TestCase
