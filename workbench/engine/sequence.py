"""The state of one sequence as it moves through the engine: waiting, running, finished.

A request asks for ``n`` completions of one prompt; each completion is a ``Sequence``. The scheduler reads
and moves sequences, the model runner reads their tokens, the engine appends sampled tokens and stamps times.
``num_computed_tokens`` is the pivot of the whole engine: the tokens before it have their KV in the cache,
the ones after it still need a forward pass (all of the prompt at first, one token per step while decoding,
everything again after a preemption by recompute).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from workbench.config import SamplingParams
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.spec.stats import SpecCounters


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # an EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # the caller aborted it


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_total_tokens: int  # prompt + the most tokens it may generate (max_tokens, capped by the context)
    arrival_time: float
    generator: torch.Generator | None = None
    detokenizer: IncrementalDetokenizer | None = None
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # served from the prefix cache at the last admission
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    # Tokens before this index have been handed to the caller (streaming deltas).
    num_returned_tokens: int = 0
    returned_text_len: int = 0
    spec_k: int = 0  # most tokens to draft per step (0: no speculation for this sequence)
    priority: int = 0  # lower runs first under the priority scheduling policy (as in vLLM)
    spec: SpecCounters = field(default_factory=SpecCounters)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True once the prompt is in the cache and only the newest token remains to be fed."""
        return self.num_uncomputed_tokens == 1 and bool(self.output_ids)

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens it may still generate (max_tokens and the context both count)."""
        return min(self.params.max_tokens - len(self.output_ids), self.max_total_tokens - self.num_tokens)

    @property
    def lookahead(self) -> int:
        """Drafts worth verifying next step: a pass emits up to drafts + 1 tokens, never more than remain."""
        return max(0, min(self.spec_k, self.num_remaining_tokens - 1)) if self.is_decoding else 0

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer is not None else ""

    def finish(self, reason: FinishReason, now: float) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.finish_time = now
