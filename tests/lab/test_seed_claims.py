"""The seed claims of chapters 1-8: every number, worked example, threshold and rule of thumb the seed states is a
row of datasets/seed_claims/chNN.csv that points at a cell of the chapter's notebook, and every recomputation runs."""

from __future__ import annotations

import importlib
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from workbench.lab.kit import seed_claims as kit

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = {f"ch0{i}": next((ROOT / "notebooks").glob(f"ch0{i}_*.ipynb")) for i in range(1, 9)}


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_claim_points_at_a_cell_of_its_notebook(chapter):
    claims = kit.load(chapter)
    nb = nbformat.read(CHAPTERS[chapter], as_version=4)
    ids = {cell.get("id") for cell in nb.cells}
    assert len(claims) >= 15, f"{chapter}: only {len(claims)} claims listed"
    missing = sorted(set(claims["cell"]) - ids)
    assert missing == [], f"{chapter}: rows point at cells the notebook does not have: {missing}"
    shown = [cell for cell in nb.cells if cell.cell_type == "code" and f"{chapter}.seed_claims()" in cell.source]
    assert [cell.get("id") for cell in shown] == ["seedclm1"], f"{chapter}: the table's cell is missing or doubled"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_recomputation_runs_and_says_something(chapter):
    module = importlib.import_module(f"workbench.lab.{chapter}.seed")
    table = module.seed_claims()
    claims = kit.load(chapter)
    assert len(table) == len(claims) and (table["found here"].str.len() > 10).all()
    unused = sorted(set(module.CHECKS) - set(claims["check"]))
    assert unused == [], f"{chapter}: checks no row uses: {unused}"
    aside = claims[claims["treatment"] == "set aside"]
    assert all(row["check"] or row["cell"] != "seedclm1" for _, row in aside.iterrows()), \
        "a claim set aside in the table's own cell needs a check that says why"


def test_the_loader_refuses_bad_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(kit, "CLAIMS_DIR", tmp_path)
    good = {"id": ["a"], "section": ["s"], "seed says": ["x"], "kind": ["number"], "treatment": ["measured"],
            "cell": ["c1"], "check": [""]}
    pd.DataFrame(good).to_csv(tmp_path / "ch99.csv", index=False)
    assert len(kit.load("ch99")) == 1
    pd.DataFrame({**good, "kind": ["guess"]}).to_csv(tmp_path / "ch99.csv", index=False)
    with pytest.raises(ValueError, match="kind"):
        kit.load("ch99")
    pd.DataFrame({**good, "check": ["nope"]}).to_csv(tmp_path / "ch99.csv", index=False)
    with pytest.raises(ValueError, match="not in the chapter's seed module"):
        kit.table("ch99", {})
