"""What a speculative proposer may read of a sequence: a typed view, so proposers need not import the engine.

The engine's ``workbench.engine.sequence.Sequence`` satisfies it; proposers only read these attributes and
never write them (the engine's bookkeeping owns every one).
"""

from __future__ import annotations

from typing import Protocol

import torch

from workbench.config import SamplingParams


class DraftingSequence(Protocol):
    @property
    def seq_id(self) -> int: ...

    @property
    def token_ids(self) -> list[int]: ...  # the prompt, then every generated token

    @property
    def num_cached_prompt_tokens(self) -> int: ...  # served from the prefix cache at admission

    @property
    def params(self) -> SamplingParams: ...

    @property
    def generator(self) -> torch.Generator | None: ...
