"""Command-line options of ``workbench serve``: the server's own, and the engine's cache, scheduler and
speculative settings, turned into the validated config dataclasses.

Only argparse and the engine's configs are imported here (no FastAPI), so ``workbench --help`` and the other
sub-commands work where the serving packages are absent.
"""

from __future__ import annotations

import argparse
import os

from workbench.cache.tier.config import RESTORE_MODES, TIER_KINDS, WRITE_POLICIES, KVOffloadConfig
from workbench.config import BATCHING_MODES, SPEC_METHODS, CacheConfig, SchedulerConfig, SpecConfig
from workbench.models.int8_linear import WEIGHT_FORMATS

API_KEY_ENV = "WORKBENCH_API_KEY"
DEFAULT_PORT = 8000
# Seconds running requests get to finish after SIGINT/SIGTERM before they are aborted.
DEFAULT_SHUTDOWN_GRACE_S = 10.0


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine")
    engine.add_argument("--model", default="smollm2-135m")
    engine.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    engine.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    engine.add_argument("--weights", choices=WEIGHT_FORMATS, default="auto",
                        help="int8: linear layers in int8 with per-channel scales; int8_all: the LM head too")
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from the memory budget)")
    engine.add_argument("--kv-budget-mib", type=int, default=None, help="KV-cache memory budget in MiB")
    engine.add_argument("--kv-cache-dtype", default="auto")
    engine.add_argument("--no-prefix-caching", action="store_true")
    engine.add_argument("--max-num-seqs", type=int, default=32)
    engine.add_argument("--max-num-batched-tokens", type=int, default=512)
    engine.add_argument("--no-chunked-prefill", action="store_true")
    engine.add_argument("--max-prefill-chunk", type=int, default=None)
    engine.add_argument("--batching", choices=BATCHING_MODES, default="continuous")
    engine.add_argument("--speculative-method", choices=SPEC_METHODS, default=None,
                        help="speculative decoding: ngram (prompt lookup) or draft (default: off)")
    engine.add_argument("--num-speculative-tokens", type=int, default=4)
    engine.add_argument("--speculative-tree", type=_branching, default=(), metavar="B1,B2,...",
                        help="draft a static token tree: children per node at each depth, e.g. 3,2,1 (draft only)")
    engine.add_argument("--speculative-tree-budget", type=int, default=0, metavar="NODES",
                        help="draft a dynamic token tree of NODES nodes, --num-speculative-tokens deep")
    engine.add_argument("--batch-invariant", action="store_true",
                        help="every request's logits independent of the rest of its batch (bit-identical greedy "
                             "answers under any traffic; slower): vLLM's VLLM_BATCH_INVARIANT=1, SGLang's "
                             "--enable-deterministic-inference")
    add_offload_arguments(parser)


def add_offload_arguments(parser: argparse.ArgumentParser) -> None:
    tier = parser.add_argument_group("second KV tier (workbench.cache.tier)")
    tier.add_argument("--kv-offload", choices=TIER_KINDS, default=None,
                      help="keep blocks the prefix cache evicts in host memory or in files on disk, and restore "
                           "them instead of recomputing when that is measured to be cheaper (default: off)")
    tier.add_argument("--kv-offload-dir", default=None, metavar="DIR",
                      help="the disk tier's directory: a restarted server (or another on the same directory) finds "
                           "the blocks there")
    tier.add_argument("--kv-offload-gib", "--kv-offloading-size", type=float, default=None, metavar="GIB",
                      dest="kv_offload_gib", help="the tier's budget in GiB (default 4; vLLM's --kv-offloading-size)")
    tier.add_argument("--kv-offload-write-policy", choices=WRITE_POLICIES, default=None,
                      help="write_back: store a block when it is evicted (and at shutdown); write_through: as soon "
                           "as it is computed (default: write_back for host, write_through for disk; SGLang's "
                           "--hicache-write-policy)")
    tier.add_argument("--kv-offload-restore", choices=RESTORE_MODES, default="auto",
                      help="auto: restore when the start-up measurements say it beats recomputing")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    server.add_argument("--port", type=int, default=DEFAULT_PORT)
    server.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    server.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on /v1 routes (or set {API_KEY_ENV})")
    server.add_argument("--max-body-bytes", type=int, default=None, help="largest request body accepted (413)")
    server.add_argument("--shutdown-grace", type=float, default=DEFAULT_SHUTDOWN_GRACE_S,
                        help="seconds running requests may finish after SIGINT/SIGTERM before being aborted")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def engine_configs(args: argparse.Namespace) -> dict:
    """CacheConfig, SchedulerConfig and SpecConfig from parsed options (each validates itself), and the
    batch-invariant switch: keyword arguments of `LLMEngine`."""
    budget = args.kv_budget_mib * 2**20 if args.kv_budget_mib is not None else None
    configs = {
        "cache_config": CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks, memory_budget_bytes=budget,
                                    enable_prefix_caching=not args.no_prefix_caching,
                                    kv_cache_dtype=args.kv_cache_dtype),
        "scheduler_config": SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                            max_num_seqs=args.max_num_seqs,
                                            enable_chunked_prefill=not args.no_chunked_prefill,
                                            max_prefill_chunk=args.max_prefill_chunk, batching=args.batching),
    }
    if getattr(args, "batch_invariant", False):
        configs["batch_invariant"] = True
    offload = offload_config(args)
    if offload is not None:
        configs["kv_offload"] = offload
    if args.speculative_method is not None:
        configs["spec_config"] = SpecConfig(method=args.speculative_method,
                                            num_speculative_tokens=args.num_speculative_tokens,
                                            tree_branching=getattr(args, "speculative_tree", ()),
                                            tree_budget=getattr(args, "speculative_tree_budget", 0))
    return configs


def offload_config(args: argparse.Namespace) -> KVOffloadConfig | None:
    """The second KV tier the options ask for, or None; tier options without --kv-offload are an error."""
    kind = getattr(args, "kv_offload", None)
    if kind is None:
        given = [flag for flag, value in (("--kv-offload-dir", getattr(args, "kv_offload_dir", None)),
                                          ("--kv-offload-gib", getattr(args, "kv_offload_gib", None)),
                                          ("--kv-offload-write-policy", getattr(args, "kv_offload_write_policy", None)))
                 if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need --kv-offload host or --kv-offload disk")
        return None
    size = args.kv_offload_gib if args.kv_offload_gib is not None else 4.0
    return KVOffloadConfig(kind, size_gib=size, directory=args.kv_offload_dir,
                           write_policy=args.kv_offload_write_policy, restore=args.kv_offload_restore)


def _branching(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected children per depth as integers, e.g. 3,2,1; got {text!r}") from None


def api_key_from(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get(API_KEY_ENV) or None
