"""Training data for the speculative-decoding draft, made by the target model itself.

A draft is only useful if it predicts what *this* target will say, so the data is the target's own greedy
responses to the training prompts (``datasets/prompts/draft_train.json``), produced by the batched engine, and
then the target's final hidden states (the LM-head input, what an EAGLE head reads) and its top next-token
probabilities over prompt + response. Nothing is downloaded; every run regenerates the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from workbench.config import SamplingParams, SchedulerConfig
from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel
from workbench.prompts import encode_prompt

# Target probabilities kept per position for distillation. The top 16 hold 0.87 of the mass on average over
# the training responses (measured on this data); the rest is a long flat tail that costs memory, not signal.
TOP_K = 16
# Tokens per batched target forward when extracting features: big enough to use both cores, small enough
# that the [T, vocab] float32 logits (T * 197 KB) stay well under a GiB.
FEATURE_BATCH_TOKENS = 2048


@dataclass(slots=True)
class DraftSample:
    """One conversation: prompt + target response, with the target's outputs at every position.

    ``features[j]`` is the target's normed final hidden state at position j (it predicts token j+1);
    ``top_ids[j]``/``top_probs[j]`` are its most likely next tokens there; ``tapped[j]`` holds the residuals
    of the layers an EAGLE-3-style head reads (`LlamaModel.forward_with_taps`), None when none were asked for."""

    tokens: torch.Tensor  # [n] int64
    prompt_len: int
    features: torch.Tensor  # [n, hidden] float32
    top_ids: torch.Tensor  # [n, TOP_K] int64
    top_probs: torch.Tensor  # [n, TOP_K] float32
    tapped: torch.Tensor | None = None  # [n, len(taps) * hidden] float32

    @property
    def response(self) -> list[int]:
        return self.tokens[self.prompt_len:].tolist()


def generate_responses(target: LlamaModel, tokenizer, prompts: list[str], params: list[SamplingParams], *,
                       max_num_seqs: int = 128, progress: bool = True) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per prompt from the batched engine, all requests in one run (each with its
    own `SamplingParams`, so greedy and seeded sampled answers can share the batch).

    128-token answers to 128 prompts on this 2-core machine: 221 tokens/s with 128 concurrent sequences, 182
    with 64, ~140 with 32 (the per-step overhead is shared by more sequences; bfloat16 weights were no faster)."""
    from workbench.engine.llm_engine import LLMEngine  # late: the engine imports much more than this module needs

    engine = LLMEngine(target, tokenizer, scheduler_config=SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max(512, 2 * max_num_seqs)))
    prompt_ids = [encode_prompt(tokenizer, p, chat=True) for p in prompts]
    outputs = engine.generate(prompt_ids, params, progress=progress)
    return [(ids, list(out.outputs[0].token_ids)) for ids, out in zip(prompt_ids, outputs, strict=True)]


@torch.no_grad()
def target_outputs(target: LlamaModel, sequences: list[list[int]], *, top_k: int = TOP_K, taps: tuple[int, ...] = ()
                   ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(features, top ids, top probs, tapped layers or None) per sequence from no-cache target forwards, several
    sequences per call."""
    results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    batch: list[list[int]] = []

    def flush() -> None:
        ids = torch.tensor([t for s in batch for t in s], device=target.device)
        positions = torch.cat([torch.arange(len(s), device=target.device) for s in batch])
        attention = NoCacheAttention([len(s) for s in batch], target.attention_scale)
        hidden, tapped = target.forward_with_taps(ids, positions, attention, taps)
        start = 0
        for s in batch:
            feats = hidden[start:start + len(s)]
            probs, top = target.compute_logits(feats).softmax(-1).topk(top_k, dim=-1)
            taps_here = None if tapped is None else tapped[start:start + len(s)].float().cpu()
            results.append((feats.float().cpu(), top.cpu(), probs.cpu(), taps_here))
            start += len(s)
        batch.clear()

    for seq in sequences:
        if batch and sum(map(len, batch)) + len(seq) > FEATURE_BATCH_TOKENS:
            flush()
        batch.append(seq)
    if batch:
        flush()
    return results


def build_samples(target: LlamaModel, tokenizer, prompts: list[str], max_tokens: int, *, taps: tuple[int, ...] = (),
                  sampled: int = 0, sampled_max_tokens: int | None = None, temperature: float = 0.8, seed: int = 0,
                  max_num_seqs: int = 128, progress: bool = True) -> list[DraftSample]:
    """The whole dataset: the engine's greedy answer to each prompt (first, in prompt order), then ``sampled``
    seeded answers per prompt at ``temperature`` (up to ``sampled_max_tokens``, default ``max_tokens``), then
    the target's features, tapped layers and top-k probabilities over each. Sampled answers are more data
    that still comes from the target, at the cost of generating them; all answers share one engine run."""
    if sampled < 0 or (sampled and temperature <= 0):
        raise ValueError(f"sampled answers need sampled >= 0 and temperature > 0, got {sampled}, {temperature}")
    params = [SamplingParams(max_tokens=max_tokens)] * len(prompts)
    for i in range(sampled):
        params += [SamplingParams(max_tokens=sampled_max_tokens or max_tokens, temperature=temperature,
                                  seed=seed * 1_000_003 + i * len(prompts) + j) for j in range(len(prompts))]
    pairs = generate_responses(target, tokenizer, prompts * (1 + sampled), params, max_num_seqs=max_num_seqs,
                               progress=progress)
    sequences = [p + r for p, r in pairs]
    samples = []
    chunks = [sequences[i:i + 16] for i in range(0, len(sequences), 16)]
    done = 0
    for chunk in tqdm(chunks, desc="target features", disable=not progress):
        for seq, (feats, top, probs, tapped) in zip(chunk, target_outputs(target, chunk, taps=taps), strict=True):
            samples.append(DraftSample(torch.tensor(seq), len(pairs[done][0]), feats, top, probs, tapped))
            done += 1
    return samples


def draft_vocabulary(samples: list[DraftSample], first_ids: int, vocab_size: int) -> torch.Tensor:
    """The token ids a reduced-vocabulary draft can name (sorted): the tokenizer's first ``first_ids`` (BPE
    gives its earliest, most frequent merges the low ids) plus every token in ``samples`` and the target's
    top-4 guesses there. Share of the held-out answers' tokens covered: the committed draft's 23,169 ids (16,384
    plus the greedy and sampled training answers') 98.0%; with the greedy answers only (20,681 ids) 97.1%; the
    training data's tokens alone (12,114) or the first 16,384 alone 94%."""
    seen = torch.zeros(vocab_size, dtype=torch.bool)
    seen[: min(first_ids, vocab_size)] = True
    for s in samples:
        seen[s.tokens] = True
        seen[s.top_ids[:, :4].reshape(-1)] = True
    return seen.nonzero().flatten()


def greedy_agreement(samples: list[DraftSample]) -> float:
    """Share of response tokens equal to the no-cache forward's argmax: the engine and the feature pass must
    describe the same model (paged vs no-cache fp32 differ only by rounding, so this should be ~1.0)."""
    same = total = 0
    for s in samples:
        pred = s.top_ids[s.prompt_len - 1:-1, 0]
        same += int((pred == s.tokens[s.prompt_len:]).sum())
        total += pred.numel()
    return same / max(total, 1)


def add_taps(target: LlamaModel, samples: list[DraftSample], taps: tuple[int, ...], *,
             progress: bool = True) -> list[DraftSample]:
    """``samples`` with ``tapped`` filled for ``taps`` (recomputed by the target where missing or different)."""
    width = len(taps) * target.spec.hidden_size
    def lacks(s: DraftSample) -> bool:
        tapped = getattr(s, "tapped", None)  # samples pickled before ``tapped`` existed lack the slot altogether
        return tapped is None or tapped.shape[1] != width

    todo = [s for s in samples if lacks(s)] if taps else []
    chunks = [todo[i:i + 16] for i in range(0, len(todo), 16)]
    for chunk in tqdm(chunks, desc="target taps", disable=not progress or not chunks):
        outs = target_outputs(target, [s.tokens.tolist() for s in chunk], taps=taps)
        for s, (_, _, _, tapped) in zip(chunk, outs, strict=True):
            s.tapped = tapped
    return samples
