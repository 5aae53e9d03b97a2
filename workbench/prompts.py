"""From what a user types to the token ids the model reads, with the checks that belong at the door.

Used by the CLI, the generation loops, the engine and the server, so every entry point rejects an empty prompt,
or a prompt and ``max_tokens`` the model's context cannot hold, with the same message (``check_context``).
"""

from __future__ import annotations


def encode_prompt(tokenizer, prompt: str | list[int], *, chat: bool = True, system: str | None = None) -> list[int]:
    """Token ids for ``prompt``: through the model's chat template when ``chat``, else as raw text.

    A list of ints is taken as already-tokenized input and returned unchanged (after validation).
    """
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and t >= 0 for t in prompt):
            raise ValueError("a tokenized prompt must be a non-empty list of non-negative token ids")
        return prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt must be non-empty text, got {prompt!r}")
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


class ContextLengthError(ValueError):
    """A prompt, or a prompt and its ``max_tokens``, past the model's context: refused wherever it arrives (never
    capped), with vLLM's wording. ``param`` is what the caller must change: the prompt's field, or max_tokens; a
    server names the prompt's field as its route calls it (``for_field``) and answers 400
    ``context_length_exceeded``."""

    def __init__(self, num_prompt_tokens: int, max_tokens: int | None, max_context: int, field: str = "prompt"):
        self.num_prompt_tokens, self.max_tokens, self.max_context = num_prompt_tokens, max_tokens, max_context
        if max_tokens is None:
            message = (f"this model's maximum context length is {max_context} tokens, and {num_prompt_tokens} "
                       f"tokens are in the {field} alone: shorten the {field}")
        else:
            message = (f"this model's maximum context length is {max_context} tokens, you requested "
                       f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the {field} + {max_tokens} "
                       f"max_tokens): shorten the {field} or lower max_tokens")
        self.param = field if max_tokens is None or num_prompt_tokens >= max_context else "max_tokens"
        super().__init__(message)

    def for_field(self, field: str) -> ContextLengthError:
        """The same refusal, naming the prompt's field as a route calls it (``messages``, ``prompt``)."""
        return ContextLengthError(self.num_prompt_tokens, self.max_tokens, self.max_context, field)


def check_context(num_prompt_tokens: int, max_tokens: int | None, max_context: int) -> None:
    """``ContextLengthError`` unless the prompt leaves room for a generated token and, when ``max_tokens`` is
    given (None: whatever is left), for all of them."""
    if num_prompt_tokens >= max_context or (max_tokens is not None and num_prompt_tokens + max_tokens > max_context):
        raise ContextLengthError(num_prompt_tokens, max_tokens, max_context)


def eos_token_ids(tokenizer) -> set[int]:
    """End-of-sequence ids of the tokenizer (for SmolLM2-Instruct, <|im_end|>)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return {eos} if isinstance(eos, int) else set()
