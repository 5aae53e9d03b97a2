"""What a chapter's kernel holds in memory, said where the learner moves on to the next chapter.

Every chapter loads its own model in its own kernel, and JupyterLab keeps a kernel running after its notebook is
closed: a learner who opened three chapters had three kernels of about 1.6-1.8 GB each (the float32 model is
0.5 GiB, and the CPU path keeps a oneDNN-packed copy of its linear weights beside it, `workbench.models.
cpu_linear`). On an 8 GB laptop that is the difference between a working machine and a swapping one, so each
chapter ends by saying how much its kernel holds and how to let it go.
"""

from __future__ import annotations

import resource
from pathlib import Path

from torch import nn

STATUS = Path("/proc/self/status")


def kernel_memory_bytes() -> int:
    """This process's resident memory now (its peak where /proc is absent)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def model_bytes(model: nn.Module) -> int:
    """A model's weights and buffers, and the packed copies the CPU path keeps beside them."""
    return weight_bytes(model) + packed_bytes(model)


def weight_bytes(model: nn.Module) -> int:
    """The model's own parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def packed_bytes(model: nn.Module) -> int:
    """The copies of the weights the CPU path keeps packed for its matrix library (oneDNN), beside the weights."""
    total = 0
    for module in model.modules():
        packed = getattr(module, "packed", None)
        if packed is not None and hasattr(packed, "element_size"):
            total += packed.numel() * packed.element_size()
    return total


def memory_note(model: nn.Module | None = None) -> str:
    """One Markdown paragraph: what this kernel holds, the model's share, and how to free it."""
    held, share = kernel_memory_bytes() / 2**30, ""
    if model is not None:
        weights, packed = weight_bytes(model), packed_bytes(model)
        share = (f", {(weights + packed) / 2**30:.2f} GiB of it the model ({weights / 2**30:.2f} GiB of weights"
                 + (f" and a {packed / 2**30:.2f} GiB packed copy the CPU path multiplies with)" if packed else ")"))
    return (f"This chapter's kernel holds **{held:.1f} GiB** of memory{share}. JupyterLab keeps it running after "
            "you close the notebook, and every chapter loads its own model: before opening the next chapter, shut "
            "this one's kernel down (*Kernel ▸ Shut Down Kernel*, or *Running Terminals and Kernels ▸ Shut Down "
            "All* in the left sidebar).")


def show_memory_note(model: nn.Module | None = None) -> None:
    """Display ``memory_note`` as Markdown, with the same words as plain text."""
    from IPython.display import display

    text = memory_note(model)
    display({"text/markdown": text, "text/plain": text.replace("**", "").replace("*", "")}, raw=True)
