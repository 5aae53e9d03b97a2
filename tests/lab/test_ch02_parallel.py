"""Chapter 2's multi-GPU section: per-GPU KV bytes against the TP degree (split, then replicated past the KV head
count), the seed's statements recomputed, and the figure's traces by name."""

from __future__ import annotations

from workbench.lab import ch02
from workbench.lab.kit.figures import trace


def test_the_sweep_splits_then_replicates():
    sweep = ch02.tp_sweep()
    llama = sweep.frame[sweep.frame["model"] == "llama-3-8b"].set_index("tp")
    assert list(llama.index) == [1, 2, 4, 8, 16]
    # 2 x 32 layers x 8 heads x 128 dims x 2 bytes unsplit; halves with each doubling up to 8 ranks, then stops.
    assert llama.loc[1, "kv_bytes_per_token_per_gpu"] == 2 * 32 * 8 * 128 * 2
    assert llama.loc[8, "kv_bytes_per_token_per_gpu"] == llama.loc[1, "kv_bytes_per_token_per_gpu"] // 8
    assert llama.loc[16, "kv_bytes_per_token_per_gpu"] == llama.loc[8, "kv_bytes_per_token_per_gpu"]
    assert llama.loc[16, "copies_per_head"] == 2 and sweep.cliff("llama-3-8b") == 8
    smol = sweep.frame[sweep.frame["model"] == "smollm2-135m"].set_index("tp")
    assert list(smol.index) == [1, 3, 9] and smol.loc[9, "copies_per_head"] == 3
    assert (sweep.frame["tokens_per_gpu"] >= 0).all()


def test_the_seeds_statements_are_recomputed():
    checks = ch02.parallel_seed_checks(ch02.tp_sweep())
    assert (checks.query_heads_per_gpu, checks.kv_heads_per_gpu) == (16, 2) and not checks.heads_claim_holds
    assert checks.layers_per_stage == [20, 20, 20, 20]
    assert checks.replicated_tp == 16 and checks.total_over_one_gpu == 2.0 and not checks.total_claim_holds
    narrow = ch02.parallel_seed_checks(ch02.tp_sweep(max_degree=8))  # no replication within 8 GPUs
    assert narrow.total_claim_holds


def test_the_figure_names_every_model():
    fig = ch02.tp_figure(ch02.tp_sweep())
    assert list(trace(fig, "llama-3-70b (8 KV heads)").x) == [1, 2, 4, 8, 16]
    assert list(trace(fig, "smollm2-135m: total ÷ unsplit").y) == [1.0, 1.0, 3.0]
