"""Next-token distributions of a text read through a (possibly quantized) paged KV cache.

The text is fed in chunks through the engine's own paged attention: each chunk's keys and values are written
into the cache in the chosen format, then every query reads all earlier keys back *from the cache* (its own
chunk included). So each position's logits see exactly the rounding a served request would see, and
comparing formats position by position measures the format alone (same weights, same text, same kernels).
"""

from __future__ import annotations

import torch

from workbench.cache.calibration import fp8_scales
from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import PagedBatchMetadata
from workbench.intmath import ceil_div
from workbench.models.llama import LlamaModel

BLOCK_SIZE = 16


@torch.inference_mode()
def logits_through_cache(model: LlamaModel, token_ids: list[int], kv_format: str = "auto", *, chunk: int = 256,
                         calibration_ids: list[int] | None = None) -> torch.Tensor:
    """Float32 logits [len(token_ids), vocab]: row i is the model's distribution for token i + 1."""
    n = len(token_ids)
    if n < 2:
        raise ValueError(f"need at least 2 tokens, got {n}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    num_blocks = ceil_div(n, BLOCK_SIZE)
    cache = PagedKVCache(model.spec, num_blocks, BLOCK_SIZE, dtype=model.dtype, device=model.device,
                         kv_format=kv_format)
    if kv_format == "fp8_e4m3":
        cache.set_static_scales(*fp8_scales(model, calibration_ids or token_ids))
    device = model.device
    table = torch.arange(num_blocks, dtype=torch.int32, device=device)[None]
    ids = torch.tensor(token_ids, device=device)
    out = []
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        meta = PagedBatchMetadata(
            slot_mapping=torch.arange(start, end, device=device), block_tables=table,
            context_lens=torch.tensor([end], dtype=torch.int32, device=device),
            query_start_loc=torch.tensor([0, end - start], dtype=torch.int32, device=device), num_decode_seqs=0)
        hidden = model(ids[start:end], torch.arange(start, end, device=device),
                       PagedAttention(cache, meta, model.attention_scale))
        out.append(model.compute_logits(hidden))
    return torch.cat(out)


def compare_logits(reference: torch.Tensor, other: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """KL(reference || other) per position (mean and p95, nats), top-1 agreement, and both perplexities.

    ``targets[i]`` is the true token after position i (for perplexity)."""
    log_p = torch.log_softmax(reference.double(), -1)
    log_q = torch.log_softmax(other.double(), -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    nll_p = -log_p.gather(1, targets[:, None]).squeeze(1)
    nll_q = -log_q.gather(1, targets[:, None]).squeeze(1)
    return {"kl_mean": float(kl.mean()), "kl_p95": float(kl.quantile(0.95)),
            "top1_agreement": float((reference.argmax(-1) == other.argmax(-1)).double().mean()),
            "perplexity_reference": float(nll_p.mean().exp()), "perplexity": float(nll_q.mean().exp())}
