"""Each chapter can end by saying what its kernel holds and how to free it (`workbench.lab.kit.memory`)."""

from __future__ import annotations

import torch
from torch import nn

from workbench.lab.kit.memory import kernel_memory_bytes, memory_note, model_bytes


def test_the_kernel_s_memory_is_read_and_a_model_counts_its_packed_copies():
    held = kernel_memory_bytes()
    assert 50 * 2**20 < held < 64 * 2**30  # this process, with torch loaded
    layer = nn.Linear(64, 32)
    assert model_bytes(layer) == (64 * 32 + 32) * 4
    layer.packed = torch.empty(64 * 32)  # what workbench.models.cpu_linear keeps beside the weight
    assert model_bytes(layer) == (64 * 32 + 32) * 4 + 64 * 32 * 4


def test_the_note_says_how_much_and_how_to_shut_the_kernel_down(tiny_model):
    note = memory_note(tiny_model)
    assert "This chapter's kernel holds **" in note and "GiB of it the model" in note
    assert "Shut Down Kernel" in note
    assert "of it the model" not in memory_note()
