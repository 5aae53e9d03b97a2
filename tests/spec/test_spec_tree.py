"""Token trees, piece by piece: the tree forward (mask, positions, slots), verification (greedy, and recursive
rejection sampling that keeps the target's distribution), drafting (static, dynamic, prompt lookup), the
counters and the config. The engine end to end is in test_spec_tree_engine.py."""

from __future__ import annotations

import pytest
import torch
from chi_square import chi2, chi2_critical
from tiny_models import tiny_model

from workbench.cache.block_manager import BlockManager
from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import BatchEntry, build_paged_batch, tree_entry
from workbench.config import SamplingParams, SpecConfig
from workbench.models.attention import NoCacheAttention
from workbench.spec.drafts import Drafts
from workbench.spec.ngram import propose_ngram, propose_ngram_tree
from workbench.spec.stats import SpecCounters, expected_tokens_per_pass
from workbench.spec.tree import DraftTree, expected_tree_tokens, static_tree_parents, static_tree_size
from workbench.spec.tree_draft import TreeBuilder, TreeShape
from workbench.spec.tree_verify import TreeVerdict, verify_tree_greedy, verify_tree_sampled

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_model(seed: int = 3, vocab: int = 300):
    return tiny_model(seed=seed, std=0.3, vocab_size=vocab, hidden_size=144, intermediate_size=160, num_layers=2,
                      num_heads=9, num_kv_heads=3, head_dim=16, max_position_embeddings=256)


# ------------------------------------------------------------------------------------------ the tree forward
def test_a_tree_forward_gives_every_node_the_logits_of_its_path_alone():
    """One paged forward over prefix-cached context + a flattened tree: node i's logits equal a plain causal
    forward over prompt + its root-to-node path (positions prefix + depth, ancestors only, one slot per node)."""
    model = small_model()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 300, (13,), generator=gen).tolist()
    parents = [-1, 0, 0, 0, 1, 1, 3, 4, 6, 6]  # siblings at depth 1, 2 and 4; node 8 and 9 deep under node 3
    tokens = [prompt[-1]] + torch.randint(0, 300, (len(parents) - 1,), generator=gen).tolist()
    blocks = BlockManager(32, 4, enable_prefix_caching=False)
    cache = PagedKVCache(model.spec, 32, 4)
    blocks.add_sequence(0, list(prompt))
    blocks.reserve(0, len(prompt) - 1 + len(parents))
    with torch.inference_mode():
        batch = build_paged_batch(blocks, [BatchEntry(0, 0, prompt[:-1])], "cpu")  # the prefix, cached first
        model(batch.input_ids, batch.positions, PagedAttention(cache, batch.metadata, model.attention_scale))
        entry = tree_entry(0, len(prompt) - 1, tokens, parents)
        batch = build_paged_batch(blocks, [entry], "cpu")
        assert batch.metadata.num_decode_seqs == 0 and batch.metadata.tree_mask is not None
        hidden = model(batch.input_ids, batch.positions, PagedAttention(cache, batch.metadata, model.attention_scale))
        tree_logits = model.compute_logits(hidden)
        for node in range(len(parents)):
            path, n = [], node
            while n > 0:
                path.append(tokens[n])
                n = parents[n]
            ids = torch.tensor(prompt + path[::-1])
            alone = model(ids, torch.arange(len(ids)), NoCacheAttention([len(ids)], model.attention_scale))
            assert torch.allclose(tree_logits[node], model.compute_logits(alone[-1:])[0], atol=2e-4), node
    assert entry.positions == [12, 13, 13, 13, 14, 14, 14, 15, 15, 15]


def test_tree_entries_are_never_decode_rows_and_bad_parents_are_refused():
    blocks = BlockManager(8, 4)
    blocks.add_sequence(0, [1, 2, 3])
    blocks.reserve(0, 8)
    single = BatchEntry(0, 2, [3], [2], [[True]])  # one row, but it carries a mask: the prefill kernel's
    batch = build_paged_batch(blocks, [single], "cpu")
    assert batch.metadata.num_decode_seqs == 0 and batch.metadata.tree_mask.tolist() == [[True]]
    with pytest.raises(ValueError, match="parent must come before it"):
        tree_entry(0, 2, [3, 4, 5], [-1, 2, 0])
    with pytest.raises(ValueError, match="root"):
        tree_entry(0, 2, [3, 4], [0, 0])


# ---------------------------------------------------------------------------------------------- shapes
def test_static_shapes_and_rank_paths():
    assert static_tree_size((3, 2, 1)) == 15 and len(static_tree_parents((3, 2, 1))) == 16
    tree = DraftTree(list(range(16)), static_tree_parents((3, 2, 1)))
    assert tree.nodes_per_depth() == [3, 6, 6]
    assert tree.rank_paths()[:5] == [(0,), (1,), (2,), (0, 0), (0, 1)] and tree.rank_paths()[-1] == (2, 1, 0)
    # A chain is the one-node-per-depth tree: its expected yield is the chain formula.
    chain = [(0,) * d for d in range(1, 5)]
    assert expected_tree_tokens(chain, [[0.6]] * 4) == pytest.approx(expected_tokens_per_pass(0.6, 4))
    # A second candidate per depth adds what the first misses.
    wide = DraftTree(list(range(7)), static_tree_parents((2, 2))).rank_paths()
    assert expected_tree_tokens(wide, [[0.5, 0.3]] * 2) == pytest.approx(1 + 0.8 + 0.8 * 0.8)
    with pytest.raises(ValueError, match="parent must come before it"):
        DraftTree([1, 2, 3], [-1, 2, 0])


# ------------------------------------------------------------------------------------------- verification
def test_greedy_walks_down_the_matching_branch():
    tree = DraftTree([9, 4, 5, 6, 7, 8], [-1, 0, 0, 1, 2, 2])  # 9 -> {4 -> 6, 5 -> {7, 8}}
    logits = torch.zeros(6, 10)
    for node, best in enumerate([5, 0, 8, 0, 0, 3]):
        logits[node, best] = 1.0
    verdict = verify_tree_greedy(tree, logits)
    assert (verdict.path, verdict.emitted, verdict.tested_last) == ([2, 5], [5, 8, 3], False)
    logits[0] = 0
    logits[0, 1] = 1.0  # the target wants a token no child has
    verdict = verify_tree_greedy(tree, logits)
    assert (verdict.path, verdict.emitted, verdict.tested_last) == ([], [1], True)


P_ROOT = torch.tensor([0.35, 0.25, 0.15, 0.1, 0.1, 0.05])
Q_ROOT = torch.tensor([0.05, 0.1, 0.15, 0.2, 0.2, 0.3])  # a poor draft: mass where the target has little


def _first_tokens(make_tree, n: int, seed: int, verify=verify_tree_sampled) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(6)
    for _ in range(n):
        tree = make_tree(gen)
        counts[verify(tree, P_ROOT.expand(tree.num_nodes, 6), gen).emitted[0]] += 1
    return counts


def _sampled_children(gen, replacement: bool, k: int = 3) -> DraftTree:
    children = torch.multinomial(Q_ROOT, k, replacement=replacement, generator=gen).tolist()
    return DraftTree([0] + children, [-1] + [0] * k, {0: Q_ROOT}, with_replacement=replacement)


@pytest.mark.parametrize("scheme", ["iid", "without replacement", "deterministic"])
def test_recursive_rejection_over_siblings_keeps_the_target_distribution(scheme):
    make = {"iid": lambda g: _sampled_children(g, True),
            "without replacement": lambda g: _sampled_children(g, False),
            "deterministic": lambda g: DraftTree([0, 5, 4, 3], [-1, 0, 0, 0])}[scheme]
    counts = _first_tokens(make, 12_000, seed=1)
    stat, df = chi2(counts, P_ROOT)
    assert stat < chi2_critical(df), (scheme, (counts / counts.sum()).tolist())


def test_the_sibling_test_has_power():
    """Resampling from p after a rejection (instead of from the residual p - q) over-emits the siblings' tokens;
    the same statistic must see it, or the test above proves nothing."""
    def broken(tree, target_probs, generator):
        p = target_probs[0]
        for child in range(1, tree.num_nodes):
            token = tree.tokens[child]
            if float(torch.rand((), generator=generator)) < min(1.0, float(p[token] / Q_ROOT[token])):
                return TreeVerdict([child], [token], True)
        return TreeVerdict([], [int(torch.multinomial(p, 1, generator=generator))], True)

    counts = _first_tokens(lambda g: _sampled_children(g, False), 12_000, seed=2, verify=broken)
    stat, df = chi2(counts, P_ROOT)
    assert stat > chi2_critical(df)


def test_two_levels_of_sampled_siblings_keep_the_joint_distribution():
    """Depth 2 with a draft whose second-level distribution depends on the first token: the first two emitted
    tokens follow the target's joint p(a) p(b | a)."""
    gen = torch.Generator().manual_seed(3)
    v = 4
    p1, q1 = torch.tensor([0.4, 0.3, 0.2, 0.1]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    p2 = torch.softmax(torch.randn(v, v, generator=gen) * 1.5, -1)  # p2[a] = target after a
    q2 = torch.softmax(torch.randn(v, v, generator=gen) * 1.5, -1)
    counts, n = torch.zeros(v * v), 12_000
    for _ in range(n):
        tokens, parents, probs = [0], [-1], {0: q1}
        for a in torch.multinomial(q1, 2, generator=gen).tolist():
            tokens.append(a)
            parents.append(0)
        for child in (1, 2):
            probs[child] = q2[tokens[child]]
            for b in torch.multinomial(q2[tokens[child]], 2, generator=gen).tolist():
                tokens.append(b)
                parents.append(child)
        tree = DraftTree(tokens, parents, probs)
        target = torch.stack([p1, p2[tokens[1]], p2[tokens[2]], *[p1] * 4])  # leaves' rows: any distribution
        emitted = verify_tree_sampled(tree, target, gen).emitted
        first = emitted[0]
        second = emitted[1] if len(emitted) > 1 else int(torch.multinomial(p2[first], 1, generator=gen))
        counts[first * v + second] += 1
    stat, df = chi2(counts, (p1[:, None] * p2).flatten())
    assert stat < chi2_critical(df)


# ------------------------------------------------------------------------------------------------ drafting
def _grow(shape: TreeShape, logits_of, *, max_nodes=64, max_depth=16, params=None) -> TreeBuilder:
    builder = TreeBuilder(shape, 7, max_nodes=max_nodes, max_depth=max_depth, params=params or SamplingParams())
    builder.add_children([0], logits_of([0]))
    while frontier := builder.next_frontier():
        assert builder.num_read <= max_nodes
        builder.add_children(frontier, logits_of(frontier))
    return builder


def _fixed_logits(vocab: int = 20, seed: int = 0):
    table = torch.randn(200, vocab, generator=torch.Generator().manual_seed(seed)) * 2
    return lambda nodes: table[nodes]


def test_static_builder_drafts_the_top_candidates_in_rank_order():
    logits_of = _fixed_logits()
    builder = _grow(TreeShape(branching=(3, 2)), logits_of)
    tree = builder.tree()
    assert tree.parents == static_tree_parents((3, 2))
    assert tree.tokens[1:4] == torch.topk(logits_of([0])[0], 3).indices.tolist()
    assert builder.num_read == 3  # the depth-1 nodes; the leaves are never read
    cut = _grow(TreeShape(branching=(3, 2)), logits_of, max_nodes=5, max_depth=2).tree()
    assert cut.parents == static_tree_parents((3, 2))[:6]
    shallow = _grow(TreeShape(branching=(3, 2)), logits_of, max_depth=1).tree()
    assert shallow.num_drafted == 3


def test_static_builder_samples_without_replacement_when_sampling():
    params = SamplingParams(temperature=1.0, seed=0)
    builder = TreeBuilder(TreeShape(branching=(4,)), 7, max_nodes=8, max_depth=4, params=params,
                          generator=torch.Generator().manual_seed(0))
    builder.add_children([0], _fixed_logits(vocab=6)([0]))
    tree = builder.tree()
    assert len(set(tree.draft_tokens)) == 4 and 0 in tree.child_probs
    assert torch.allclose(tree.child_probs[0].sum(), torch.tensor(1.0))


def test_dynamic_builder_keeps_the_most_probable_nodes_within_budget():
    logits_of = _fixed_logits()
    shape = TreeShape(budget=10, top_k=3, depth=4)
    builder = _grow(shape, logits_of)
    tree = builder.tree()
    assert tree.num_drafted == 10 and max(tree.depths()) <= 4 and tree.child_probs == {}
    scores = sorted((node.score for node in builder.nodes[1:]), reverse=True)
    assert sorted((builder.nodes[n].score for n in builder.kept[1:]), reverse=True) == scores[:10]
    assert [builder.nodes[n].token for n in builder.kept] == tree.tokens
    assert builder.num_read == 9 and shape.num_slots == 10  # depths 1-3 read 3 nodes each
    small = _grow(shape, logits_of, max_nodes=4, max_depth=2).tree()
    assert small.num_drafted == 4 and max(small.depths()) <= 2


def test_prompt_lookup_tree_starts_with_the_chain_and_adds_other_continuations():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 7, 8, 1, 2, 3]
    tree = propose_ngram_tree(tokens, max_nodes=10, max_depth=3, max_branches=4)
    chain = propose_ngram(tokens, 3)
    assert [tree.tokens[n] for n in (1, 3, 5)] == chain  # rank 0 at every depth
    assert tree.tokens == [3, 4, 9, 5, 1, 1, 2] and tree.parents == [-1, 0, 0, 1, 2, 3, 4]
    assert propose_ngram_tree(tokens, max_nodes=2, max_depth=3, max_branches=4).num_drafted == 2
    assert propose_ngram_tree([5, 6, 7], max_nodes=4, max_depth=3, max_branches=2) is None


# -------------------------------------------------------------------------------------- counters and config
def test_tree_counters_per_depth_and_rank():
    tree = DraftTree(list(range(7)), static_tree_parents((2, 2)))  # rank paths (0,) (1,) (0,0) (0,1) (1,0) (1,1)
    counters = SpecCounters()
    counters.record_tree(tree.rank_paths(), [1, 0], False, 3)  # second child, then its first: a leaf
    counters.record_tree(tree.rank_paths(), [], True, 1)  # nothing kept at depth 1
    counters.record_tree(tree.rank_paths(), [0], True, 2)  # first child kept, none of its children
    assert counters.drafted_at == [6, 12] and counters.tested_at == [3, 2] and counters.accepted_at == [2, 1]
    assert counters.accepted_rank_at == [[1, 1], [1]]
    assert counters.acceptance_by_rank() == [[1 / 3, 1 / 3], [0.5]]
    assert counters.tokens_per_pass == 2.0 and counters.alpha == pytest.approx(3 / 5)
    p0, p1 = 1 / 3, 0.5
    assert counters.expected_tokens_by_rank() == pytest.approx(1 + 2 * p0 + 2 * p0 * p1)
    merged = SpecCounters()
    merged.merge(counters)
    merged.merge(counters)
    assert merged.accepted_rank_at == [[2, 2], [2]] and merged.node_paths[(1, 1)] == 6
    with pytest.raises(ValueError, match="not a path"):
        counters.record_tree(tree.rank_paths(), [2], False, 2)
    chain = SpecCounters()
    chain.record(4, 2, 3)
    assert chain.accepted_rank_at == [[1], [1]] and chain.node_paths[(0, 0, 0, 0)] == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"method": "draft", "tree_branching": (8, 8)}, r"makes 72 nodes; a pass verifies at most 64"),
    ({"method": "draft", "tree_branching": (2, 0)}, r"integers in \[1, 16\]"),
    ({"method": "draft", "tree_branching": "3,2"}, "tuple of children per depth"),
    ({"method": "ngram", "tree_branching": (2, 2)}, "needs method 'draft'"),
    ({"method": "draft", "tree_branching": (2,), "tree_budget": 8}, "not both"),
    ({"method": "draft", "tree_budget": 65}, r"tree_budget must be an integer in \[0, 64\]"),
    ({"method": "draft", "tree_budget": 8, "tree_top_k": 0}, r"tree_top_k must be an integer in \[1, 16\]"),
])
def test_bad_tree_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpecConfig(**kwargs)


def test_tree_config_budget_and_depth():
    static = SpecConfig("draft", tree_branching=[3, 2, 1])
    assert static.tree_branching == (3, 2, 1) and static.is_tree and static.depth == 3
    assert static.verify_positions == 16
    dynamic = SpecConfig("draft", 5, tree_budget=12)
    assert dynamic.depth == 5 and dynamic.verify_positions == 13
    assert SpecConfig("draft", 6).verify_positions == 7 and not SpecConfig("draft", 6).is_tree



def test_serve_options_build_tree_configs():
    import argparse

    from workbench.serve.options import add_engine_arguments, engine_configs

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    static = engine_configs(parser.parse_args(["--speculative-method", "draft", "--speculative-tree", "3,2,1"]))
    assert static["spec_config"].tree_branching == (3, 2, 1)
    dynamic = engine_configs(parser.parse_args(["--speculative-method", "ngram", "--speculative-tree-budget", "8",
                                                "--num-speculative-tokens", "5"]))["spec_config"]
    assert (dynamic.tree_budget, dynamic.depth, dynamic.is_tree) == (8, 5, True)
    assert not engine_configs(parser.parse_args(["--speculative-method", "draft"]))["spec_config"].is_tree
    with pytest.raises(ValueError, match="needs method 'draft'"):
        engine_configs(parser.parse_args(["--speculative-method", "ngram", "--speculative-tree", "2,2"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-tree", "3,x"])


def test_drafts_are_cut_to_the_reserved_slots_and_a_tree_that_does_not_fit_is_refused():
    """The drafting step's output (`workbench.spec.drafts`), which the scheduler's decision no longer carries."""
    probs = torch.full((3, 5), 0.2)
    chain = Drafts.chain([4, 5, 6], probs, slots=2)
    assert chain.tokens == [4, 5] and chain.probs.shape == (2, 5) and chain.num_fed == 3
    assert Drafts.chain([], None, slots=2) is None and Drafts.chain([4], None, slots=0) is None
    tree = DraftTree([7, 1, 2, 3], [-1, 0, 0, 1])
    assert Drafts.of_tree(tree, newest=7, slots=3).num_fed == tree.num_nodes
    assert Drafts.of_tree(DraftTree([7], [-1]), newest=7, slots=3) is None  # a bare root: a plain decode
    with pytest.raises(RuntimeError, match="a tree of 3 drafted nodes rooted at token 7 does not fit 2 slots"):
        Drafts.of_tree(tree, newest=7, slots=2)
    with pytest.raises(RuntimeError, match="after token 8"):
        Drafts.of_tree(tree, newest=8, slots=3)
