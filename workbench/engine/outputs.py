"""What the engine hands back: per request, the completions so far, and what is new since the last look."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.sampling import TokenLogprob


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the request's n completions
    token_ids: list[int]
    text: str
    finish_reason: str | None  # "stop", "length", "abort", "error", or None while running
    new_token_ids: list[int] = field(default_factory=list)  # since the previous output of this request
    new_text: str = ""
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when the request asked for them
    error: str | None = None  # what went wrong, with finish_reason "error"
    # with finish_reason "stop": the stop string or stop token id that ended it (None for an EOS), as vLLM's
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_ids: list[int]
    outputs: list[CompletionOutput]
    # params.prompt_logprobs: one per prompt token, None for the first (nothing comes before it)
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)

    @property
    def text(self) -> str:
        """Text of the first completion (the only one unless n > 1)."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids
