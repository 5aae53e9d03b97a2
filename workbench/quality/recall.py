"""Exact recall from a long context: the kind of task where a quantized cache fails first.

Each prompt hides one sentence ("The secret number is 48213.") at a chosen depth inside natural filler text
(``datasets/eval/heldout.txt``, repeated as needed) of a target length, and ends by asking for the number.
The answer must be copied digit for digit from far back in the context, so it depends on the keys of a few
distant positions being precise, unlike text continuation, where many nearby tokens carry the meaning.

(A harder variant with dozens of similar "access code of <name>" records was measured first: the unquantized
SmolLM2-135M answered 67% at 256 tokens, 17% at 512 and 0% from 1,024 on, too weak a baseline to compare
formats on. One needle in prose it copies reliably.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pandas as pd

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.paths import DATASETS_DIR

QUESTION = "\n\nQuestion: what is the secret number mentioned in the text above?\nAnswer: The secret number is"


@dataclass(frozen=True, slots=True)
class RecallItem:
    prompt_ids: list[int]
    answer: str
    context_tokens: int
    depth: float  # where the queried record sits: 0 = start of the context, 1 = end


def make_item(tokenizer, context_tokens: int, depth: float, rng: random.Random) -> RecallItem:
    """Filler sentences up to ``context_tokens``, the needle inserted at ``depth``, then the question."""
    sentences = (DATASETS_DIR / "eval" / "heldout.txt").read_text().replace("\n\n", " ").split(". ")
    start = rng.randrange(len(sentences))
    filler, used = [], 0
    while used < context_tokens:
        sentence = sentences[(start + len(filler)) % len(sentences)].strip().rstrip(".") + ". "
        filler.append(sentence)
        used += len(tokenizer(sentence, add_special_tokens=False)["input_ids"])
    code = str(rng.randrange(10000, 100000))
    filler.insert(int(depth * len(filler)), f"The secret number is {code}. ")
    ids = tokenizer("".join(filler) + QUESTION, add_special_tokens=False)["input_ids"]
    return RecallItem(ids, code, context_tokens, depth)


def make_items(tokenizer, lengths: list[int], per_length: int, seed: int = 0) -> list[RecallItem]:
    """``per_length`` items per context length, depths spread evenly over the context."""
    rng = random.Random(seed)
    return [make_item(tokenizer, length, (i + 0.5) / per_length, rng) for length in lengths
            for i in range(per_length)]


def recall_engine(model, tokenizer, items: list[RecallItem], kv_format: str = "auto") -> LLMEngine:
    """The engine `run_recall` answers with: 8 sequences at a time, a step budget sized to the prompts."""
    longest = max(len(i.prompt_ids) for i in items) + 8
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(kv_cache_dtype=kv_format),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=max(512, min(longest, 2048)),
                                                      max_num_seqs=8))


def run_recall(model, tokenizer, items: list[RecallItem], kv_format: str = "auto", *,
               progress: bool = False, engine: LLMEngine | None = None) -> pd.DataFrame:
    """Greedy answers through an engine with the given KV format (or through ``engine``, e.g. to read its metrics
    afterwards); one row per item with ``correct``."""
    engine = engine or recall_engine(model, tokenizer, items, kv_format)
    outputs = engine.generate([i.prompt_ids for i in items], SamplingParams(max_tokens=8), progress=progress)
    rows = []
    for item, out in zip(items, outputs, strict=True):
        answer = out.text.strip().split()[0].rstrip(".") if out.text.strip() else ""
        rows.append({"kv_format": kv_format, "context_tokens": item.context_tokens, "depth": item.depth,
                     "prompt_tokens": len(item.prompt_ids), "expected": item.answer, "answer": answer,
                     "correct": answer == item.answer})
    return pd.DataFrame(rows)
