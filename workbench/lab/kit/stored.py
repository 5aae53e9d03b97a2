"""Static copies of the lab's figures, tables and status lines, as notebook outputs a reader needs no kernel for.

A chapter is read in three places: live in JupyterLab, in a stored notebook (JupyterLab or a repository
browser before anything runs) and on the offline docs site. Widget views only render with a live kernel, so
every panel also publishes what it shows as ordinary display outputs: a figure as plotly JSON (interactive in
JupyterLab with no kernel), an HTML copy (what the docs site renders, with plotly.js served by the site) and a
PNG (for viewers that run no JavaScript); a table or status line as HTML and plain text.

PNGs come from plotly's own static export, kaleido, which drives an installed Chrome or Chromium. One
browser session serves every figure of a notebook (the first image takes seconds while it starts, later ones
~0.3 s). Without a browser the live panels still work and say once that the PNG fallback is skipped; with
``WORKBENCH_REQUIRE_PNG=1`` (set by ``notebooks/refresh_outputs.py``) a missing browser is an error, so a stored
notebook can never carry a figure without its PNG. kaleido itself does not say so: its server thread dies on a
missing browser and every request then waits forever, so the browser is looked for first and the first image
has a deadline (`PngExport`).
"""

from __future__ import annotations

import atexit
import base64
import html
import io
import itertools
import json
import os
import threading
import warnings

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PNG_WIDTH = 1000  # px: the width of JupyterLab's output area at a common window size
REQUIRE_PNG_ENV = "WORKBENCH_REQUIRE_PNG"

_div_ids = itertools.count()


class PngExport:
    """One kaleido browser session for the whole process, started on first use and stopped at exit."""

    # The first image starts the browser (seconds); past this, kaleido's server is taken for dead.
    FIRST_IMAGE_TIMEOUT_S = 120.0

    def __init__(self) -> None:
        self.started = self.answered = False
        self.skipped_because: str | None = None

    def __call__(self, fig: go.Figure) -> bytes | None:
        if self.skipped_because is not None:
            return None
        try:
            self._start()
            image = self._render(fig) if self.answered else self._first_render(fig)
        except Exception as error:  # kaleido raises its own types for a missing browser; all mean the same here
            reason = f"{type(error).__name__}: {error}".strip()
            if os.environ.get(REQUIRE_PNG_ENV) == "1":
                raise RuntimeError(f"could not render a PNG copy of a figure ({reason}); stored notebooks need "
                                   "one: install Chromium (apt-get install chromium)") from error
            self.skipped_because = reason
            print(f"Note: PNG copies of figures are skipped (no browser for plotly's static export: {reason}). "
                  "The interactive figures are unaffected.")
            return None
        return compact_png(image)

    @staticmethod
    def _render(fig: go.Figure) -> bytes:
        with warnings.catch_warnings():
            # plotly passes its default options along, which a running kaleido server ignores (and says so).
            warnings.simplefilter("ignore", UserWarning)
            return fig.to_image(format="png", width=PNG_WIDTH, height=fig.layout.height or 450)

    def _first_render(self, fig: go.Figure) -> bytes:
        """The first image, on a thread with a deadline: a kaleido server that died while starting its browser
        (one that crashes at launch, say) never answers, and the caller would wait forever."""
        result: dict[str, object] = {}

        def render() -> None:
            try:
                result["image"] = self._render(fig)
            except Exception as error:  # noqa: BLE001 - handed to the caller below
                result["error"] = error

        worker = threading.Thread(target=render, name="first-png", daemon=True)
        worker.start()
        worker.join(self.FIRST_IMAGE_TIMEOUT_S)
        if worker.is_alive():
            raise TimeoutError(f"kaleido's browser gave no image within {self.FIRST_IMAGE_TIMEOUT_S:.0f} s")
        if "error" in result:
            raise result["error"]  # type: ignore[misc]
        self.answered = True
        return result["image"]  # type: ignore[return-value]

    def _start(self) -> None:
        if self.started:
            return
        find_browser()
        import kaleido

        kaleido.start_sync_server(silence_warnings=True)
        atexit.register(kaleido.stop_sync_server, silence_warnings=True)
        self.started = True


def find_browser() -> str:
    """The Chrome or Chromium kaleido will drive (``BROWSER_PATH`` first, as kaleido does); FileNotFoundError if
    there is none. Looked up through choreographer, kaleido's browser driver; if its lookup moves, kaleido's own
    start is left to find out (the first image's deadline still applies)."""
    path = os.environ.get("BROWSER_PATH")
    if not path:
        try:
            from choreographer.browsers.chromium import Chromium
        except ImportError:
            return ""
        path = Chromium.find_browser(skip_local=False)
    if not path or not os.path.isfile(path):
        where = f" at BROWSER_PATH={path!r}" if os.environ.get("BROWSER_PATH") else ""
        raise FileNotFoundError(f"no Chrome or Chromium found{where}")
    return path


png_export = PngExport()

# A chart is flat colours plus anti-aliased edges: 128 palette colours keep it indistinguishable by eye and make
# the PNG ~4x smaller (measured on chapter 1's figures: 93 KB -> 22 KB), which keeps each notebook under 1 MB.
PNG_COLORS = 128


def compact_png(image: bytes) -> bytes:
    from PIL import Image

    palette = Image.open(io.BytesIO(image)).convert("RGB").quantize(colors=PNG_COLORS,
                                                                   method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def figure_bundle(fig: go.Figure, *, png: bool = True) -> dict[str, object]:
    """The MIME bundle of one figure: plotly JSON, an HTML copy for the docs site, a PNG, and a text line; each
    from the figure made readable (`workbench.lab.kit.figures.readable`: log ticks, unclipped labels, ...)."""
    from workbench.lab.kit.figures import readable

    spec = without_unused_template_data(json.loads(pio.to_json(readable(fig), validate=False, remove_uids=True)))
    fig = go.Figure(spec)
    bundle: dict[str, object] = {PLOTLY_MIME: spec}
    bundle["text/html"] = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"wb-fig-{next(_div_ids)}",
                                      config={"responsive": True})
    if png and (image := png_export(fig)) is not None:
        bundle["image/png"] = base64.b64encode(image).decode("ascii")
    bundle["text/plain"] = f"<figure: {figure_title(fig)}>"
    return bundle


def without_unused_template_data(spec: dict) -> dict:
    """``spec`` with its template's per-trace-type defaults kept only for the trace types the figure draws. The
    theme repeats them for all ~40 types (about 5 KB per figure, stored twice: the JSON and the HTML copy); the
    ones a figure does not draw cannot change how it looks."""
    template = spec.get("layout", {}).get("template", {})
    if isinstance(template.get("data"), dict):
        used = {trace.get("type", "scatter") for trace in spec.get("data", [])}
        template["data"] = {kind: value for kind, value in template["data"].items() if kind in used}
    return spec


def figure_title(fig: go.Figure) -> str:
    title = fig.layout.title
    return (title.text or "untitled") if title else "untitled"


def table_bundle(frame: pd.DataFrame, caption: str = "", *, float_format: str = "{:,.3g}") -> dict[str, object]:
    """A table as HTML (with a caption) and as aligned plain text."""
    formatters = {c: float_format.format for c in frame.columns if pd.api.types.is_float_dtype(frame[c])}
    table_html = frame.to_html(formatters=formatters, border=0, classes="wb-table")
    text = frame.to_string(formatters=formatters)
    if caption:
        table_html = f"<p><b>{html.escape(caption)}</b></p>{table_html}"
        text = f"{caption}\n{text}"
    return {"text/html": table_html, "text/plain": text}


def html_bundle(markup: str) -> dict[str, object]:
    """A status line: HTML, and its text with the tags stripped."""
    return {"text/html": markup, "text/plain": _strip_tags(markup)}


def _strip_tags(markup: str) -> str:
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", "\n", markup)))


def show_figure(fig: go.Figure) -> None:
    """Display a figure that has no controls, stored the way panels store theirs (plotly JSON, HTML, PNG)."""
    from IPython.display import display

    display(figure_bundle(fig), raw=True)
