"""The FastAPI application: OpenAI's endpoints and vLLM's extras over one engine.

    POST /v1/completions        raw text (or token ids) in, text out; streaming with server-sent events
    POST /v1/chat/completions   chat messages through the model's chat template
    GET  /v1/models             the one served model
    POST /tokenize              vLLM's tokenizer endpoint
    GET  /health                200 while the engine loop runs and takes requests, 503 otherwise
    POST /detokenize            token ids back to text
    GET  /version               the workbench's version
    GET  /metrics               Prometheus text exposition, vLLM's metric names (and its HTTP route series)

``create_app`` wires an ``LLMEngine`` into an app whose lifespan starts and stops the ``EngineLoop`` and the
text workers: the server adapts the engine, it does not schedule. Every generation route goes through one
``Pipeline`` (tokenize off the engine thread, check the context, admit, abort on disconnect), every route through
one edge (``json_body_edge``: JSON bodies with valid Unicode text) and one ``GuardedRoute`` (an unexpected error is
a 500 that keeps the connection). With ``api_key`` every path under ``/v1`` and ``/hosted`` needs
``Authorization: Bearer <key>``, checked before anything else; as in vLLM, /tokenize, /detokenize, /health,
/metrics, /version and /openapi.json stay open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from importlib.metadata import version as package_version
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_fastapi_instrumentator import Instrumentator

from workbench.engine.llm_engine import LLMEngine
from workbench.hosted.pricing import models as hosted_models
from workbench.serve.anthropic_messages import hosted_router
from workbench.serve.engine_loop import DEFAULT_RETAIN_FINISHED, EngineLoop
from workbench.serve.errors import SERVER_ERROR, APIError, GuardedRoute, error_response, install_error_handlers
from workbench.serve.generation import Generator
from workbench.serve.guards import DEFAULT_MAX_BODY_BYTES, ApiKeyGuard, BodySizeLimit, json_body_edge
from workbench.serve.metrics import ServingMetrics
from workbench.serve.openapi import ServerFacts, install_openapi
from workbench.serve.pipeline import Pipeline
from workbench.serve.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from workbench.serve.text_workers import DEFAULT_TEXT_WORKERS, TextWorkers

UNINSTRUMENTED_ROUTES = ("/metrics", "/health", "/version")


def create_app(engine: LLMEngine, *, model_name: str = "smollm2-135m", api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, retain_finished: int = DEFAULT_RETAIN_FINISHED,
               text_workers: int = DEFAULT_TEXT_WORKERS, model_root: str | None = None) -> FastAPI:
    """An app serving ``engine`` as ``model_name``. The engine must have a tokenizer. ``model_root``: where the
    weights and tokenizer live (/v1/models' ``root``; default: the tokenizer's folder, else the model name)."""
    model_root = model_root or _tokenizer_folder(engine.tokenizer)
    if engine.tokenizer is None:
        raise ValueError("the server needs an engine with a tokenizer (to apply chat templates and decode text)")
    if not model_name:
        raise ValueError("model_name must be a non-empty string")
    max_context = engine.model.spec.max_context
    cache = engine.cache_config
    cache_info = {"block_size": cache.block_size, "num_gpu_blocks": engine.blocks.num_blocks,
                  "cache_dtype": cache.kv_cache_dtype, "enable_prefix_caching": cache.enable_prefix_caching}
    loop = EngineLoop(engine, ServingMetrics(model_name, max_context, cache_info), retain_finished=retain_finished)
    workers = TextWorkers(engine.tokenizer, text_workers)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            loop.stop()
            workers.close()

    app = FastAPI(title="KV Workbench", lifespan=lifespan, docs_url=None, redoc_url=None,
                  dependencies=[Depends(json_body_edge)])
    app.router.route_class = GuardedRoute
    app.state.engine_loop = loop
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    # vLLM's HTTP route series (http_requests_total by handler and status, http_request_duration_seconds, sizes),
    # from the library vLLM uses, into the same registry as the engine's series; the service routes excluded
    # as vLLM excludes them.
    Instrumentator(excluded_handlers=list(UNINSTRUMENTED_ROUTES), registry=loop.metrics.registry).add().instrument(app)
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)  # the outermost: 401 before any other answer
    install_error_handlers(app)
    pipeline = Pipeline(loop, workers)
    generator = Generator(pipeline, model_name, model_root)
    v1 = APIRouter(prefix="/v1", route_class=GuardedRoute)
    # vLLM's ModelCard: root is what `vllm bench serve` loads its tokenizer from when run without --model (the
    # local checkpoint folder when there is one), permission an empty list, parent null for a base model.
    model_card = {"id": model_name, "object": "model", "created": generator.created, "owned_by": "kv-workbench",
                  "root": model_root or model_name, "parent": None, "max_model_len": max_context, "permission": []}

    @v1.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card]}

    @v1.post("/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generator.respond(body, request, chat=False)

    @v1.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await generator.respond(body, request, chat=True)

    app.include_router(v1)
    app.include_router(hosted_router(pipeline))
    _add_service_routes(app, loop, generator)
    unguarded = [r.path for r in _api_routes(app.routes) if not isinstance(r, GuardedRoute)]
    if unguarded:
        raise RuntimeError(f"routes without GuardedRoute: {unguarded}")
    install_openapi(app, ServerFacts(model_name, engine.scheduler_config.max_num_seqs, pipeline.vocab_size,
                                     tuple(hosted_models("anthropic")), tuple(hosted_models("openai")), bool(api_key)))
    return app


def _api_routes(routes: list) -> Iterator[APIRoute]:
    """Every APIRoute, those of included routers too (FastAPI keeps an included router as one entry)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif getattr(route, "original_router", None) is not None:
            yield from _api_routes(route.original_router.routes)


def _tokenizer_folder(tokenizer) -> str | None:
    """The local folder the tokenizer was loaded from, if it was (transformers keeps it as name_or_path)."""
    name = getattr(tokenizer, "name_or_path", None)
    return str(Path(name).resolve()) if isinstance(name, str) and name and Path(name).is_dir() else None


def workbench_version() -> str:
    return package_version("kv-workbench")


def _add_service_routes(app: FastAPI, loop: EngineLoop, generator: Generator) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        if not loop.alive or loop.draining:
            why = "the server is shutting down" if loop.draining else "the engine loop is not running"
            return error_response(request, 503, why, code="service_unavailable", type_=SERVER_ERROR)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(loop.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        generator.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        tokens, strings = await generator.tokenize(body)
        return JSONResponse({"count": len(tokens), "max_model_len": generator.max_context, "tokens": tokens,
                             "token_strs": strings})

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        generator.check_model(body.model)
        return JSONResponse({"prompt": await generator.detokenize(body.tokens)})

    @app.get("/version")
    async def version() -> JSONResponse:
        """vLLM answers with its own version; this server with the workbench's (clients only log it)."""
        return JSONResponse({"version": workbench_version()})
