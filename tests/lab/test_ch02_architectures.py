"""Chapter 2's section on the 2025-26 architectures: the sizes it plots, the panel's controls, the allocator run
live and the what-if, without a browser."""

from __future__ import annotations

import json

import pytest
import torch

import workbench
from workbench.lab.ch02.architectures import (
    WHATIF_PATH,
    architecture_sizes,
    cached_whatif,
    sliding_run,
    whatif_quality,
    whatif_reading,
)
from workbench.lab.ch02.panels_architectures import ArchitectureLab, WindowWhatIfLab, sliding_figure, whatif_figure
from workbench.lab.kit.figures import trace
from workbench.quality.window_whatif import heldout_ids, perplexity, windowed_spec, with_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_sizes_match_the_hand_calculations():
    sizes = architecture_sizes(contexts=(8192, 131072))
    assert sizes.per_sequence("deepseek-v3", 8192) == 8192 * (512 + 64) * 61 * 2
    assert sizes.per_sequence("llama-3.1-8b", 131072) == 131072 * 2 * 32 * 8 * 128 * 2
    gemma = 10 * 131072 * 8192 + 52 * 1024 * 8192  # 2 x 16 KV heads x 128 x 2 bytes per layer and token
    assert sizes.per_sequence("gemma-3-27b", 131072) == gemma
    assert sizes.per_token("gemma-3-27b", 131072) < sizes.per_token("gemma-3-27b", 8192)  # windows amortize
    assert sizes.sequences("llama-3.1-70b", 131072) == int(80e9 * 0.9) // (131072 * 2 * 80 * 8 * 128 * 2)


def test_panel_reads_mla_staying_whole_under_tp():
    lab = ArchitectureLab(context=32768).run()
    one = list(trace(lab.figure, "mla").x)
    assert "32,768 tokens" in lab.status.value and "TP 1" in lab.status.value
    lab.tp.value = 8
    assert list(trace(lab.figure, "mla").x) == one, "TP does not split MLA's latent"
    assert sum(trace(lab.figure, "full").x) < sum(architecture_sizes(contexts=(32768,)).frame["bytes_per_sequence"]
                                                  [lambda s: s > 0]) / 2**30
    assert "copies MLA's single latent" in lab.status.value
    assert lab.stored_tables()[0][1].loc["deepseek-v3", "mla"] > 0


def test_the_allocator_run_frees_as_the_window_slides(tiny_model):
    model = workbench.random_model(tiny_model.spec.replace(num_layers=6), device="cpu")
    run = sliding_run(model, window=32, prompt_tokens=96, new_tokens=40, chunk=32)
    assert run.frame["slid_blocks"].iloc[-1] > 0
    assert run.flat_window_blocks <= -(-(32 - 1 + 32) // 16) + 1  # the window behind a chunk, whatever the length
    assert run.full_blocks_at_end == -(-int(run.frame["tokens"].iloc[-1]) // 16)
    assert len(sliding_figure(run).data) == len(run.window_groups) + len(run.full_groups) + 1


def test_window_wider_than_the_text_changes_nothing_and_a_narrow_one_costs(real_model, tokenizer):
    ids = heldout_ids(tokenizer, 160)
    full = perplexity(real_model, ids)
    assert perplexity(with_spec(real_model, windowed_spec(real_model.spec, 1000)), ids) == pytest.approx(full,
                                                                                                         rel=1e-5)
    assert perplexity(with_spec(real_model, windowed_spec(real_model.spec, 8)), ids) > full
    with pytest.raises(ValueError, match="shapes"):
        with_spec(real_model, real_model.spec.replace(num_layers=2))


@pytest.mark.slow
def test_whatif_table_puts_quality_beside_memory(real_model, tokenizer):
    table = whatif_quality(real_model, tokenizer, windows=(32,), lengths=(96,), per_length=1, heldout_tokens=128,
                           chunk=32)  # prompts longer than window + chunk: the window holds less at the peak
    assert list(table["window"]) == [0, 32]
    window = table.iloc[1]
    assert window["kv_vs_full"] < 1 and window["peak_vs_full"] < 1
    assert window["perplexity_vs_full"] > 1
    assert torch.isfinite(torch.tensor(window["perplexity_past_window"]))
    assert len(whatif_figure(table).data) == 4


def test_the_stored_what_if_is_shown_at_once_with_where_it_ran(tmp_path):
    stored = cached_whatif()
    assert stored.cached and list(stored.table["window"]) == [0, 128, 512, 1024]
    assert "benchmarks/bench_window_whatif.py" in stored.source and "2026-11-26" in stored.source
    reading = whatif_reading(stored.table)
    assert "A 128-token window keeps 22% of the KV of a 2,048-token sequence" in reading
    assert "past the window its perplexity is 79.0 against full attention's 28.1" in reading
    lab = WindowWhatIfLab(None, None).run()  # the stored run needs no model: nothing is measured
    assert not lab.live and not lab.button.disabled and stored.source in lab.status.value
    assert len(lab.figure.data) == 2 * len(stored.table) and "CACHED" in lab.figure.layout.title.subtitle.text
    assert lab.stored_tables()[0][1].loc["full (as trained)", "recall@2048"] == 1.0
    bare = {key: value for key, value in json.loads(WHATIF_PATH.read_text()).items() if key != "machine"}
    (tmp_path / "old.json").write_text(json.dumps(bare))
    with pytest.raises(ValueError, match="machine"):
        cached_whatif(tmp_path / "old.json")
    with pytest.raises(FileNotFoundError, match="bench_window_whatif.py --json"):
        cached_whatif(tmp_path / "none.json")


def test_the_button_re_runs_the_what_if_live(tiny_model, tokenizer):
    model = workbench.random_model(tiny_model.spec.replace(num_layers=6), device="cpu")
    lab = WindowWhatIfLab(model, tokenizer, live_sizes={"windows": (32,), "lengths": (96,), "per_length": 1}).run()
    lab.button.click()
    assert lab.live and not lab.result.cached and not lab.button.disabled
    assert list(lab.result.table["window"]) == [0, 32] and "measured live in this kernel" in lab.status.value
    assert "measured here" in lab.figure.layout.title.subtitle.text
