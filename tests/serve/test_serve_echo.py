"""Prompt log-probabilities over HTTP, as lm-eval and vLLM's clients read them: ``echo`` with ``logprobs`` on
/v1/completions (whole and streamed, ``max_tokens: 0``), vLLM's ``prompt_logprobs`` on both endpoints, batches of
prompts as text and as token ids, and the other vLLM request fields this server now honours (``request_id``,
``stop_reason``, the chat-template options, /tokenize's, the model card `vllm bench serve` reads).

Values are checked against transformers' ``LlamaForCausalLM`` on the same weights (fp32, CPU).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import MODEL, make_engine, running_server, sse_payloads, wait_idle

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    engine = make_engine(real_model, tokenizer)
    with running_server(engine) as server:
        yield server
        wait_idle(server)
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


@pytest.fixture(scope="module")
def reference(reference_model, tokenizer):
    """Each prompt token's log-probability (after the first) under transformers."""
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logprobs = torch.log_softmax(reference_model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    return ids, [float(logprobs[i, ids[i + 1]]) for i in range(len(ids) - 1)]


def _post(server, path: str, **body) -> dict:
    response = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_echo_with_logprobs_is_what_lm_eval_reads(server, reference):
    ids, expected = reference
    body = _post(server, COMPLETIONS, prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(PROMPT) and len(logprobs["tokens"]) == len(ids) + 1
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:len(ids)] == pytest.approx(expected, abs=1e-4)
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"] == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(ids) + 1)]
    for token, top in zip(logprobs["tokens"][1:], logprobs["top_logprobs"][1:], strict=True):
        assert token in top and 1 <= len(top) <= 2  # the token and the single most likely one (logprobs=1)
    assert body["usage"]["prompt_tokens"] == len(ids) and body["usage"]["completion_tokens"] == 1
    assert len(choice["prompt_logprobs"]) == len(ids) and choice["prompt_logprobs"][0] is None


def test_max_tokens_zero_echoes_the_prompt_alone(server, reference):
    ids, expected = reference
    for prompt in (PROMPT, ids):
        choice = _post(server, COMPLETIONS, prompt=prompt, echo=True, logprobs=0, max_tokens=0)["choices"][0]
        assert choice["text"] == PROMPT and len(choice["logprobs"]["tokens"]) == len(ids)
        assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)


def test_batches_of_prompts_number_their_choices_as_openai(server, tokenizer):
    texts = ["Hello there", "One, two, three,"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    by_text = _post(server, COMPLETIONS, prompt=texts, max_tokens=3, temperature=0, n=2, echo=True)
    by_ids = _post(server, COMPLETIONS, prompt=ids, max_tokens=3, temperature=0, n=2, echo=True)
    for body in (by_text, by_ids):
        assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
        assert [c["text"][:len(texts[i // 2])] for i, c in enumerate(body["choices"])] == [texts[0]] * 2 + [
            texts[1]] * 2
    assert [c["text"] for c in by_text["choices"]] == [c["text"] for c in by_ids["choices"]]
    assert by_text["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    assert by_text["usage"]["completion_tokens"] == 12


def test_a_streamed_echo_equals_the_whole_one(server):
    whole = _post(server, COMPLETIONS, prompt=PROMPT, echo=True, logprobs=0, max_tokens=4, temperature=0)
    with httpx.stream("POST", server.url + COMPLETIONS, json={"prompt": PROMPT, "echo": True, "logprobs": 0,
                                                               "max_tokens": 4, "temperature": 0, "stream": True},
                      timeout=120) as response:
        chunks = [p for p in sse_payloads(response) if isinstance(p, dict)]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert chunks[0]["choices"][0]["text"].startswith(PROMPT)
    assert text == whole["choices"][0]["text"] and tokens == whole["choices"][0]["logprobs"]["tokens"]
    assert offsets == whole["choices"][0]["logprobs"]["text_offset"]


def test_prompt_logprobs_on_chat_and_the_template_options(server):
    messages = [{"role": "user", "content": "Say hi"}]
    body = _post(server, CHAT, messages=messages, max_tokens=1, prompt_logprobs=2, return_prompt_text=True)
    assert body["prompt_text"].endswith("<|im_start|>assistant\n")
    first, second = body["prompt_logprobs"][:2]
    assert first is None and 1 <= len(second) <= 3
    assert all({"logprob", "rank", "decoded_token"} <= entry.keys() for entry in second.values())
    no_header = _post(server, CHAT, messages=messages, max_tokens=1, add_generation_prompt=False,
                      return_prompt_text=True)
    assert not no_header["prompt_text"].endswith("assistant\n")
    assert no_header["usage"]["prompt_tokens"] < body["usage"]["prompt_tokens"]
    prefilled = _post(server, CHAT, max_tokens=1, continue_final_message=True, add_generation_prompt=False,
                      return_prompt_text=True, messages=[*messages, {"role": "assistant", "content": "Hi, I am"}])
    assert prefilled["prompt_text"].endswith("Hi, I am")


def test_request_id_stop_reason_and_refusals(server):
    body = _post(server, COMPLETIONS, prompt=PROMPT, max_tokens=8, temperature=0, request_id="abc-1", stop=[" and"])
    assert body["id"] == "cmpl-abc-1"
    header = httpx.post(server.url + COMPLETIONS, json={"prompt": PROMPT, "max_tokens": 1},
                        headers={"X-Request-Id": "from-header"}, timeout=60).json()
    assert header["id"] == "cmpl-from-header"
    stopped = _post(server, COMPLETIONS, prompt="Count: one, two, three, four,", max_tokens=16, temperature=0,
                    stop=[","])
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["choices"][0]["stop_reason"] == ","
    for request, field in (({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
                           ({"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
                           ({"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs"),
                           ({"prompt": PROMPT, "stream_options": {"include_usage": True}}, "stream_options")):
        response = httpx.post(server.url + COMPLETIONS, json=request, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text


def test_tokenize_options_and_the_model_card(server, tokenizer):
    out = _post(server, "/tokenize", prompt="Hello world", return_token_strs=True)
    assert out["token_strs"] == tokenizer.convert_ids_to_tokens(out["tokens"])
    chat = _post(server, "/tokenize", messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert chat["token_strs"] is None and chat["count"] > 0
    card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    # What `vllm bench serve` without --model reads (get_first_model_from_server: data[0]["id"], data[0]["root"]),
    # and then loads a tokenizer from root.
    assert card["id"] == MODEL and {"root", "parent", "max_model_len", "permission"} <= card.keys()
    assert card["parent"] is None and card["permission"] == [] and card["max_model_len"] == 8192
    assert (Path(card["root"]) / "tokenizer.json").exists()
    # ... and sends root as the model to /tokenize (vLLM's served name is that path by default)
    assert _post(server, "/tokenize", model=card["root"], prompt="Hello", add_special_tokens=False)["count"] == 1
