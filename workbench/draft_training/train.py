"""Train the speculative-decoding draft for SmolLM2-135M on this CPU, from nothing but the target itself.

    .venv/bin/python -m workbench.draft_training --seed 0 --out datasets/drafts/smollm2-135m-draft.safetensors

End to end (a greedy and a sampled engine answer to each prompt of ``datasets/prompts/draft_train.json``,
target features, training, the held-out acceptance on ``datasets/prompts/draft_heldout.json``) in about 28
minutes on 2 CPU cores, 26 of them making the weights; the measured times and acceptance are in
``datasets/drafts/README.md``. ``--kind layers`` trains the other candidate
(a small token-only model) on the same data for the comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from workbench.draft_training.data import DraftSample, add_taps, build_samples, draft_vocabulary, greedy_agreement
from workbench.draft_training.evaluate import acceptance_on_samples, evaluate_acceptance
from workbench.draft_training.losses import (
    LossWeights,
    eagle_loss,
    layers_loss,
    length_buckets,
    make_batch,
    restrict_to_vocab,
    vocab_index,
)
from workbench.models.llama import LlamaModel
from workbench.spec.draft_head import DEFAULT_DRAFT_PATH, DraftModule, EagleDraftHead, build_draft, save_draft

__all__ = ["TrainConfig", "evaluate_acceptance", "init_draft", "main", "train_draft"]


@dataclass(slots=True)
class TrainConfig:
    kind: str = "eagle"
    num_layers: int = 1
    # Layers of the target a token-only draft starts from; for the EAGLE head, the layer its block copies.
    init_layers: tuple[int, ...] = (29,)
    # Target layers the EAGLE head reads (EAGLE-3's low / middle / high choice: 2, L/2, L-3); () reads only the
    # final hidden state (EAGLE-1). Held-out top-1 after 150 equal steps: 0.28 with these, 0.20 without.
    taps: tuple[int, ...] = (2, 15, 27)
    # The EAGLE head drafts from the tokenizer's first N ids plus the training data's tokens (`draft_vocabulary`;
    # 23 k of 49 k with 16,384): its LM head, the bulk of training and drafting cost, shrinks with it. 0: all.
    draft_vocab: int = 16384
    epochs: int = 3
    batch_tokens: int = 2048
    lr: float = 2e-3
    warmup_steps: int = 20
    # EAGLE head steps trained per position (drafting feeds its own predictions back k-1 times).
    unroll: int = 2
    seed: int = 0
    weights: LossWeights = field(default_factory=LossWeights)


def init_draft(target: LlamaModel, cfg: TrainConfig, samples: list[DraftSample] | None = None) -> DraftModule:
    """A fresh draft whose decoder layers start as copies of the target's ``cfg.init_layers``.

    The EAGLE head's input projection starts as (feature + c * embedding), c matching the two inputs' RMS on
    ``samples``: the target's features are ~17x larger than its embeddings, and a head started with a small
    random embedding half learned to use the token 2.7x slower (held-out top-1 0.05 vs 0.13 after 30 steps)."""
    torch.manual_seed(cfg.seed)
    eagle = cfg.kind == "eagle"
    vocab = None
    if eagle and cfg.draft_vocab:
        vocab = draft_vocabulary(samples or [], cfg.draft_vocab, target.spec.vocab_size)
    draft = build_draft(target, cfg.kind, cfg.num_layers, cfg.taps if eagle else (), vocab)
    if len(cfg.init_layers) != cfg.num_layers:
        raise ValueError(f"init_layers {cfg.init_layers} must name one target layer per draft layer ({cfg.num_layers})")
    with torch.no_grad():
        for mine, src in zip(draft.layers, cfg.init_layers, strict=True):
            mine.load_state_dict(target.layers[src].state_dict())
        if isinstance(draft, EagleDraftHead):
            # Start as "take the target's feature, ignore the token", a sensible point to learn the rest from.
            h = target.spec.hidden_size
            draft.fc.weight.zero_()
            draft.fc.weight[:, :h] = torch.eye(h)
            draft.fc.weight[:, h:] = torch.eye(h) * _embedding_gain(target, samples)
            if draft.fuse is not None:
                # Tapped residuals are RMS-normalised: start from the highest one, scaled to the final state's RMS.
                draft.fuse.weight.zero_()
                draft.fuse.weight[:, -h:] = torch.eye(h) * _feature_rms(samples)
    draft.prepare(pack=False)  # training needs the plain weights (the packed copy would go stale)
    return draft.train().requires_grad_(True) if cfg.kind == "eagle" else _train_layers_only(draft)


def _embedding_gain(target: LlamaModel, samples: list[DraftSample] | None) -> float:
    """RMS of the target's features over RMS of the embeddings of the same tokens (1.0 without samples)."""
    if not samples:
        return 1.0
    embeds = target.embed_tokens(torch.cat([s.tokens for s in samples[:32]]).to(target.device)).float()
    return _feature_rms(samples) / float(embeds.pow(2).mean().sqrt())


def _feature_rms(samples: list[DraftSample] | None) -> float:
    """RMS of the target's final features on ``samples`` (1.0 without samples)."""
    if not samples:
        return 1.0
    return float(torch.cat([s.features for s in samples[:32]]).pow(2).mean().sqrt())


def _train_layers_only(draft: DraftModule) -> DraftModule:
    draft.train().requires_grad_(False)
    draft.layers.requires_grad_(True)  # the embedding, norm and LM head are the target's and stay frozen
    return draft


def _lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))  # cosine down to 10%


def train_draft(target: LlamaModel, samples: list[DraftSample], cfg: TrainConfig, *, max_steps: int | None = None,
                progress: bool = True) -> tuple[DraftModule, dict[str, object]]:
    """Train a new draft on ``samples``; returns it (frozen, packed for inference) and a training log."""
    draft = init_draft(target, cfg, samples)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    plan = [b for _ in range(cfg.epochs) for b in length_buckets(samples, cfg.batch_tokens, gen)]
    plan = plan[:max_steps] if max_steps is not None else plan
    # bf16 LM head for the losses: 2.7x the fp32 matmul speed on this AVX512-BF16 CPU (99 vs 37 GFLOP/s).
    vocab = getattr(draft, "vocab", None)
    lm_head = target.lm_head.weight.detach()
    lm_head = (lm_head if vocab is None else lm_head[vocab]).to(torch.bfloat16)
    index = None if vocab is None else vocab_index(vocab, target.spec.vocab_size)
    history, start = [], time.perf_counter()
    bar = tqdm(plan, desc=f"train {cfg.kind}", unit="batch", disable=not progress)
    for step, idx in enumerate(bar):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, len(plan), cfg)
        batch = make_batch([samples[i] for i in idx])
        batch = (batch if index is None else restrict_to_vocab(batch, index)).to(lm_head.device)
        if cfg.kind == "eagle":
            loss, accs = eagle_loss(draft, lm_head, batch, cfg.unroll, cfg.weights)
        else:
            loss, accs = layers_loss(draft, lm_head, batch, cfg.weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append({"loss": float(loss.detach()), "top1": accs})
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1="/".join(f"{a:.2f}" for a in accs))
    draft.eval().requires_grad_(False)
    draft.prepare()
    return draft, {"steps": len(plan), "train_s": time.perf_counter() - start, "history": history}


_DEFAULTS = TrainConfig()  # an instance: a slots dataclass's class attributes are descriptors


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_DRAFT_PATH))
    p.add_argument("--kind", choices=("eagle", "layers"), default="eagle")
    p.add_argument("--num-layers", type=int, default=None, help="default: 1 for eagle, 2 for layers")
    p.add_argument("--init-layers", type=int, nargs="+", default=None, help="target layers to start from")
    p.add_argument("--epochs", type=int, default=_DEFAULTS.epochs)
    p.add_argument("--unroll", type=int, default=_DEFAULTS.unroll)
    p.add_argument("--taps", type=int, nargs="*", default=None,
                   help=f"target layers the EAGLE head reads (default {' '.join(map(str, _DEFAULTS.taps))}; "
                        "none: only the final hidden state)")
    p.add_argument("--lr", type=float, default=_DEFAULTS.lr)
    p.add_argument("--max-tokens", type=int, default=256, help="response length of the training data")
    p.add_argument("--sampled-answers", type=int, default=1,
                   help="sampled answers per training prompt on top of the greedy one (seeded; 0: greedy only)")
    p.add_argument("--sampled-max-tokens", type=int, default=192, help="length limit of the sampled answers")
    p.add_argument("--temperature", type=float, default=0.8, help="temperature of the sampled answers")
    p.add_argument("--draft-vocab", type=int, default=_DEFAULTS.draft_vocab,
                   help="the EAGLE head drafts from the tokenizer's first N ids plus the training data's tokens "
                        "(0: the whole vocabulary)")
    p.add_argument("--data", default=None, help="reuse (or create) the generated training data at this .pt path")
    p.add_argument("--heldout-data", default=None, help="same, for the held-out responses")
    p.add_argument("--device", default="cpu", help="where the target answers and the head trains (cpu, cuda)")
    p.add_argument("--max-num-seqs", type=int, default=128,
                   help="sequences the engine batches while answering the training prompts")
    return p.parse_args(argv)


def _samples(target, tokenizer, prompt_set: str, max_tokens: int, cache: str | None, taps: tuple[int, ...],
             sampled: int = 0, sampled_max_tokens: int | None = None, temperature: float = 0.8,
             seed: int = 0, max_num_seqs: int = 128) -> list[DraftSample]:
    """The greedy answers to ``prompt_set`` first, then ``sampled`` seeded sampled answers per prompt."""
    from pathlib import Path

    from workbench.data import load_prompts

    if cache and Path(cache).is_file():
        return add_taps(target, torch.load(cache, weights_only=False), taps)
    samples = build_samples(target, tokenizer, load_prompts(prompt_set), max_tokens, taps=taps, sampled=sampled,
                            sampled_max_tokens=sampled_max_tokens, temperature=temperature, seed=seed,
                            max_num_seqs=max_num_seqs)
    if cache:
        torch.save(samples, cache)
    return samples


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = _parse(argv)
    import workbench
    from workbench.data import load_prompts

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    target, tokenizer = workbench.load_model("smollm2-135m", dtype=torch.float32, device=args.device)
    target.prepare()
    num_layers = args.num_layers or (1 if args.kind == "eagle" else 2)
    taps = (tuple(args.taps) if args.taps is not None else _DEFAULTS.taps) if args.kind == "eagle" else ()
    samples = _samples(target, tokenizer, "draft_train", args.max_tokens, args.data, taps, args.sampled_answers,
                       args.sampled_max_tokens, args.temperature, args.seed, args.max_num_seqs)
    data_s = time.perf_counter() - t0
    default_init = (29,) if args.kind == "eagle" else tuple(range(num_layers))
    init = tuple(args.init_layers) if args.init_layers else default_init
    cfg = TrainConfig(kind=args.kind, num_layers=num_layers, init_layers=init, taps=taps, epochs=args.epochs,
                      unroll=args.unroll, lr=args.lr, seed=args.seed, draft_vocab=args.draft_vocab)
    draft, log = train_draft(target, samples, cfg)
    train_wall = time.perf_counter() - t0
    command = " ".join(sys.argv[1:] if argv is None else argv)
    meta = {"seed": args.seed, "command": f"python -m workbench.draft_training {command}",
            "train_prompts": "datasets/prompts/draft_train.json", "max_tokens": args.max_tokens,
            "epochs": cfg.epochs, "unroll": cfg.unroll, "init_layers": list(init), "steps": log["steps"],
            "lr": cfg.lr, "sampled_answers": args.sampled_answers, "sampled_max_tokens": args.sampled_max_tokens,
            "temperature": args.temperature if args.sampled_answers else None, "draft_vocab": cfg.draft_vocab}
    path = save_draft(draft, args.out, meta)
    from workbench.spec.draft_head import load_draft

    draft = load_draft(target, path)  # measure what was stored (float16), not the in-memory float32
    heldout = _samples(target, tokenizer, "draft_heldout", args.max_tokens, args.heldout_data, taps,
                       max_num_seqs=args.max_num_seqs)
    result = acceptance_on_samples(draft, heldout, k=4)
    summary = {"kind": cfg.kind, "num_layers": num_layers, "out": str(path), "bytes": path.stat().st_size,
               "train_samples": len(samples), "train_tokens": sum(len(s.tokens) for s in samples),
               # greedy answers only (they come first): sampled ones differ from the argmax by design
               "engine_vs_forward_agreement": greedy_agreement(samples[:len(load_prompts("draft_train"))]),
               "data_s": round(data_s, 1),
               "train_s": round(log["train_s"], 1), "train_wall_s": round(train_wall, 1),
               "total_s": round(time.perf_counter() - t0, 1), "heldout": result}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
