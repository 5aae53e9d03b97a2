"""Streaming token ids back into text, and stopping on stop strings.

Byte-level BPE tokens can end in the middle of a UTF-8 character, so a token's text is only known once the
following tokens arrive. The detokenizer re-decodes the generated ids and releases text only up to the last
complete character, which keeps streamed output identical to decoding everything at the end.
"""

from __future__ import annotations

from workbench.config import SamplingParams

_INCOMPLETE = "\ufffd"  # what the tokenizer prints for a partial UTF-8 sequence


class IncrementalDetokenizer:
    """``stop`` strings end the text (cut before the stop string, or after it with ``include_stop``); they are
    looked for only once more than ``min_tokens`` tokens are out (vLLM's rule)."""

    @classmethod
    def for_params(cls, tokenizer, params: SamplingParams) -> IncrementalDetokenizer:
        """The detokenizer a request's ``params`` ask for: its stop strings, kept or cut, after min_tokens."""
        return cls(tokenizer, params.stop, include_stop=params.include_stop_str_in_output,
                   min_tokens=params.min_tokens)

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), *, include_stop: bool = False, min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop
        self.min_tokens = min_tokens
        self.ids: list[int] = []
        self.text = ""  # text released so far
        self.stopped_on: str | None = None

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (maybe empty). Stops at a stop string."""
        self.ids.append(token_id)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith(_INCOMPLETE):
            return ""
        for s in self.stop if len(self.ids) > self.min_tokens else ():
            # Search only where a stop string could newly end, so earlier text is never re-cut.
            at = full.find(s, max(0, len(self.text) - len(s) + 1))
            if at != -1:
                full = full[:at + len(s)] if self.include_stop else full[:at]
                self.stopped_on = s
                break
        delta = full[len(self.text):]
        self.text = full
        return delta
