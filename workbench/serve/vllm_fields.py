"""Every field of vLLM's request schemas, sorted into what this server does with it: honoured, refused, or
accepted because it changes nothing for this engine (as it changes nothing in vLLM serving this model).

vLLM's own field lists, with the commits they were read at, are data (``datasets/vllm/request_fields.json``), and
``tests/serve/test_vllm_field_coverage.py`` fails when one of its fields is in none of the three groups: a client never
gets an answer that silently left out something it asked for.

- *Honoured* fields are declared in the request models (`workbench.serve.schemas`), with vLLM's meaning.
- *Refused* fields (``VLLM_FIELDS_REFUSED``) hold the values that ask for nothing (clients that fill in every
  field send those); any other value is a 400 naming the field, checked before the rest of the body is validated,
  so the error names the field the client must drop.
- *No effect* fields (``VLLM_FIELDS_WITHOUT_EFFECT``) are accepted with any value, each with the reason it cannot
  change this server's answer.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

VLLM_FIELDS_FILE = Path(__file__).resolve().parents[2] / "datasets" / "vllm" / "request_fields.json"

_OFF = (None, False, 0, 0.0, "", [], {})
# Each refused field with the values that ask for nothing. Names that vLLM no longer has (guided_*, functions, ...)
# stay, since older clients still send them.
VLLM_FIELDS_REFUSED: dict[str, tuple] = {
    "logit_bias": _OFF, "length_penalty": (None, 1, 1.0), "use_beam_search": _OFF,
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": _OFF, "allowed_token_ids": (None, []), "bad_words": (None, []),
    "tools": (None,), "tool_choice": (None, "none"), "functions": _OFF, "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}), "guided_json": _OFF, "guided_regex": _OFF, "guided_choice": _OFF,
    "guided_grammar": _OFF, "guided_decoding_backend": _OFF, "guided_whitespace_pattern": _OFF,
    "structural_tag": _OFF, "structured_outputs": (None,), "reasoning_effort": (None,),
    "include_reasoning": (None, True), "echo": (None, False), "suffix": (None, ""), "documents": (None, []),
    "mm_processor_kwargs": (None, {}), "priority": (None, 0), "logits_processors": _OFF,
    "return_tokens_as_token_ids": (None, False), "return_token_ids": (None, False), "cache_salt": (None,),
    "kv_transfer_params": (None, {}), "ec_transfer_params": (None, {}), "vllm_xargs": (None, {}),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "service_tier": (None, "auto", "default"),
    # vLLM fields newer than the 0.10-0.11 list this server first followed:
    "watermarking": (None, False), "logprob_token_ids": (None,), "prompt_embeds": (None, []),
    "repetition_detection": (None,), "thinking_token_budget": (None, -1), "stream_interval": (None, 1),
    "media_io_kwargs": (None, {}), "max_repetition_pattern_size": (None, 0), "min_repetition_pattern_size": (None, 0),
    "repetition_min_count": (None, 0),
}

# Accepted with any value: why each cannot change what this server answers (nor what vLLM answers for this model).
VLLM_FIELDS_WITHOUT_EFFECT: dict[str, str] = {
    "user": "an end-user id for the caller's own records; vLLM ignores it too",
    "session_id": "request affinity for routers in front of a fleet; one engine serves every request here",
    "truncation_side": "only read with truncate_prompt_tokens, which is refused",
    "routed_experts_prompt_start": "routing data of mixture-of-experts models; this model is dense",
    "return_token_offsets": "read only by vLLM's /render endpoints; generation endpoints ignore it there too",
    "return_mm_kwargs": "read only by vLLM's /render endpoints",
    "parallel_tool_calls": "only matters with tools, which are refused",
}

# Per message of a chat request: passed to the chat template as vLLM passes them, or refused.
MESSAGE_FIELDS_TO_TEMPLATE = ("role", "content", "name", "tool_call_id", "tool_calls", "reasoning")
MESSAGE_FIELDS_REFUSED: dict[str, tuple] = {"tools": (None, []), "task": (None,), "function_call": (None,),
                                            "audio": (None,), "refusal": (None, "")}


class FieldRefused(Exception):
    """A vLLM field this server does not honour asked for something: a 400 naming it (`workbench.serve.errors`)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def _neutral(value: object, neutral_values: tuple) -> bool:
    return any(value == neutral and type(value) is type(neutral) for neutral in neutral_values)


def refuse_sent_fields(data: dict, honoured: frozenset[str], where: str = "") -> None:
    """A 400 naming the first field of ``data`` that is refused here (not in ``honoured``) and asks for something."""
    for name, value in data.items():
        neutral_values = VLLM_FIELDS_REFUSED.get(name)
        if neutral_values is None or name in honoured or _neutral(value, neutral_values):
            continue
        raise FieldRefused(f"{where}{name}={_short(value)} is not supported by this engine (it would be ignored, "
                           "so it is refused)", name)


def refuse_message_fields(messages: object) -> None:
    """A 400 naming the first message field this server cannot pass on (tools in a message, audio, ...)."""
    if not isinstance(messages, list):
        return
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        for name, neutral_values in MESSAGE_FIELDS_REFUSED.items():
            if name in message and not _neutral(message[name], neutral_values):
                raise FieldRefused(f"messages[{index}].{name}={_short(message[name])} is not supported by this "
                                   "engine (it would be ignored, so it is refused)", "messages")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@cache
def vllm_field_lists() -> dict:
    """vLLM's request field lists as stored in ``datasets/vllm/request_fields.json`` (with the commits read)."""
    return json.loads(VLLM_FIELDS_FILE.read_text())
