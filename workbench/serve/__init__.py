"""An OpenAI-compatible HTTP server over the engine, with Prometheus metrics under vLLM's names.

FastAPI, uvicorn and prometheus-client are imported by the submodules that need them, never here, so
``workbench.serve.options`` (the command-line flags) can be read by ``workbench --help`` without them.
"""
