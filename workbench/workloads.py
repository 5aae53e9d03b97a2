"""Workloads: who arrives when, with what prompt, wanting how many tokens.

A workload is a list of ``WorkloadRequest``. The shapes the course keeps coming back to have generators here
(shared system prompt, mixed short/long outputs, long prompts arriving among decoders, Poisson arrivals), and
small fixed sets live as JSONL files in ``datasets/workloads`` so that notebooks and benchmarks replay exactly
the same requests. Output lengths are forced with ``ignore_eos`` where a benchmark needs them fixed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from workbench.config import SamplingParams
from workbench.paths import DATASETS_DIR
from workbench.prompts import encode_prompt

WORKLOADS_DIR = DATASETS_DIR / "workloads"


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    prompt: str | list[int]
    max_tokens: int = 64
    arrival_s: float = 0.0  # seconds after the workload starts
    system: str | None = None  # system prompt, placed before the user prompt by the chat template
    ignore_eos: bool = False
    temperature: float = 0.0
    tags: dict[str, str] = field(default_factory=dict)

    def sampling_params(self, **overrides) -> SamplingParams:
        values = {"max_tokens": self.max_tokens, "ignore_eos": self.ignore_eos, "temperature": self.temperature,
                  "seed": 0 if self.temperature > 0 else None}
        values.update(overrides)
        return SamplingParams(**values)


def load_workload(name_or_path: str | Path) -> list[WorkloadRequest]:
    """A workload from ``datasets/workloads/<name>.jsonl`` (or any JSONL path)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = WORKLOADS_DIR / f"{name_or_path}.jsonl"
    if not path.is_file():
        names = sorted(p.stem for p in WORKLOADS_DIR.glob("*.jsonl"))
        raise ValueError(f"unknown workload {str(name_or_path)!r}: choose one of {names} or give a .jsonl path")
    return [WorkloadRequest(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def with_arrivals(workload: list[WorkloadRequest], rate_per_s: float | None, seed: int = 0) -> list[WorkloadRequest]:
    """Poisson arrivals at ``rate_per_s`` (None: everything at t = 0), keeping the requests' order."""
    if rate_per_s is None:
        return [replace(r, arrival_s=0.0) for r in workload]
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0 or None, got {rate_per_s}")
    rng, t, out = random.Random(seed), 0.0, []
    for r in workload:
        out.append(replace(r, arrival_s=t))
        t += rng.expovariate(rate_per_s)
    return out


# ----------------------------------------------------------------------------------------------------------
_TOPICS = ["the water cycle", "how vaccines work", "binary search", "the French revolution", "photosynthesis",
           "compound interest", "how a bicycle stays upright", "volcanoes", "the TCP handshake", "black holes",
           "how bread rises", "the Pythagorean theorem", "plate tectonics", "why the sky is blue",
           "how a transistor works", "the history of the printing press"]
_ASKS = ["Explain {} in two sentences.", "Give three facts about {}.", "Write a short poem about {}.",
         "What is the most surprising thing about {}?", "Summarize {} for a child."]


def questions(n: int, seed: int = 0) -> list[str]:
    """``n`` varied short user questions."""
    rng = random.Random(seed)
    return [rng.choice(_ASKS).format(rng.choice(_TOPICS)) for _ in range(n)]


def shared_system_prompt(n: int, system: str, *, max_tokens: int = 32, seed: int = 0) -> list[WorkloadRequest]:
    """Chat requests that all start with the same (long) system prompt: the prefix-caching workload."""
    return [WorkloadRequest(q, max_tokens, system=system, tags={"shape": "shared_system"})
            for q in questions(n, seed)]


def mixed_lengths(n: int, *, prompt_tokens: tuple[int, int] = (16, 256), output_tokens: tuple[int, int] = (8, 128),
                  vocab: tuple[int, int] = (100, 30000), seed: int = 0) -> list[WorkloadRequest]:
    """Random-token prompts and forced output lengths drawn log-uniformly: many short, some long."""
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> int:
        return int(round(lo * (hi / lo) ** rng.random()))

    return [WorkloadRequest([rng.randrange(*vocab) for _ in range(log_uniform(*prompt_tokens))],
                            log_uniform(*output_tokens), ignore_eos=True, tags={"shape": "mixed"})
            for _ in range(n)]


def long_prompt_among_decoders(num_decoders: int = 4, *, decoder_prompt: int = 32, decoder_tokens: int = 64,
                               long_prompt: int = 1024, arrival_s: float = 0.5, seed: int = 0
                               ) -> list[WorkloadRequest]:
    """Short requests decoding when a long prompt arrives: the chunked-prefill stall workload."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 30000) for _ in range(n)]

    decoders = [WorkloadRequest(ids(decoder_prompt), decoder_tokens, ignore_eos=True, tags={"role": "decoder"})
                for _ in range(num_decoders)]
    return decoders + [WorkloadRequest(ids(long_prompt), 8, arrival_s=arrival_s, ignore_eos=True,
                                       tags={"role": "long_prompt"})]


# Sentences of a made-up help desk's standing instructions: the static prefix of chapter 2's prompts.
_MANUAL = [
    "You answer questions for the Northwind city library's help desk.",
    "Loans last three weeks and can be renewed twice unless another reader has reserved the item.",
    "Reading rooms open at nine and close at eight on weekdays, at five on Saturdays.",
    "Members may borrow up to twelve items at once, of which at most four may be films.",
    "Overdue items cost ten cents a day, capped at the replacement price of the item.",
    "Interlibrary loans take about ten days and are free for students and retired members.",
    "Lost cards are replaced at the front desk after showing an identity document.",
    "Printing costs five cents a page in black and twenty cents a page in colour.",
    "Group study rooms are booked online for up to three hours per day per member.",
    "Always answer briefly, cite the rule you used, and never invent a rule that is not listed here.",
]
NAMES = ["Ada", "Bram", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ines", "Jonas", "Kemal", "Lior"]


def static_instructions(tokenizer, num_tokens: int) -> str:
    """Standing instructions of about ``num_tokens`` tokens (whole sentences, cycling through the manual)."""
    sentences: list[str] = []
    while len(encode_prompt(tokenizer, " ".join(sentences) or "x", chat=False)) < num_tokens:
        sentences.append(f"Rule {len(sentences) + 1}: {_MANUAL[len(sentences) % len(_MANUAL)]}")
    return " ".join(sentences)


def prompt_of_length(tokenizer, num_tokens: int) -> list[int]:
    """Exactly ``num_tokens`` ids of ordinary English text (the standing instructions, as long as needed)."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    return encode_prompt(tokenizer, static_instructions(tokenizer, num_tokens), chat=False)[:num_tokens]
