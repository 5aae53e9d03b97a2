"""The scheduler without a model: real sequences and a real block manager on tiny pools, no tensors at all.

A step is simulated the way the engine's bookkeeping runs it: every scheduled token's KV becomes computed, and a
sequence whose known tokens are all computed gets one more token (always 7: values do not matter here).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from pathlib import Path

import pytest

from workbench.cache.block_invariants import check_block_manager, check_sequences
from workbench.cache.block_manager import BlockManager
from workbench.config import SamplingParams, SchedulerConfig
from workbench.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from workbench.engine.sequence import FinishReason, Sequence, SequenceStatus

BLOCK = 4


class Pool:
    """A scheduler over a block manager of ``num_blocks`` blocks of 4 tokens, with sequence factories."""

    def __init__(self, num_blocks: int, **config):
        self.blocks = BlockManager(num_blocks, BLOCK, enable_prefix_caching=config.pop("prefix", False))
        self.scheduler = Scheduler(SchedulerConfig(**config), self.blocks)
        self.ids = itertools.count()
        self.now = 0.0

    def seq(self, prompt_len: int, max_tokens: int = 8, first_token: int = 1) -> Sequence:
        prompt = list(range(first_token, first_token + prompt_len))
        return Sequence(next(self.ids), f"r{len(prompt)}", prompt, SamplingParams(max_tokens=max_tokens),
                        prompt_len + max_tokens, self.now)

    def add(self, *lengths: int, n: int = 1) -> list[Sequence]:
        added = []
        for length in lengths:
            seqs = [self.seq(length) for _ in range(n)]
            self.scheduler.add(seqs[0], siblings=seqs[1:])
            added += seqs
        return added

    def step(self) -> SchedulerOutput:
        self.now += 0.01
        out = self.scheduler.schedule(self.now)
        for item in out.scheduled:
            seq = item.seq
            self.scheduler.mark_computed(seq, seq.num_computed_tokens + item.num_new_tokens)
            if seq.num_uncomputed_tokens == 0:
                for due in (seq, *self.scheduler.fork(seq)):
                    self.scheduler.append_token(due, 7, self.now)
        if out.block_copies:  # copies go before the forward; here there is nothing to copy
            assert all(src != dst for src, dst in out.block_copies)
        check_block_manager(self.blocks)
        check_sequences(self.blocks, self.scheduler.running, self.scheduler.waiting)
        return out


def tokens_of(out: SchedulerOutput) -> dict[int, int]:
    return {item.seq.seq_id: item.num_new_tokens for item in out.scheduled}


# ------------------------------------------------------------------------------------------- step contents
def test_decodes_come_first_and_prefill_chunks_fill_the_budget():
    pool = Pool(32, max_num_batched_tokens=8, max_num_seqs=4, max_prefill_chunk=5)
    a, b = pool.add(3, 3)
    pool.step()  # both prompts (3 + 3 tokens) fit in one step
    assert a.is_decoding and b.is_decoding
    (c,) = pool.add(20)
    out = pool.step()
    assert [item.seq for item in out.decodes] == [a, b] and [item.seq for item in out.prefills] == [c]
    assert tokens_of(out) == {a.seq_id: 1, b.seq_id: 1, c.seq_id: 5}  # chunk limit 5 < remaining budget 6
    chunks = [tokens_of(pool.step())[c.seq_id] for _ in range(4)]
    assert chunks == [5, 5, 5, 1]  # 20 prompt tokens in chunks of 5, then its first decode
    assert c.num_output_tokens == 2


def test_without_chunking_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    pool = Pool(32, max_num_batched_tokens=10, max_num_seqs=4, enable_chunked_prefill=False)
    a, b = pool.add(6, 6)
    out = pool.step()
    assert tokens_of(out) == {a.seq_id: 6}  # b's 6 tokens do not fit in the 4 left
    assert list(pool.scheduler.waiting) == [b]
    assert tokens_of(pool.step()) == {a.seq_id: 1, b.seq_id: 6}


def test_admission_stops_at_max_num_seqs():
    pool = Pool(32, max_num_batched_tokens=64, max_num_seqs=2)
    seqs = pool.add(2, 2, 2)
    pool.step()
    assert pool.scheduler.running == seqs[:2] and list(pool.scheduler.waiting) == seqs[2:]


# --------------------------------------------------------------------------------------------- preemption
def test_the_newest_running_sequence_is_preempted_when_blocks_run_out():
    pool = Pool(4, max_num_batched_tokens=32, max_num_seqs=4)
    old, new = pool.add(8, 8)
    pool.step()  # 2 blocks each, both full: the next decode of each needs a third block, and none is free
    pool.step()  # old takes its third block by preempting new
    assert new.status is SequenceStatus.WAITING and new.num_preemptions == 1 and new.num_computed_tokens == 0
    assert pool.scheduler.running == [old] and list(pool.scheduler.waiting) == [new]
    assert new.seq_id not in pool.blocks


def test_no_sequence_is_admitted_in_a_step_that_preempts():
    pool = Pool(5, max_num_batched_tokens=32, max_num_seqs=4)
    old, new = pool.add(8, 8)
    pool.step()  # 4 of 5 blocks used; the next decodes need one each
    (late,) = pool.add(1)
    out = pool.step()
    assert out.preempted == [new] and not out.admitted
    assert list(pool.scheduler.waiting) == [new, late]  # the preempted one goes back to the front


def test_a_preempted_sequence_is_recomputed_with_its_generated_tokens():
    pool = Pool(4, max_num_batched_tokens=32, max_num_seqs=4)
    old, new = pool.add(8, 8)
    pool.step()
    pool.step()
    assert new.num_output_tokens == 1  # its first token, sampled before it was preempted, is kept
    pool.scheduler.finish(old, FinishReason.LENGTH, pool.now)
    out = pool.step()
    assert tokens_of(out) == {new.seq_id: 9}  # prompt and generated token, prefilled again
    assert new.num_computed_tokens == 9 and new.num_output_tokens == 2


# --------------------------------------------------------------------------------------------------- aborts
@pytest.mark.parametrize("where", ["running", "waiting", "preempted"])
def test_finishing_a_sequence_anywhere_frees_everything_it_holds(where):
    pool = Pool(4, max_num_batched_tokens=32, max_num_seqs=2)
    old, new, queued = pool.add(8, 8, 8)
    pool.step()
    pool.step()  # new is preempted, queued never admitted
    victim = {"running": old, "waiting": queued, "preempted": new}[where]
    pool.scheduler.finish(victim, FinishReason.ABORT, pool.now)
    assert victim.is_finished and victim.finish_reason is FinishReason.ABORT
    assert victim not in pool.scheduler.running and victim not in pool.scheduler.waiting
    assert victim.seq_id not in pool.blocks
    for seq in (old, new, queued):
        if seq is not victim:
            pool.scheduler.finish(seq, FinishReason.ABORT, pool.now)
    assert pool.blocks.num_free_blocks == 4
    check_block_manager(pool.blocks)


# ------------------------------------------------------------------------------------------ batching modes
def test_static_batches_run_to_completion_before_anything_joins():
    pool = Pool(32, max_num_batched_tokens=64, max_num_seqs=4, batching="static")
    (first,) = pool.add(2)
    pool.step()
    (second,) = pool.add(2)
    for _ in range(3):
        pool.step()
        assert list(pool.scheduler.waiting) == [second]
    pool.scheduler.finish(first, FinishReason.LENGTH, pool.now)
    assert pool.step().admitted == [second]


def test_dynamic_batches_start_when_full_or_when_the_oldest_waited_long_enough():
    pool = Pool(32, max_num_batched_tokens=64, max_num_seqs=4, batching="dynamic", dynamic_batch_size=2,
                dynamic_max_wait_s=0.05)
    (a,) = pool.add(2)
    assert pool.step().is_empty  # one waiting, waited 0.01 s
    (b,) = pool.add(2)
    assert pool.step().admitted == [a, b]  # two: the batch is full
    for seq in (a, b):
        pool.scheduler.finish(seq, FinishReason.LENGTH, pool.now)
    (c,) = pool.add(2)
    waits = 0
    while pool.step().is_empty:
        waits += 1
    assert waits == 4 and c.status is SequenceStatus.RUNNING  # admitted once it had waited 0.05 s


# -------------------------------------------------------------------------------------------------- forks
def test_siblings_fork_once_the_prompt_is_computed_and_share_its_blocks():
    pool = Pool(16, max_num_batched_tokens=64, max_num_seqs=4)
    parent, *children = pool.add(6, n=3)
    assert pool.scheduler.has_pending_forks(parent) and list(pool.scheduler.waiting) == [parent]
    pool.step()
    assert pool.scheduler.running == [parent, *children] and not pool.scheduler.has_pending_forks(parent)
    tables = [pool.blocks.block_table(s.seq_id) for s in (parent, *children)]
    assert tables[0] == tables[1] == tables[2]  # shared until each writes its own tokens
    assert all(c.first_scheduled_time == parent.first_scheduled_time for c in children)
    pool.step()  # each decodes into the shared last block: copy-on-write gives each its own
    last = [pool.blocks.block_table(s.seq_id)[-1] for s in (parent, *children)]
    assert len(set(last)) == 3


def test_admission_counts_siblings_against_max_num_seqs():
    pool = Pool(32, max_num_batched_tokens=64, max_num_seqs=3)
    pool.add(2, n=2)
    (other,) = pool.add(2)
    (third,) = pool.add(2)
    pool.step()
    assert other.status is SequenceStatus.RUNNING and third.status is SequenceStatus.WAITING
    assert len(pool.scheduler.running) == 3
    with pytest.raises(ValueError, match="n = 4 completions"):
        pool.add(2, n=4)


# --------------------------------------------------------------------------------------- who owns what (#43)
def test_the_computed_count_is_the_schedulers_and_an_unknown_sequence_raises():
    """Issue 43: Sequence.num_computed_tokens read the block manager through a reference on the sequence and
    answered 0 for a sequence the manager did not know. It is a plain count the scheduler sets from the manager,
    which raises for a sequence it does not know."""
    pool = Pool(8, max_num_batched_tokens=32, max_num_seqs=4)
    (seq,) = pool.add(5)
    assert not hasattr(seq, "blocks") and seq.num_computed_tokens == 0
    with pytest.raises(ValueError, match=f"unknown seq_id {seq.seq_id}"):
        pool.scheduler.mark_computed(seq, 1)  # waiting: not in the block manager, and it says so
    pool.step()
    assert seq.num_computed_tokens == pool.blocks.num_computed_tokens(seq.seq_id) == 5
    pool.scheduler.finish(seq, FinishReason.ABORT, pool.now)
    assert seq.num_computed_tokens == 0
    with pytest.raises(ValueError, match="unknown seq_id"):
        pool.blocks.num_computed_tokens(seq.seq_id)


def test_check_sequences_catches_a_count_or_a_token_list_out_of_step():
    pool = Pool(8, max_num_batched_tokens=32, max_num_seqs=4)
    (seq,) = pool.add(5)
    pool.step()
    seq.num_computed_tokens -= 1
    with pytest.raises(AssertionError, match="computed tokens on the sequence"):
        check_sequences(pool.blocks, pool.scheduler.running, pool.scheduler.waiting)
    seq.num_computed_tokens += 1
    seq.append_token(9, pool.now)  # behind the scheduler's back: the block manager never heard of it
    with pytest.raises(AssertionError, match="the block manager's tokens"):
        check_sequences(pool.blocks, pool.scheduler.running, pool.scheduler.waiting)


CPU_SIDE = ["engine/scheduler.py", "engine/admission_policy.py", "cache/block_manager.py",
            "cache/block_manager_base.py", "cache/hybrid_block_manager.py", "cache/prefix_cache.py",
            "cache/grouped_prefix_cache.py", "cache/block_pool.py", "cache/kv_groups.py"]


@pytest.mark.parametrize("module", CPU_SIDE)
def test_the_cpu_side_imports_no_tensor_library(module):
    """Issue 43: the scheduler, whose docstring says it never touches a tensor, imported torch for the drafts'
    distributions it carried (now `workbench.spec.drafts`, beside its decision, not in it)."""
    path = Path(__file__).resolve().parents[2] / "workbench" / module
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    assert not [n for n in names if n.split(".")[0] in ("torch", "numpy", "triton")], names


def test_a_scheduling_decision_is_not_rewritten_after_it_is_made():
    pool = Pool(8, max_num_batched_tokens=32, max_num_seqs=4)
    pool.add(5)
    (item,) = pool.step().scheduled
    assert isinstance(item, ScheduledSeq) and {f.name for f in dataclasses.fields(item)} == {
        "seq", "num_new_tokens", "lookahead", "multi_step"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.num_new_tokens = 3
