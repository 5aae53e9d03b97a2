"""The course site: `mkdocs build` from the stored notebooks, then every chapter page opened in headless
Chromium with every host but 127.0.0.1 blocked. Each stored figure must render as a laid-out plotly plot, the
page must log no error and ask no other host for anything; screenshots of two pages go to test-artifacts/."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest
from browser_helpers import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, require_chromium
from notebook_outputs import count_figures

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("ch[0-9][0-9]_*.ipynb"))
SCREENSHOTS = {"ch01_attention", "ch02_kv_cache"}

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _font_probe(msg) -> bool:
    """MathJax 2 probes web-font support with an @font-face at about:blank, which Chromium refuses (and logs, with
    a follow-up 'net::ERR_FAILED' at the same address): a detection step, not a failed load. Anything else counts."""
    location = (msg.location or {}).get("url", "")
    return "about:blank" in msg.text or (location == "about:blank" and "ERR_FAILED" in msg.text)


def _has_math(chapter: Path) -> bool:
    nb = nbformat.read(chapter, as_version=4)
    return any(re.search(r"\$[^$\n]+\$", cell.source) for cell in nb.cells if cell.cell_type == "markdown")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test reports failures itself
        pass


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def test_site_has_a_page_per_chapter_and_no_cdn(site):
    for chapter in CHAPTERS:
        page = (site / chapter.stem / "index.html").read_text()
        assert "../assets/plotly.min.js" in page and "require.min.js" not in page
        assert 'src="http' not in page and "fonts.googleapis" not in page
    index = (site / "index.html").read_text()
    assert all(f"{c.stem}/" in index for c in CHAPTERS) and "Headline numbers" in index
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    assert (site / "assets" / "mathjax" / "MathJax.js").exists()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_stored_figure_renders_offline(browser, served, chapter):
    expected = count_figures(nbformat.read(chapter, as_version=4))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    blocked, errors = [], []
    page.route("**/*", lambda route: route.continue_() if urlparse(route.request.url).hostname == "127.0.0.1"
               else (blocked.append(route.request.url), route.abort()))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" and not _font_probe(msg) else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    try:
        page.goto(f"{served}/{chapter.stem}/", wait_until="load")
        page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot').length >= {expected}",
                               timeout=60_000)
        plots = page.eval_on_selector_all(
            ".js-plotly-plot", "els => els.map(e => ({w: e.getBoundingClientRect().width,"
            " h: e.getBoundingClientRect().height, traces: (e._fullData || []).length}))")
        assert len(plots) == expected
        assert all(p["w"] > 300 and p["h"] > 200 and p["traces"] >= 1 for p in plots), plots
        assert page.evaluate("() => typeof window.MathJax === 'object'")
        if _has_math(chapter):  # typeset from the site's own MathJax and font, or this fails on a 404 below
            page.wait_for_function("() => document.querySelectorAll('.MathJax, .MathJax_Display').length > 0",
                                   timeout=60_000)
            page.evaluate("() => new Promise(done => MathJax.Hub.Queue(done))")
        assert blocked == [] and errors == [], (blocked, errors)
        text = page.inner_text("article")
        assert "VBox(children" not in text and "HBox(children" not in text, "a widget printed as its text repr"
        if "live controls" not in text:
            raise AssertionError("no panel says where its live controls are")
        wraps = page.eval_on_selector_all(".jp-InputArea pre", "els => els.map(e => getComputedStyle(e).whiteSpace)")
        assert wraps and set(wraps) == {"pre-wrap"}, f"code cells are cut off instead of wrapping: {set(wraps)}"
        if chapter.stem in SCREENSHOTS or os.environ.get("WORKBENCH_DOCS_SCREENSHOTS") == "all":
            ARTIFACTS.mkdir(exist_ok=True)
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"docs_{chapter.stem}.png"))
    finally:
        page.close()
