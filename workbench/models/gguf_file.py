"""The real model's linear layers as the GGUF file stores them: blocks read with the ``gguf`` package, byte for byte.

Why it exists: the weight formats ``q4_1`` and ``q8_0`` (`workbench.models.gguf_linear`) keep the shipped blocks
instead of a float copy, so they must come from the file itself, never from requantizing the dequantized
checkpoint (a Q4_1 block's d and m are not recoverable from its 32 floats). The file's tensors are mapped onto
the engine's fused layout (q, k and v rows stacked into one matrix, gate and up into another): a block holds 32
weights of one row, so stacking and reordering rows moves whole blocks and changes no byte.

llama.cpp's converter reorders the rows of q and k (it interleaves the two rotary halves of each head); the
checkpoint transformers dequantized has them back in Hugging Face order, and so does `layer_blocks` (the same
permutation, applied to row indices).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.config import ModelSpec

# Our fused parameter -> the GGUF tensors stacked (along rows) to form it, per layer.
_FUSED = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
          "gate_up_proj": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}
_TYPE_NAMES = {3: "q4_1", 8: "q8_0"}  # ggml type id -> the block format name of `workbench_kernels.gguf_matmul`


def _hf_row_order(rows: int, heads: int) -> np.ndarray:
    """Row i of the Hugging Face matrix is row ``order[i]`` of llama.cpp's permuted one (transformers'
    ``_reverse_permute_weights`` on an index vector)."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(2, 1).reshape(rows)


class GGUFBlocks:
    """The linear-layer tensors of one GGUF file, read lazily (the file is memory-mapped by ``gguf``)."""

    def __init__(self, path: Path, spec: ModelSpec):
        from gguf import GGUFReader  # the gguf package: only needed when a GGUF format is asked for

        self.path, self.spec = Path(path), spec
        self._tensors = {t.name: t for t in GGUFReader(str(path)).tensors}

    def tensor(self, name: str) -> tuple[str, np.ndarray]:
        """``(format, blocks)`` of one tensor: blocks [rows, bytes per row] uint8, a copy in memory."""
        if name not in self._tensors:
            raise ValueError(f"{self.path.name} has no tensor {name!r}")
        t = self._tensors[name]
        fmt = _TYPE_NAMES.get(int(t.tensor_type))
        if fmt is None:
            raise ValueError(f"{self.path.name}: tensor {name} is {t.tensor_type.name}; the engine keeps only "
                             f"{sorted(_TYPE_NAMES.values())} blocks")
        return fmt, np.array(t.data, dtype=np.uint8, copy=True)

    def layer_blocks(self, layer: int, fused: str) -> tuple[str, np.ndarray]:
        """One of a layer's fused matrices (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``), rows in
        Hugging Face order. All parts must be stored in the same format."""
        spec = self.spec
        parts = []
        for short in _FUSED[fused]:
            fmt, blocks = self.tensor(f"blk.{layer}.{short}.weight")
            if short in ("attn_q", "attn_k"):
                heads = spec.num_heads if short == "attn_q" else spec.num_kv_heads
                blocks = blocks[_hf_row_order(blocks.shape[0], heads)]
            parts.append((fmt, blocks))
        formats = {fmt for fmt, _ in parts}
        if len(formats) != 1:
            raise ValueError(f"layer {layer} {fused}: parts stored in different formats {sorted(formats)}")
        return formats.pop(), np.concatenate([b for _, b in parts])

    def head_blocks(self) -> tuple[str, np.ndarray]:
        """The LM head: the embedding table when the model ties them, else ``output.weight``."""
        return self.tensor("token_embd.weight" if self.spec.tie_word_embeddings else "output.weight")
