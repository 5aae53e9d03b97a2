"""Every number, worked example, threshold and rule of thumb a seed chapter states, each with the notebook cell
that recomputes it, measures it, or sets it aside with a reason.

Seed examples are often internally inconsistent (a figure that does not follow from its own formula, a model that
does not fit the GPU it is placed on), so each claim is recomputed, not quoted. The list is data,
``datasets/seed_claims/chNN.csv``, one row per claim:

- ``id``: a short stable name; ``section``: the book section it is in; ``seed says``: the claim, quoted or closely
  paraphrased;
- ``kind``: number, worked example, threshold or rule of thumb;
- ``treatment``: recomputed (arithmetic), measured (on this machine), or set aside (with why);
- ``cell``: the id of the notebook cell that shows it (``tests/lab/test_seed_claims.py`` checks that it exists);
- ``check``: the name of a function in the chapter's ``seed`` module that recomputes the claim and returns what
  it found (empty when the cell itself is the recomputation or the measurement).

``table`` runs every check and returns the whole list, which each chapter shows in one cell near its end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

import pandas as pd

from workbench.paths import DATASETS_DIR

COLUMNS = ("id", "section", "seed says", "kind", "treatment", "cell", "check")
KINDS = ("number", "worked example", "threshold", "rule of thumb")
TREATMENTS = ("recomputed", "measured", "set aside")
CLAIMS_DIR = DATASETS_DIR / "seed_claims"


def load(chapter: str) -> pd.DataFrame:
    """The chapter's claims, validated: every column present, kinds and treatments from their vocabularies."""
    path = CLAIMS_DIR / f"{chapter}.csv"
    if not path.exists():
        raise ValueError(f"no seed-claims table for {chapter!r} ({path})")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path.name} lacks columns {missing}")
    for column, allowed in (("kind", KINDS), ("treatment", TREATMENTS)):
        bad = sorted(set(frame[column]) - set(allowed))
        if bad:
            raise ValueError(f"{path.name}: {column} {bad} not in {allowed}")
    if frame["id"].duplicated().any():
        raise ValueError(f"{path.name}: duplicate ids {sorted(frame.loc[frame['id'].duplicated(), 'id'])}")
    return frame


def cell_labels(chapter: str) -> dict[str, str]:
    """Each cell id of the chapter's notebook as a reader can find it: a code cell by the number its first line
    gives it ("6.2"), a markdown cell by its section ("section 6"); this table's own cell as "this table". Cell
    ids are not shown by JupyterLab or the docs site. Empty where the notebook is not beside the datasets."""
    paths = sorted((DATASETS_DIR.parent / "notebooks").glob(f"{chapter}_*.ipynb"))
    if not paths:
        return {}
    labels, section = {}, ""
    for cell in json.loads(paths[0].read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = re.search(r"^## (\d+)\.", source, re.MULTILINE)
            section = heading.group(1) if heading else section
            labels[cell.get("id", "")] = f"section {section}" if section else "the introduction"
        else:
            number = re.match(r"#\s*(\d+(?:\.\d+)*[a-z]?)\b", source)
            labels[cell.get("id", "")] = number.group(1) if number else f"section {section}"
    labels["seedclm1"] = "this table"
    return labels


def table(chapter: str, checks: Mapping[str, Callable[[], str]]) -> pd.DataFrame:
    """Every claim with what this chapter finds for it: its check's answer, or where the notebook shows it (the
    cell by the number a reader sees, `cell_labels`)."""
    frame = load(chapter)
    unknown = sorted(set(frame["check"]) - set(checks) - {""})
    if unknown:
        raise ValueError(f"{chapter}: checks {unknown} are not in the chapter's seed module")
    labels = cell_labels(chapter)
    where = [labels.get(cell, f"cell {cell}") for cell in frame["cell"]]
    found = [checks[row["check"]]() if row["check"] else f"{row['treatment']} in {place}"
             for place, (_, row) in zip(where, frame.iterrows(), strict=True)]
    return pd.DataFrame({"the book says": frame["seed says"], "kind": frame["kind"], "treatment": frame["treatment"],
                         "found here": found, "shown in": where})
