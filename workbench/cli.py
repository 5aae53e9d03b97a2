"""The workbench command: generate text, describe a model or an architecture, fetch the real weights, serve the
engine over HTTP and measure any OpenAI-compatible server.

    workbench generate "Explain the KV cache in one sentence."
    workbench info [--model llama-3-70b] [--tensor-parallel 8]
    workbench fetch
    workbench serve [--port 8000] [--api-key KEY]      an OpenAI-compatible server with /metrics
    workbench bench --base-url URL | --start-server    a load generator for any OpenAI-compatible server

Bad input (an empty prompt, a negative temperature, a device this build has not got, ...) ends with a one-line
error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# What `workbench --help` shows: this module's docstring is the description (plain text, no markup).
HELP_EPILOG = """\
Every command has its own --help (workbench generate --help, ...).
The text model is SmolLM2-135M-Instruct, 135 million parameters: it answers fluently and is often wrong; that
is the model's size, not the engine. llama-3-8b, llama-3-70b and the other architectures have no trained
weights here: workbench info sizes them, and random-weight copies time them."""


def _weight_format(value: str) -> str:
    """--weights: one of the weight formats; a KV-cache format asked for here says where it belongs (the README's
    'fp8/int8/int4 KV formats' invites `--weights int4`)."""
    from workbench.config import KV_CACHE_DTYPES
    from workbench.models.int8_linear import WEIGHT_FORMATS

    if value in WEIGHT_FORMATS:
        return value
    kv = value if value in KV_CACHE_DTYPES else "fp8_e4m3" if value.startswith("fp8") else None
    hint = f"; {value} names a KV-cache format (workbench serve --kv-cache-dtype {kv}), not a weight one" if kv else ""
    if value == "int4" and "q4_1" in WEIGHT_FORMATS:
        hint += "; 4-bit weights are q4_1"
    raise argparse.ArgumentTypeError(f"invalid weight format {value!r} (choose from {', '.join(WEIGHT_FORMATS)}){hint}")


def _parser() -> argparse.ArgumentParser:
    from workbench.models.int8_linear import WEIGHT_FORMATS

    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\nBad input")[0],
                                     epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion and report TTFT and tokens/s")
    gen.add_argument("prompt")
    gen.add_argument("--model", default="smollm2-135m",
                     help="a model with real weights (default smollm2-135m, the only one)")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, no chat template")
    gen.add_argument("--no-cache", action="store_true", help="recompute the whole sequence every step")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    gen.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    gen.add_argument("--weights", type=_weight_format, default="auto", metavar="{" + ",".join(WEIGHT_FORMATS) + "}",
                     help="int8: linear layers in int8 with per-channel scales; int8_all: the LM head too; "
                          "q4_1: the GGUF file's own 4-bit blocks (exact to the float32 weights); q8_0: Q8_0 "
                          "blocks for every linear layer")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="keep generating past the end-of-sequence token (a fixed length, for timing)")

    info = sub.add_parser("info", help="device, dtype, model shape and KV bytes per token")
    info.add_argument("--model", default="smollm2-135m",
                      help="a real model or any architecture in datasets/configs")
    info.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    info.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                      help="KV and weight dtype of the sizes (default: the checkpoint's, bfloat16 for most, as a GPU "
                           "serves it; float32 for the real model on one device, as `workbench generate` runs it)")
    info.add_argument("--context", type=int, default=None, metavar="N",
                      help="context for the per-sequence KV lines (default: the model's max_position_embeddings)")
    info.add_argument("--weights", type=_weight_format, default="auto", metavar="{" + ",".join(WEIGHT_FORMATS) + "}",
                      help="weight format for the sizes shown")
    info.add_argument("--tensor-parallel", "-tp", type=int, default=1, metavar="N",
                      help="split KV heads across N GPUs (replicated past the number of KV heads)")
    info.add_argument("--pipeline-parallel", "-pp", type=int, default=1, metavar="P",
                      help="split the layers across P pipeline stages")
    info.add_argument("--gpu-memory-gib", type=float, default=80.0,
                      help="memory of one GPU for the tokens-that-fit line (default 80, an H100)")
    info.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                      help="share of a GPU's memory the engine may use (vLLM's default 0.9)")

    fetch = sub.add_parser("fetch", help="convert the real model into the cache directory and build the GGUF CPU "
                                         "product")
    fetch.add_argument("model", nargs="?", default="smollm2-135m")
    fetch.add_argument("--force", action="store_true", help="convert again even if present")

    from workbench.bench.command import add_bench_arguments
    from workbench.serve.options import add_server_arguments

    add_server_arguments(sub.add_parser("serve", help="serve the engine over an OpenAI-compatible HTTP API"))
    add_bench_arguments(sub.add_parser("bench", help="measure TTFT/TPOT/ITL/throughput of any OpenAI endpoint"))
    return parser


def _generate(args: argparse.Namespace) -> None:
    from workbench.config import SamplingParams
    from workbench.generation import generate
    from workbench.models import load_model

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
    if not args.prompt.strip():
        raise ValueError("prompt must be non-empty text")
    model, tokenizer = load_model(args.model, dtype=DTYPES[args.dtype], device=args.device, weights=args.weights)

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = generate(model, tokenizer, args.prompt, params, use_cache=not args.no_cache,
                      chat=not args.no_chat, on_text=show)
    n = len(result.token_ids)
    overall = n / result.total_s if result.total_s > 0 else float("nan")
    print(file=sys.stdout)
    print(f"[{n} tokens, finish: {result.finish_reason}] TTFT {result.ttft_s * 1e3:.0f} ms, "
          f"{overall:.1f} tokens/s overall, {result.decode_tokens_per_s:.1f} tokens/s decode "
          f"({model.device}, {args.dtype}, weights {args.weights}, {'no cache' if args.no_cache else 'KV cache'})",
          file=sys.stderr)


def _info(args: argparse.Namespace) -> None:
    from workbench.cache.kv_layout import kv_layout, layout_from_spec
    from workbench.cache.sizing import kv_bytes_per_token, weight_bytes
    from workbench.models import checkpoint_dir, model_spec, resolve_device
    from workbench.models.convert import PROVENANCE_FILE
    from workbench.models.registry import _ALIASES, REAL_MODELS, config_names

    if args.context is not None and args.context < 1:
        raise ValueError(f"--context must be >= 1, got {args.context}")
    device = resolve_device(args.device)
    runs_here = args.model.lower() in REAL_MODELS or args.model.lower() in _ALIASES
    device_row = [("device", torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({torch.get_num_threads()} threads)")] if runs_here else []
    if not runs_here and args.model not in config_names():
        layout = kv_layout(args.model)  # sized, not run: MLA, linear attention, MoE
        dtype_name, why = _sizing_dtype(args, layout.checkpoint_dtype, runs_here=False)
        rows = [("dtype", f"{dtype_name} ({why})"), ("model", layout.name),
                ("architecture", f"{layout.model_type}: {layout.num_layers} layers, {layout.num_query_heads} query "
                                 "heads"), ("max context", layout.max_position_embeddings)]
        rows += _group_rows(layout, args, DTYPES[dtype_name])
        rows.append(("weights", "architecture only: sized here, not run by this engine"))
        _print_rows(rows)
        return
    spec = model_spec(args.model)
    dtype_name, why = _sizing_dtype(args, spec.checkpoint_dtype, runs_here=runs_here)
    dtype = DTYPES[dtype_name]
    per_token = kv_bytes_per_token(spec, dtype)
    rows = [
        *device_row,
        ("dtype", f"{dtype_name} ({why})"),
        ("model", spec.name),
        ("parameters", _count(spec.num_parameters())),
        ("weight bytes", f"{_bytes(weight_bytes(spec, dtype, args.weights))} (weights {args.weights})"),
        ("layers", spec.num_layers),
        ("hidden size", spec.hidden_size),
        ("attention", f"{spec.attention_kind}: {spec.num_heads} query heads, {spec.num_kv_heads} KV heads, "
                      f"head_dim {spec.head_dim}"),
        ("vocabulary", spec.vocab_size),
        ("max context", spec.max_context),
        ("KV bytes per token", f"{per_token:,} B ({per_token / 1024:.1f} KiB)"),
        ("KV bytes at max context", f"{per_token * spec.max_context / 2**20:,.1f} MiB per sequence"),
    ]
    if len(layout_from_spec(spec).groups) > 1 or spec.sliding_window is not None or args.context is not None:
        rows += _group_rows(layout_from_spec(spec), args, dtype)
    rows += _parallel_rows(spec, args, dtype)
    if spec.name in REAL_MODELS or args.model in REAL_MODELS:
        path = checkpoint_dir(args.model)
        ready = (path / PROVENANCE_FILE).is_file()
        rows.append(("weights", str(path) if ready else "not converted yet: run `make model`"))
    else:
        rows.append(("weights", "architecture only (random weights via workbench.random_model)"))
    _print_rows(rows)


def _sizing_dtype(args: argparse.Namespace, checkpoint_dtype: str, *, runs_here: bool) -> tuple[str, str]:
    """The dtype the sizes are in, and why: the one asked for; float32 for the real model on one device (what
    `workbench generate` runs); otherwise the checkpoint's (bfloat16 for most), what a GPU deployment serves."""
    if args.dtype:
        return args.dtype, "--dtype"
    if runs_here and args.tensor_parallel == 1 and args.pipeline_parallel == 1:
        return "float32", "as workbench generate runs it; --dtype bfloat16 for a GPU's sizes"
    return checkpoint_dtype, "the checkpoint's, as a GPU serves it; --dtype to change"


def _count(n: int) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.1f} M"


def _bytes(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _print_rows(rows: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _group_rows(layout, args: argparse.Namespace, dtype: torch.dtype) -> list[tuple[str, str]]:
    """KV by layer group (`workbench.cache.layout_sizing`): bytes per token of each, on one GPU under TP, and
    the per-sequence total at the context asked for."""
    from workbench.cache.layout_sizing import group_rows

    context = args.context or layout.max_position_embeddings
    tp = args.tensor_parallel
    frame = group_rows(layout, context, kv_format=dtype, state_dtype=dtype, tp=tp)
    on = f" per GPU (TP {tp})" if tp > 1 else ""
    rows = []
    for group, row in frame.drop(index="total").iterrows():
        kept = (f"{row.state_bytes_per_sequence:,} B of state per sequence" if row.bytes_per_token == 0
                else f"{row.bytes_per_token:,} B per token, {row.cached_tokens:,} tokens kept")
        rows.append((f"KV group {group}", f"{row['layers']} layers, {row['shape']}: {kept}{on}"))
    total = int(frame.loc["total", "bytes_per_sequence"])
    rows.append((f"KV per sequence at {context:,}", f"{total:,} B ({total / 2**30:,.3f} GiB){on}"))
    if tp > 1 and layout.group("mla") is not None:
        rows.append(("MLA under TP", "the latent is one head every query head reads: each rank caches all of it "
                                     "(TP splits the query heads, not the cache)"))
    if layout.sinks:
        rows.append(("attention sinks", layout.sinks))
    return rows


def _parallel_rows(spec, args: argparse.Namespace, dtype: torch.dtype) -> list[tuple[str, str]]:
    """Per-GPU KV sizing under TP x PP (`workbench.cache.parallel_sizing`), when either degree is above 1."""
    from workbench.cache.parallel_sizing import gpu_share

    if args.gpu_memory_gib <= 0:
        raise ValueError(f"--gpu-memory-gib must be > 0, got {args.gpu_memory_gib}")
    share = gpu_share(spec, args.tensor_parallel, args.pipeline_parallel, kv_format=dtype, model_dtype=dtype)
    if share.gpus == 1:
        return []
    memory = int(args.gpu_memory_gib * 2**30)
    copies = f", each copied on {share.kv_head_replicas} ranks" if share.kv_head_replicas > 1 else ""
    return [
        ("parallelism", f"TP {share.tensor_parallel} x PP {share.pipeline_parallel} = {share.gpus} GPUs"),
        ("KV heads per GPU", f"{share.kv_heads_per_rank} of {spec.num_kv_heads}{copies}"),
        ("layers per stage", ", ".join(str(n) for n in share.layers_per_stage)),
        ("KV bytes per token per GPU", f"{share.kv_bytes_per_token:,} B (whole model: "
                                       f"{share.total_kv_bytes_per_token:,} B)"),
        ("weights per GPU (even split)", f"{share.weight_bytes_per_gpu / 2**30:,.2f} GiB"),
        ("tokens that fit per GPU", f"{share.tokens_that_fit(memory, args.gpu_memory_utilization):,} "
                                    f"({args.gpu_memory_gib:g} GiB x {args.gpu_memory_utilization:g}, minus weights)"),
    ]


def _fetch(args: argparse.Namespace) -> None:
    from workbench.models import fetch_model, gguf_cpu

    print(fetch_model(args.model, force=args.force))
    # The GGUF weight formats' CPU product is compiled here too (a few seconds, once per machine), so that `make
    # setup` builds it and the first `--weights q4_1` does not; a failure is reported and the formats fall back.
    status = gguf_cpu.extension()
    print(f"GGUF CPU product: {status.vector_path + ' extension' if status.loaded else status.reason}")


def _serve(args: argparse.Namespace) -> None:
    from workbench.serve.launch import serve_from_args

    serve_from_args(args)


def _bench(args: argparse.Namespace) -> None:
    from workbench.bench.command import bench_from_args

    bench_from_args(args)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"generate": _generate, "info": _info, "fetch": _fetch, "serve": _serve, "bench": _bench}
    try:
        handlers[args.command](args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
