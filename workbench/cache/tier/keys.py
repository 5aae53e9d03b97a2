"""Names for KV blocks that hold across processes: what a tier stores a block under, and what must match before
a stored block may be used.

The prefix cache keys a block by Python's hash of its parent's hash and its tokens: fast, but only meaningful in
one process and for one model. A block kept on disk is read by a later process, perhaps of another model or KV
format, so the tier names blocks by a SHA-256 chain instead, rooted in a *fingerprint* of everything the bytes
depend on: the model's architecture and weights, the dtype, the KV format and its static scales, the block
size and the byte layout. The same prefix under another model gets another name, and a file whose header
carries another fingerprint is refused.

The weights are identified by a sample of every tensor (its first and last 512 elements, and its shape), hashed:
hashing all of a 135M-parameter model takes about a second, and any other checkpoint, random seed or weight format
differs in the sample.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass

import torch

FORMAT_VERSION = 1
SAMPLE = 512


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a stored block's bytes depend on; ``digest`` (hex) names it in one string."""

    model: str
    weights: str
    dtype: str
    kv_format: str
    block_size: int
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_block: int
    scales: str
    version: int = FORMAT_VERSION

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    @property
    def short(self) -> str:
        return self.digest[:16]

    def header_fields(self) -> dict[str, object]:
        return {"fingerprint": self.digest, "model": self.model, "weights": self.weights, "dtype": self.dtype,
                "kv_format": self.kv_format, "block_size": self.block_size}


def _tensor_sample(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().reshape(-1)
    part = torch.cat([flat[:SAMPLE], flat[-SAMPLE:]]).contiguous().cpu()
    return repr(tuple(tensor.shape)).encode() + part.view(torch.uint8).numpy().tobytes()


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 (hex, first 16 bytes) of a sample of every parameter and buffer, in name order."""
    h = hashlib.sha256()
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(_tensor_sample(tensors[name]))
    return h.hexdigest()[:32]


def fingerprint(model, cache, bytes_per_block: int) -> Fingerprint:
    """The fingerprint of ``model``'s KV blocks in ``cache`` (a `workbench.cache.paged.PagedKVCache`)."""
    spec = model.spec
    scales = hashlib.sha256()
    if cache.kv_format == "fp8_e4m3":  # static scales: a block's bytes mean nothing under other scales
        for tensor in (*cache.key_scale, *cache.value_scale):
            scales.update(tensor.detach().float().cpu().numpy().tobytes())
    return Fingerprint(model=spec.name, weights=weights_digest(model), dtype=str(model.dtype).removeprefix("torch."),
                       kv_format=cache.kv_format, block_size=cache.block_size, layers=spec.num_layers,
                       kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, bytes_per_block=bytes_per_block,
                       scales=scales.hexdigest()[:32])


def block_digests(root: str, token_ids: list[int], block_size: int, count: int) -> list[bytes]:
    """The chained SHA-256 names of the first ``count`` full blocks of ``token_ids``: block i's name hashes block
    i - 1's name and its own tokens, block 0's the fingerprint's digest ``root``."""
    out: list[bytes] = []
    parent = bytes.fromhex(root)
    for i in range(count):
        parent = chain(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def chain(parent: bytes, tokens) -> bytes:
    """One link: the name of a block holding ``tokens`` after the block named ``parent``."""
    return hashlib.sha256(parent + struct.pack(f"<{len(tokens)}q", *tokens)).digest()
