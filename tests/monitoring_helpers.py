"""Helpers for the monitoring tests: the real tokenizer over a 2-layer random-weight model with SmolLM2's
shapes and full vocabulary (so the server accepts text, and a step takes milliseconds), served on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from tiny_models import tiny_model

import workbench
from workbench.config import CacheConfig, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.serve.launch import ServerThread

MODEL = "tiny-smollm2"


@cache
def tiny_full_vocab_model():
    return tiny_model(seed=5, num_layers=2, intermediate_size=256)


@cache
def tokenizer():
    return workbench.load_tokenizer("smollm2-135m")


def tiny_engine(*, num_blocks: int = 256, spec: bool = False, **scheduler) -> LLMEngine:
    return LLMEngine(tiny_full_vocab_model(), tokenizer(), cache_config=CacheConfig(num_blocks=num_blocks),
                     scheduler_config=SchedulerConfig(**scheduler),
                     spec_config=SpecConfig("ngram", 2) if spec else None)


@contextmanager
def tiny_server(engine: LLMEngine | None = None) -> Iterator[ServerThread]:
    with ServerThread(engine or tiny_engine(), model_name=MODEL) as server:
        yield server
