"""mkdocs hooks that make the course site whole and offline.

- The chapter notebooks stay where learners open them (``notebooks/``); they join the site as pages here, in
  file order, before mkdocs-jupyter turns them into HTML (hence the higher event priority).
- plotly.js and MathJax are copied from installed Python packages (plotly's own bundle; MathJax 2 from
  jupyter-server-mathjax) into the built site, so a page loads nothing from any other host: CI and workshop
  rooms have no internet, and a CDN fetch there would leave every figure blank.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import plotly
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def plotly_bundle() -> Path:
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def mathjax_dir() -> Path:
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def chapter_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("ch[0-9][0-9]_*.ipynb"))


@event_priority(100)  # before mkdocs-jupyter's on_files, which converts .ipynb files into pages
def on_files(files: Files, config) -> Files:
    for path in chapter_notebooks():
        # A plain File whose source folder is notebooks/ (mkdocs-jupyter cannot wrap a generated File).
        files.append(File(path.name, src_dir=str(NOTEBOOKS), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


CHAPTERS_MARK = "<!-- chapters: filled in by docs/hooks.py from each notebook's title and first paragraph -->"


def chapter_summary(path: Path) -> tuple[str, str]:
    """The notebook's H1 title and the first sentence of the paragraph under it."""
    cells = json.loads(path.read_text())["cells"]
    lines = "".join(cells[0]["source"]).strip().splitlines() if cells else []
    title = lines[0].lstrip("# ").strip() if lines else path.stem
    paragraph = " ".join(line.strip() for line in lines[1:] if line.strip()).split(". ")[0].rstrip(".")
    return title, paragraph + "." if paragraph else ""


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CHAPTERS_MARK not in markdown:
        return markdown
    rows = ["| chapter | what it is about |", "| --- | --- |"]
    for path in chapter_notebooks():
        title, summary = chapter_summary(path)
        rows.append(f"| [{title}]({path.name}) | {summary.replace('|', '/')} |")  # a link mkdocs resolves and checks
    return markdown.replace(CHAPTERS_MARK, "\n".join(rows))


def on_post_build(config) -> None:
    assets = Path(config["site_dir"]) / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    shutil.copy2(plotly_bundle(), assets / "plotly.min.js")
    target = assets / "mathjax"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(mathjax_dir(), target)
