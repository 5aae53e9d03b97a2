"""The state of one sequence as it moves through the engine: waiting, running, finished.

A request asks for ``n`` completions of one prompt; each completion is a ``Sequence``. Every fact about it has
one owner, the only code that writes it:

- ``token_ids`` (the prompt, then each generated token) and ``token_times``: ``append_token``, called through
  the scheduler (`Scheduler.append_token`, which also tells the block manager: it keeps its own copy of the
  tokens and never edits this list) by the engine's post-forward bookkeeping (`workbench.engine.bookkeeping`);
- ``status``, the admission stamps, ``num_preemptions`` and ``num_computed_tokens``: the scheduler, which also
  calls ``finish``. It sets ``num_computed_tokens`` from the block manager after every change it asks of it
  (admission, fork, a forward's new KV, preemption and finishing reset it to 0), so the count is a plain number
  on the sequence and a block manager that does not know a running sequence raises instead of answering 0;
- ``spec``: the verification bookkeeping; ``num_returned_tokens`` / ``returned_text_len``: output building.

``num_computed_tokens`` is the pivot of the whole engine: the tokens before it have their KV in the cache,
the ones after it still need a forward pass (all of the prompt at first, one token per step while decoding,
everything again after a preemption by recompute).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.config import SamplingParams
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.sampling import TokenLogprob
from workbench.spec.stats import SpecCounters

if TYPE_CHECKING:
    import torch


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # an EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # the caller aborted it
    ERROR = "error"  # its next token could not be drawn (`workbench.sampling.SamplingError`); the others go on


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    request_id: str
    token_ids: list[int]  # the prompt when created, then every generated token; only append_token() writes it
    params: SamplingParams
    max_total_tokens: int  # prompt + the most tokens it may generate (max_tokens, capped by the context)
    arrival_time: float  # when the request arrived (at the HTTP server, when it came through one): TTFT counts from it
    generator: torch.Generator | None = None
    detokenizer: IncrementalDetokenizer | None = None
    spec_k: int = 0  # most tokens to draft per step (0: no speculation for this sequence); a tree's depth
    spec_slots: int = 0  # slots a token tree needs beyond the newest token (0: the drafts form a chain)
    priority: int = 0  # lower runs first under the priority scheduling policy (as in vLLM)
    num_prompt_tokens: int = field(init=False)
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose KV is in the cache (0 while waiting, after a preemption, and once finished): the scheduler's
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # served from the prefix cache at the last admission
    num_preemptions: int = 0
    queued_time: float | None = None  # when the engine queued it (None: at arrival); queue time counts from it
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None  # why it finished with FinishReason.ERROR (written by the bookkeeper's fail())
    # Tokens before this index have been handed to the caller (streaming deltas).
    num_returned_tokens: int = 0
    returned_text_len: int = 0
    spec: SpecCounters = field(default_factory=SpecCounters)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, when params.logprobs is set
    # With params.prompt_logprobs: prompt tokens 1, 2, ... (the first has nothing before it), written by the
    # bookkeeper from the prefill's logits, in order; complete once it holds num_prompt_tokens - 1 entries
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)
        if self.queued_time is None:
            self.queued_time = self.arrival_time

    # ------------------------------------------------------------------------------------------ tokens
    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True once the prompt is in the cache and only the newest token remains to be fed."""
        return self.num_uncomputed_tokens == 1 and self.num_output_tokens > 0

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens it may still generate (max_tokens and the context both count)."""
        return min(self.params.max_tokens - self.num_output_tokens, self.max_total_tokens - self.num_tokens)

    @property
    def draft_depth(self) -> int:
        """Drafts worth verifying in a row next step: a pass emits up to drafts + 1 tokens, never more than remain."""
        return max(0, min(self.spec_k, self.num_remaining_tokens - 1)) if self.is_decoding else 0

    @property
    def lookahead(self) -> int:
        """Slots to reserve beyond the newest token: the chain's drafts, or a token tree's nodes."""
        depth = self.draft_depth
        return self.spec_slots if self.spec_slots and depth else depth

    @property
    def takes_multi_step(self) -> bool:
        """Whether its next tokens may be decoded several steps at a time on the device (greedy, nothing that
        reads each token on the host before the next: no penalties, min_tokens, logprobs or speculation)."""
        return self.params.greedy and not self.params.one_token_per_step and self.spec_k == 0

    @property
    def needs_prompt_logits(self) -> bool:
        """Its request asked for prompt log-probabilities and some are still missing: its prompt is prefilled in
        full (no prefix-cache lookup), and each prefill chunk returns a logits row per prompt token."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer is not None else ""

    # ----------------------------------------------------------------------------------------- changes
    def append_token(self, token: int, now: float) -> None:
        """A generated token, stamped with the time it became known."""
        self.token_ids.append(token)
        self.token_times.append(now)
        if self.detokenizer is not None:
            self.detokenizer.push(token)

    def finish(self, reason: FinishReason, now: float) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.finish_time = now
