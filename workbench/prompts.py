"""From what a user types to the token ids the model reads, with the checks that belong at the door.

Used by the CLI, the generation loops and the engine, so every entry point rejects an empty prompt or one
longer than the model's context with the same message.
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


def check_prompt_fits(num_prompt_tokens: int, max_context: int) -> None:
    """Raise if a prompt leaves no room for even one generated token."""
    if num_prompt_tokens >= max_context:
        raise ValueError(f"prompt has {num_prompt_tokens} tokens but the model's context is {max_context} "
                         f"tokens; shorten it to at most {max_context - 1}")


def eos_token_ids(tokenizer) -> set[int]:
    """End-of-sequence ids of the tokenizer (for SmolLM2-Instruct, <|im_end|>)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return {eos} if isinstance(eos, int) else set()
