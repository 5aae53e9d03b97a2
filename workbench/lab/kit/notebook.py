"""A notebook's frame: the plotly renderer pin, the device it measures on, and the label every figure carries
saying what it was measured on (device, dtype, model).

The renderer is pinned because plotly otherwise picks one from the environment, and notebooks saved from
different front ends would then store different MIME types (and some embed all of plotly.js). The model label
names the weights honestly: the real model's are dequantized Q4_1 (see README), random ones are noise.
"""

from __future__ import annotations

import os

import torch

RENDERER = "plotly_mimetype"
TEMPLATE = "plotly_white"
MiB = 2**20
GiB = 2**30

# The real model's weights are dequantized Q4_1 (see README): every label that names it says so.
REAL_MODEL_LABEL = "SmolLM2-135M-Instruct (dequantized Q4_1)"


def setup_notebook() -> None:
    """Pin the plotly renderer and template, and give torch the threads the machine can spare now (idempotent).
    Call once at the top of every notebook; each panel chooses its threads again before it measures
    (`workbench.lab.kit.threads`: on a shared 2-core machine, two threads beside a busy process collapse)."""
    import plotly.io as pio

    from workbench.lab.kit.threads import adapt_threads

    os.environ["PLOTLY_RENDERER"] = RENDERER
    pio.renderers.default = RENDERER
    pio.templates.default = TEMPLATE
    adapt_threads()


def notebook_device() -> torch.device:
    """CUDA when present, else the CPU: what every notebook measures on."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_label(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(device)}"
    threads = torch.get_num_threads()
    return f"CPU ({threads} thread{'' if threads == 1 else 's'})"


def device_memory_bytes(device: torch.device | str) -> int:
    """Memory of the device: a GPU's total memory, or the machine's RAM for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_label(model) -> str:
    name = model.spec.name
    return REAL_MODEL_LABEL if name.startswith("smollm2-135m") else f"{name} (random weights)"


def measured_on(model) -> str:
    """'<model> · <dtype> · <device>': the subtitle of every figure measured on a model."""
    return f"measured on {device_label(model.device)} · {dtype_name(model.dtype)} · {model_label(model)}"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def say(markdown: str) -> None:
    """Show a sentence built from results as Markdown, with the same words as its plain text, so a reader
    without a kernel (a text view, a diff, the tests) reads the sentence and not ``<...Markdown object>``."""
    from IPython.display import display

    display({"text/markdown": markdown, "text/plain": markdown}, raw=True)


def show_table(frame, *, index: bool = False) -> None:
    """Show a table as HTML and as whole plain text (a pandas Styler stores only its repr as text). The HTML table
    carries the class ``wb-prose``: its cells hold sentences, which the docs site may break anywhere rather than
    let a long token push the table past its column (docs/pages/stylesheets/course.css)."""
    import pandas as pd
    from IPython.display import display

    with pd.option_context("display.max_colwidth", None, "display.width", 10_000):
        display({"text/html": frame.to_html(index=index, classes="wb-prose"),
                 "text/plain": frame.to_string(index=index)}, raw=True)
