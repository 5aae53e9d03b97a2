"""The trained speculative-decoding draft for SmolLM2-135M, and its loader.

There is no smaller SmolLM2 to use as a draft, and the target's own early layers make a poor one (an untrained
early exit agrees with the full model 3-30% of the time), so the draft is trained (`workbench.draft_training`).
Two designs share this file because the choice between them was made by measurement (numbers in
``datasets/drafts/README.md``):

- `EagleDraftHead` (EAGLE-style): one decoder layer that reads the target's features at position j together
  with the embedding of token j+1 and predicts the target's final hidden state at j+1; the target's frozen,
  tied LM head turns that into a guess for token j+2. Drafting further ahead feeds its own predictions back.
  The features are either the target's final hidden state (EAGLE-1) or, with ``taps``, a learned fusion of the
  residual after a low, a middle and a high layer (EAGLE-3): the final state mostly encodes the very next
  token, and reading lower layers too raised held-out top-1 from 0.20 to 0.28 after 150 equal training steps.
  Like EAGLE-3, the head may name only a subset of the vocabulary (``vocab``): the target's LM head is 85% of
  a draft step's multiply-adds (49,152 x 576 against one decoder layer's 3.5 M), most of those rows are tokens
  the target's answers never use, and a smaller head both drafts and trains faster.
- `LayerDraftModel`: a 1-2 layer Llama of the target's width that reuses the target's embedding, final norm
  and LM head (frozen) and only reads tokens.

Both run their attention through the same `AttentionBackend` seam as `LlamaModel`, with their own layer
indices (0 .. spec.num_layers-1), so the engine can give them a paged KV cache sized from ``spec``. Only the
draft's own weights are stored; the shared ones always come from the target it is loaded against.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from workbench.config import ModelSpec
from workbench.models.attention import AttentionBackend
from workbench.models.cpu_linear import Linear
from workbench.models.llama import DecoderLayer, LlamaModel
from workbench.models.rope import RotaryEmbedding
from workbench.paths import DATASETS_DIR

DRAFTS_DIR = DATASETS_DIR / "drafts"
DEFAULT_DRAFT_PATH = DRAFTS_DIR / "smollm2-135m-draft.safetensors"


class EagleDraftHead(nn.Module):
    """Predicts the target's next final hidden state from (its hidden state, the next token's embedding)."""

    needs_target_features = True

    def __init__(self, target: LlamaModel, num_layers: int = 1, taps: tuple[int, ...] = (),
                 vocab: torch.Tensor | None = None):
        super().__init__()
        tspec = target.spec
        self.spec: ModelSpec = tspec.replace(name=f"{tspec.name}-eagle-draft", num_layers=num_layers)
        h = tspec.hidden_size
        self.taps = tuple(taps)
        # Target layers read (`LlamaModel.forward_with_taps`), fused to one hidden-sized feature per position.
        self.fuse = Linear(len(self.taps) * h, h, bias=False) if self.taps else None
        self.fc = Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(self.spec) for _ in range(num_layers))
        # The output must live where the target's features live (after its final norm), so the head ends with a
        # norm of its own, started at the target's gains.
        self.norm = nn.Parameter(target.norm.detach().clone())
        self.rope = RotaryEmbedding(tspec.head_dim, tspec.rope_theta, min(tspec.max_context, 4096),
                                    device=target.device)
        self.attention_scale = tspec.head_dim ** -0.5
        # Not a submodule: the embedding and LM head are the target's, frozen, and never saved with the draft.
        object.__setattr__(self, "target", target)
        # The token ids this head can draft (sorted; saved with the head), None for the whole vocabulary.
        self.register_buffer("vocab", None if vocab is None else _check_vocab(vocab, tspec.vocab_size))
        object.__setattr__(self, "_vocab_lm_head", None)  # the target's LM-head rows for ``vocab``, built on use

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        result = super()._apply(fn, recurse)
        self.rope.to(self.fc.weight.device)
        if any(m.packed is not None for m in self.modules() if isinstance(m, Linear)):
            self.prepare()
        return result

    def prepare(self, *, pack: bool = True) -> EagleDraftHead:
        """Pack the linear layers for oneDNN on the CPU (see `LlamaModel.prepare`); call after changing weights."""
        pack = pack and self.fc.weight.device.type == "cpu"
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack() if pack else module.unpack()
        return self

    def fuse_features(self, target_features: torch.Tensor) -> torch.Tensor:
        """The head's input feature [T, hidden] from what the target produced: its final hidden states as they
        are, or its tapped layers [T, len(taps) * hidden] through the learned fusion."""
        expected = len(self.taps) * self.spec.hidden_size if self.taps else self.spec.hidden_size
        if target_features.dim() != 2 or target_features.shape[1] != expected:
            raise ValueError(f"target features {tuple(target_features.shape)} must be [T, {expected}] for taps "
                             f"{self.taps}")
        return target_features if self.fuse is None else self.fuse(target_features.to(self.fc.weight.dtype))

    def target_source(self, data) -> torch.Tensor:
        """What ``data`` (a `DraftSample` or a training batch) holds for this head to fuse (`fuse_features`):
        its ``tapped`` layers when the head has taps, else its final ``features``."""
        source = data.tapped if self.taps else data.features
        if source is None:
            raise ValueError(f"the data lacks the target layers {self.taps} this head reads: build it with "
                             "build_samples(..., taps=draft.taps) or add_taps()")
        return source

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                attention: AttentionBackend) -> torch.Tensor:
        """Row j: the (fused, `fuse_features`) target feature or this head's own predicted one at ``positions[j]``,
        and the id of the token that follows it. Returns the predicted features for the next positions,
        [T, hidden]."""
        if not (input_ids.dim() == 1 and input_ids.shape == positions.shape
                and features.shape == (input_ids.shape[0], self.spec.hidden_size)):
            raise ValueError(f"input_ids {tuple(input_ids.shape)}, positions {tuple(positions.shape)} must be [T] and "
                             f"features {tuple(features.shape)} [T, {self.spec.hidden_size}]")
        embeds = self.target.embed_tokens(input_ids).to(features.dtype)
        x = self.fc(torch.cat([features, embeds], dim=-1))
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, attention)
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.spec.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in float32 through the target's (tied) LM head; -inf for tokens outside the head's
        ``vocab``, so its greedy pick and its sampling distribution q never name them (verification stays exact:
        q = 0 there, and the target's residual max(0, p - q) covers them)."""
        if self.vocab is None:
            return self.target.compute_logits(hidden)
        sub = self.vocab_lm_head()(hidden).float()
        logits = sub.new_full((hidden.shape[0], self.spec.vocab_size), float("-inf"))
        logits[:, self.vocab] = sub
        return logits

    def vocab_lm_head(self) -> Linear:
        """The target's LM head cut to this head's ``vocab`` (frozen, packed on the CPU, rebuilt when the
        target moves or changes dtype)."""
        weight = self.target.lm_head.weight
        head = self._vocab_lm_head
        if head is None or head.weight.device != weight.device or head.weight.dtype != weight.dtype:
            head = Linear(weight.shape[1], len(self.vocab), bias=False, device=weight.device, dtype=weight.dtype)
            with torch.no_grad():
                head.weight.copy_(weight[self.vocab.to(weight.device)])
            head.requires_grad_(False)
            if weight.device.type == "cpu":
                head.pack()
            object.__setattr__(self, "_vocab_lm_head", head)
        return head

    def draft_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())


class LayerDraftModel(LlamaModel):
    """A few-layer Llama sharing the target's embedding, final norm and LM head; reads tokens only."""

    needs_target_features = False

    @classmethod
    def build(cls, target: LlamaModel, num_layers: int) -> LayerDraftModel:
        spec = target.spec.replace(name=f"{target.spec.name}-{num_layers}layer-draft", num_layers=num_layers)
        with torch.device("meta"):  # skip allocating (and initialising) a second embedding table
            model = cls(spec)
        model.layers.to_empty(device=target.device)
        model.layers.to(target.dtype)
        model.embed_tokens, model.lm_head, model.norm = target.embed_tokens, target.lm_head, target.norm
        model.rope.to(target.device)
        return model

    def prepare(self, *, pack: bool = True) -> LayerDraftModel:
        """Pack (or unpack) only the draft's own layers: the shared embedding and LM head are the target's."""
        pack = pack and self.device.type == "cpu"
        for module in self.layers.modules():
            if isinstance(module, Linear):
                module.pack() if pack else module.unpack()
        return self

    def draft_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k.startswith("layers.")}


DraftModule = EagleDraftHead | LayerDraftModel


def _check_vocab(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    vocab = torch.as_tensor(vocab).long()
    if vocab.dim() != 1 or vocab.numel() == 0:
        raise ValueError(f"a draft vocabulary must be a non-empty 1-D tensor of token ids, got {tuple(vocab.shape)}")
    if int(vocab.min()) < 0 or int(vocab.max()) >= vocab_size or not bool((vocab[1:] > vocab[:-1]).all()):
        raise ValueError(f"a draft vocabulary must hold sorted, distinct token ids in [0, {vocab_size})")
    return vocab


def build_draft(target: LlamaModel, kind: str, num_layers: int, taps: tuple[int, ...] = (),
                vocab: torch.Tensor | None = None) -> DraftModule:
    """An untrained draft of ``kind`` ("eagle" or "layers") for ``target``; ``taps`` and a draft ``vocab``
    (token ids) only for "eagle"."""
    if kind == "eagle":
        head = EagleDraftHead(target, num_layers, taps, vocab)
        return head.to(device=target.device, dtype=target.dtype)  # floats only: ``vocab`` stays int64
    if taps or vocab is not None:
        raise ValueError("only an EAGLE head reads tapped target layers or drafts from a reduced vocabulary")
    if kind == "layers":
        return LayerDraftModel.build(target, num_layers)
    raise ValueError(f"unknown draft kind {kind!r}: choose 'eagle' or 'layers'")


def save_draft(draft: DraftModule, path: str | Path, metadata: dict[str, object]) -> Path:
    """Store the draft's own weights in float16 (half the bytes; acceptance is measured after this rounding)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = "eagle" if isinstance(draft, EagleDraftHead) else "layers"
    tensors = {k: (v.detach().to(torch.float16) if v.is_floating_point() else v.detach()).contiguous()
               for k, v in draft.draft_state_dict().items()}
    vocab = getattr(draft, "vocab", None)
    meta = {"kind": kind, "num_layers": str(draft.spec.num_layers),
            "taps": json.dumps(list(getattr(draft, "taps", ()))),
            "draft_vocab_size": str(draft.spec.vocab_size if vocab is None else len(vocab))}
    meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()})
    save_file(tensors, str(path), metadata=meta)
    return path


def load_draft(target_model: LlamaModel, path: str | Path | None = None) -> DraftModule:
    """The trained draft stored at ``path`` (default: the committed SmolLM2-135M draft), bound to ``target_model``,
    in the target's dtype and device, frozen and ready for inference."""
    path = Path(path) if path is not None else DEFAULT_DRAFT_PATH
    if not path.is_file():
        raise FileNotFoundError(f"no draft weights at {path}; make them with "
                                "`python -m workbench.draft_training --seed 0 --out <path>`")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        meta = handle.metadata() or {}
    taps = tuple(json.loads(meta.get("taps", "[]")))
    state = {k: v.to(device=target_model.device, dtype=target_model.dtype) if v.is_floating_point()
             else v.to(target_model.device) for k, v in load_file(str(path)).items()}
    draft = build_draft(target_model, meta.get("kind", "eagle"), int(meta.get("num_layers", "1")), taps,
                        state.get("vocab"))
    missing = set(draft.draft_state_dict()) - set(state)
    if missing or set(state) - set(draft.draft_state_dict()):
        raise ValueError(f"{path} does not match a {meta.get('kind')} draft: missing {sorted(missing)[:4]}, "
                         f"unexpected {sorted(set(state) - set(draft.draft_state_dict()))[:4]}")
    draft.load_state_dict(state, strict=False)
    draft.metadata = meta
    draft.eval().requires_grad_(False)
    return draft.prepare()
