"""The course site: `mkdocs build` from the stored notebooks, then every chapter page opened in headless
Chromium with every host but 127.0.0.1 blocked. Each stored figure must render as a laid-out plotly plot, the
page must log no error and ask no other host for anything, no table may be wider than the column it sits in (at a
desktop and a laptop width), no output may show a Python object's repr instead of the object, and every chapter
ends with links to the previous and next pages; screenshots of two pages go to test-artifacts/."""

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
VIEWPORT_WIDTHS = (1400, 1000)  # a desktop, and a laptop where Material drops the right-hand table of contents
# What a notebook output shows when a display object was printed instead of displayed: <IPython.core.display.
# Markdown object>, <pandas.io.formats.style.Styler object at 0x...>, VBox(children=...), <Figure size ...>.
OBJECT_REPR = re.compile(r"<[A-Za-z_][\w.]*\.[A-Z]\w* (object|at 0x)[^>]*>|<\w+ object at 0x[0-9a-f]+>"
                         r"|\b[VH]Box\(children=|<Figure size \d|\bOutput\(\)|\bmatplotlib\.\w+\.\w+ at 0x")
# Each table's width against its output area's (a closing table's cells once ran on one line, 3,500-6,600 px in a
# 750 px column, the verdicts off-screen: mkdocs-jupyter lays tables out at max-content; docs course.css fixes it).
TABLE_WIDTHS = """() => Array.from(document.querySelectorAll('article table')).map(t => {
  const box = t.parentElement.closest('.jp-OutputArea-output, .jp-RenderedHTMLCommon, .jp-Cell, article');
  return {table: (t.className || 'table') + ': ' + t.innerText.slice(0, 50).replace(/\\s+/g, ' '),
          width: t.getBoundingClientRect().width, column: box.getBoundingClientRect().width};
})"""

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


def assert_no_object_repr(text: str) -> None:
    reprs = sorted({m.group(0) for m in OBJECT_REPR.finditer(text)})
    assert not reprs, f"outputs show object reprs instead of the objects: {reprs}"


def assert_tables_fit(page) -> None:
    """No table wider than its column, at each width in VIEWPORT_WIDTHS (one pixel of rounding allowed)."""
    for width in VIEWPORT_WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        tables = page.evaluate(TABLE_WIDTHS)
        too_wide = [f"{t['table']!r}: {t['width']:.0f} px in {t['column']:.0f} px" for t in tables
                    if t["width"] > t["column"] + 1]
        assert not too_wide, f"at a {width} px window, tables wider than their column: {too_wide}"
    page.set_viewport_size({"width": VIEWPORT_WIDTHS[0], "height": 1000})


def test_object_repr_pattern_catches_what_a_learner_would_see():
    for shown in ("<IPython.core.display.Markdown object>", "<pandas.io.formats.style.Styler at 0x7f3a2c1d>",
                  "<pandas.io.formats.style.Styler object at 0x7f3a2c1d90>", "VBox(children=(HTML(value=''),))",
                  "<workbench.lab.kit.panel.Panel object at 0x7f00>", "<Figure size 640x480 with 1 Axes>"):
        with pytest.raises(AssertionError, match="object reprs"):
            assert_no_object_repr(f"some output\n{shown}\nmore")
    assert_no_object_repr("decode <= 2x faster; a <b> tag; KV cache at 0x10 bytes; Output tokens")


def test_site_has_a_page_per_chapter_and_no_cdn(site):
    for chapter in CHAPTERS:
        page = (site / chapter.stem / "index.html").read_text()
        assert "../assets/plotly.min.js" in page and "require.min.js" not in page
        assert 'src="http' not in page and "fonts.googleapis" not in page
    index = (site / "index.html").read_text()
    assert all(f"{c.stem}/" in index for c in CHAPTERS) and "Headline numbers" in index
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    assert (site / "assets" / "mathjax" / "MathJax.js").exists()


def test_every_chapter_ends_with_previous_and_next_links(site):
    """Material's footer links (navigation.footer): a reader at a chapter's closing table goes on without
    scrolling back up to the navigation."""
    for i, chapter in enumerate(CHAPTERS):
        html = (site / chapter.stem / "index.html").read_text()
        links = {kind: href for href, kind in re.findall(
            r'<a href="([^"]*)" class="md-footer__link md-footer__link--(prev|next)"', html)}
        previous = f"../{CHAPTERS[i - 1].stem}/" if i else ".."  # the first chapter goes back to the index page
        following = f"../{CHAPTERS[i + 1].stem}/" if i + 1 < len(CHAPTERS) else None
        assert links.get("prev") == previous and links.get("next") == following, (chapter.stem, links)


def test_index_page_tables_fit_and_show_no_repr(browser, served):
    page = browser.new_page(viewport={"width": VIEWPORT_WIDTHS[0], "height": 1000})
    page.route("**/*", lambda route: route.continue_() if urlparse(route.request.url).hostname == "127.0.0.1"
               else route.abort())
    try:
        page.goto(f"{served}/", wait_until="load")
        assert_no_object_repr(page.inner_text("article"))
        assert_tables_fit(page)
    finally:
        page.close()


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
        assert_no_object_repr(text)
        assert_tables_fit(page)
        wraps = page.eval_on_selector_all(".jp-InputArea pre", "els => els.map(e => getComputedStyle(e).whiteSpace)")
        assert wraps and set(wraps) == {"pre-wrap"}, f"code cells are cut off instead of wrapping: {set(wraps)}"
        if chapter.stem in SCREENSHOTS or os.environ.get("WORKBENCH_DOCS_SCREENSHOTS") == "all":
            ARTIFACTS.mkdir(exist_ok=True)
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"docs_{chapter.stem}.png"))
    finally:
        page.close()
