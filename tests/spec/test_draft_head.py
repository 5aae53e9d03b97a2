"""The trained speculative-decoding draft: the committed weights load, honour the engine's interface, attend
through any backend alike, train the way they draft, and still predict the target on held-out prompts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench.cache.block_invariants import check_block_manager
from workbench.cache.contiguous import ContiguousKVCache
from workbench.data import load_prompts
from workbench.draft_training.data import DraftSample, draft_vocabulary, target_outputs
from workbench.draft_training.evaluate import acceptance_on_samples, evaluate_acceptance
from workbench.draft_training.losses import (
    UnrolledAttention,
    make_batch,
    restrict_to_vocab,
    soft_cross_entropy,
    vocab_index,
)
from workbench.draft_training.train import TrainConfig, init_draft, train_draft
from workbench.models.attention import NoCacheAttention
from workbench.spec.draft_head import DEFAULT_DRAFT_PATH, build_draft, load_draft, save_draft


@pytest.fixture(scope="module")
def draft(real_model):
    return load_draft(real_model)


@pytest.fixture(scope="module")
def sample(real_model, tokenizer) -> DraftSample:
    text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest to hide."
    seq = tokenizer(text, add_special_tokens=False)["input_ids"]
    (features, top_ids, top_probs, tapped), = target_outputs(real_model, [seq], taps=TrainConfig().taps)
    return DraftSample(torch.tensor(seq), 4, features, top_ids, top_probs, tapped)


def _run(draft, ids, feats, positions, backend):
    return draft(ids, feats, positions, backend) if draft.needs_target_features else draft(ids, positions, backend)


def _head_inputs(draft, sample: DraftSample, n: int) -> torch.Tensor:
    """What the head reads for positions 0..n-1: the target's (fused) features."""
    if not getattr(draft, "needs_target_features", False):
        return sample.features[:n]
    with torch.no_grad():
        return draft.fuse_features(draft.target_source(sample)[:n])


def test_committed_draft_fits_and_describes_its_cache(draft, real_model):
    assert DEFAULT_DRAFT_PATH.stat().st_size <= 20 * 2**20
    spec = draft.spec
    assert spec.num_layers == len(draft.layers) and 1 <= spec.num_layers <= 2
    assert (spec.num_kv_heads, spec.head_dim, spec.hidden_size) == (3, 64, 576)
    assert draft.attention_scale == pytest.approx(64 ** -0.5)
    assert draft.metadata["seed"] == "0" and "draft_training" in draft.metadata["command"]
    # the shared weights are the target's own tensors, not copies
    assert not any(p.data_ptr() == real_model.embed_tokens.weight.data_ptr() for p in draft.draft_state_dict().values())


def test_forward_shapes_and_logits(draft, sample):
    t = 7
    ids, feats, pos = sample.tokens[1:t + 1], _head_inputs(draft, sample, t), torch.arange(t)
    hidden = _run(draft, ids, feats, pos, NoCacheAttention([t], draft.attention_scale))
    assert hidden.shape == (t, 576) and hidden.dtype == torch.float32
    logits = draft.compute_logits(hidden)
    assert logits.shape == (t, 49152) and logits.dtype == torch.float32
    names = torch.zeros(49152, dtype=torch.bool)
    names[draft.vocab if draft.vocab is not None else slice(None)] = True
    assert torch.isfinite(logits[:, names]).all() and torch.isneginf(logits[:, ~names]).all()


def test_no_cache_equals_cached_decoding(draft, sample):
    """A whole-sequence forward without a cache equals a 6-token prefill plus 1-token steps over a KV cache."""
    n = 12
    ids, feats, pos = sample.tokens[1:n + 1], _head_inputs(draft, sample, n), torch.arange(n)
    whole = _run(draft, ids, feats, pos, NoCacheAttention([n], draft.attention_scale))
    cache = ContiguousKVCache(draft.spec, max_batch=2, max_len=n)
    parts = [_run(draft, ids[:6], feats[:6], pos[:6], cache.attention([1], [0], [6]))]
    for j in range(6, n):
        parts.append(_run(draft, ids[j:j + 1], feats[j:j + 1], pos[j:j + 1], cache.attention([1], [j], [1])))
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-4, atol=1e-4)


def test_unrolled_training_sees_what_drafting_sees(real_model, sample):
    """Step s of the unrolled training forward equals drafting s tokens from a KV cache (teacher-forced)."""
    head = init_draft(real_model, TrainConfig(kind="eagle", unroll=3)).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # off the identity start, so every input matters
        rows = len(sample.tokens) - 1
        batch = make_batch([sample, sample])
        attention = UnrolledAttention(2, rows, head.attention_scale)
        feats, preds = head.fuse_features(head.target_source(batch)[:, :-1].reshape(2 * rows, -1)), []
        for _ in range(3):
            pred = head(batch.tokens[:, 1:].reshape(-1), feats, torch.arange(rows).repeat(2), attention)
            preds.append(pred.view(2, rows, -1)[1])
            feats = F.pad(pred.view(2, rows, -1), (0, 0, 1, 0))[:, :rows].reshape(2 * rows, -1)
        c = 5  # the chain starts at row c: rows 0..c come from the target's features
        cache = ContiguousKVCache(head.spec, max_batch=1, max_len=rows)
        h = head(sample.tokens[1:c + 2], _head_inputs(head, sample, c + 1), torch.arange(c + 1),
                 cache.attention([0], [0], [c + 1]))[-1:]
        for step in range(1, 3):
            p = c + step
            h = head(sample.tokens[p + 1:p + 2], h, torch.tensor([p]), cache.attention([0], [p], [1]))
            torch.testing.assert_close(h[0], preds[step][p], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["eagle", "layers"])
def test_training_runs_two_steps(real_model, sample, kind):
    cfg = TrainConfig(kind=kind, num_layers=1, init_layers=(0,), unroll=2, epochs=2, batch_tokens=64, warmup_steps=1)
    draft, log = train_draft(real_model, [sample, sample], cfg, max_steps=2, progress=False)
    assert log["steps"] == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in log["history"])
    changed = not torch.equal(draft.layers[0].down_proj.weight, real_model.layers[0].down_proj.weight)
    assert changed and not draft.training


def test_acceptance_replay_counts(draft, sample):
    result = acceptance_on_samples(draft, [sample], k=4)
    assert len(result["per_position"]) == 4
    assert result["per_position"] == sorted(result["per_position"], reverse=True)  # cumulative: never rises
    assert result["acceptance"] == pytest.approx(sum(result["per_position"]) / 4)
    reached = [1.0] + result["per_position"][:3]
    assert result["alpha"] == pytest.approx(result["mean_accepted"] / sum(reached))
    assert result["alpha"] >= result["acceptance"]


@pytest.mark.slow
def test_heldout_acceptance(real_model, tokenizer, draft):
    """The committed draft measured alpha 0.31 (accepted / tested; 0.110 accepted / drafted) at K=4 on the 40
    held-out prompts, 0.30 at the first position (datasets/drafts/README.md), short of the 0.5 it was meant to
    reach. This guards what it does reach: an untrained head accepts ~0, so a broken file or loader falls below
    the floor."""
    prompts = load_prompts("draft_heldout")[:3]
    result = evaluate_acceptance(real_model, draft, tokenizer, prompts, k=4, max_tokens=64)
    assert result["acceptance"] > 0.03 and result["alpha"] > 0.1 and result["per_position"][0] > 0.1, result


def test_missing_weights_say_how_to_make_them(real_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="draft_training"):
        load_draft(real_model, tmp_path / "none.safetensors")


def test_committed_draft_drafts_after_a_prefix_cache_hit(real_model, tokenizer, draft):
    """The second request shares the chat template's first blocks with the first: the head has no target
    features for those positions and must start after them (it once stopped drafting for every later request)."""
    from workbench.config import SamplingParams, SpecConfig
    from workbench.engine.llm_engine import LLMEngine

    prompts = ["Name three rivers in Europe.", "Give two tips for learning to cook."]
    params = SamplingParams(max_tokens=12)
    plain = LLMEngine(real_model, tokenizer)
    expected = [plain.generate([p], params, progress=False)[0].token_ids for p in prompts]
    engine = LLMEngine(real_model, tokenizer, spec_config=SpecConfig("draft", 3), draft_model=draft)
    for prompt, tokens in zip(prompts, expected, strict=True):
        engine.metrics.reset()
        assert engine.generate([prompt], params, progress=False)[0].token_ids == tokens
        request = engine.metrics.request_frame().iloc[0]
        assert request["drafted_tokens"] > 0, request
    assert request["cached_prompt_tokens"] > 0
    check_block_manager(engine.blocks)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"


def test_a_head_reading_tapped_layers_drafts_in_the_engine(real_model, tokenizer):
    """An (untrained) EAGLE-3-style head gets the target's tapped layers from the engine, drafts for several
    sequences at once, and changes nothing in greedy output."""
    from workbench.config import SamplingParams, SpecConfig
    from workbench.engine.llm_engine import LLMEngine

    head = init_draft(real_model, TrainConfig(kind="eagle", taps=(2, 15, 27))).eval().requires_grad_(False)
    head.prepare()
    prompts = ["Name three rivers in Europe.", "Write a haiku about rain.", "What is 12 times 7?"]
    params = SamplingParams(max_tokens=10)
    expected = [o.token_ids for o in LLMEngine(real_model, tokenizer).generate(prompts, params, progress=False)]
    engine = LLMEngine(real_model, tokenizer, spec_config=SpecConfig("draft", 3), draft_model=head)
    assert engine.runner.taps == (2, 15, 27)
    assert [o.token_ids for o in engine.generate(prompts, params, progress=False)] == expected
    assert engine.metrics.spec_counters().drafted > 0
    check_block_manager(engine.blocks)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"


def test_a_reduced_vocabulary_head_names_only_its_tokens(real_model, sample, tmp_path):
    """A head with a draft vocabulary scores its tokens exactly as the target's LM head would, gives -inf to the
    rest, and keeps the vocabulary (as token ids) through save and load."""
    vocab = draft_vocabulary([sample], 1000, real_model.spec.vocab_size)
    assert bool((vocab[1:] > vocab[:-1]).all()) and set(sample.tokens.tolist()) <= set(vocab.tolist())
    head = init_draft(real_model, TrainConfig(kind="eagle", draft_vocab=1000), [sample]).eval().requires_grad_(False)
    assert torch.equal(head.vocab, vocab)
    hidden = torch.randn(3, real_model.spec.hidden_size)
    logits = head.compute_logits(hidden)
    outside = torch.ones(real_model.spec.vocab_size, dtype=torch.bool)
    outside[vocab] = False
    assert torch.isinf(logits[:, outside]).all()
    torch.testing.assert_close(logits[:, vocab], real_model.compute_logits(hidden)[:, vocab], rtol=1e-4, atol=1e-4)
    loaded = load_draft(real_model, save_draft(head, tmp_path / "d.safetensors", {}))
    assert torch.equal(loaded.vocab, vocab) and loaded.metadata["draft_vocab_size"] == str(len(vocab))
    with pytest.raises(ValueError, match="sorted"):
        build_draft(real_model, "eagle", 1, vocab=torch.tensor([5, 3]))
    with pytest.raises(ValueError, match="only an EAGLE head"):
        build_draft(real_model, "layers", 1, vocab=vocab)


def test_training_targets_restricted_to_the_draft_vocabulary(sample):
    batch = make_batch([sample])
    keep = batch.top_ids[0, :, :2].unique()  # the top-2 of every position stay, the rest fall outside
    index = vocab_index(keep, 49152)
    assert torch.equal(index[keep], torch.arange(len(keep))) and int((index >= 0).sum()) == len(keep)
    small = restrict_to_vocab(batch, index)
    inside = small.top_ids >= 0
    assert torch.equal(inside, index[batch.top_ids] >= 0) and inside[..., :2].all()
    assert torch.equal(small.top_probs[~inside], torch.zeros(int((~inside).sum())))
    torch.testing.assert_close(small.top_probs.sum(-1), torch.ones(small.top_probs.shape[:2]))
    logits = torch.randn(5, len(keep))
    want = -(small.top_probs[0, :5] * logits.log_softmax(-1).gather(-1, small.top_ids[0, :5].clamp_min(0))).sum(-1)
    torch.testing.assert_close(soft_cross_entropy(logits, small.top_ids[0, :5], small.top_probs[0, :5]), want.mean())
