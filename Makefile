# sovereign-gateway developer entry points.
#   make run    install (from the hash-locked uv.lock) and start the demo: vLLM simulator + gateway
#   make test   install and run the CI test suite
# Everything is installed into git-ignored folders of this checkout (.venv, .tools, .cache).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TOOLS  := .tools
UV     := $(TOOLS)/uv/bin/uv
export UV_PYTHON_DOWNLOADS := never
# No hidden egress from the libraries we ship with (see README "Hidden egress").
export HF_HUB_DISABLE_TELEMETRY := 1
export DO_NOT_TRACK := 1
export VLLM_NO_USAGE_STATS := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: install run test test-vllm lint bench tools clean

$(UV): tools/uv-requirements.txt
	$(PYTHON) -m venv $(TOOLS)/uv
	$(TOOLS)/uv/bin/pip install --quiet --require-hashes -r tools/uv-requirements.txt
	touch $(UV)

$(VENV)/.installed: $(UV) uv.lock pyproject.toml tools/testdata-requirements.txt
	$(UV) sync --frozen --all-extras --python $(PYTHON)
	$(UV) pip install --no-config --python $(PY) --no-deps --require-hashes -r tools/testdata-requirements.txt
	touch $@

install: $(VENV)/.installed

# @helm-tools: helm, kubectl and checkov for the chart tests (owned by the Helm work).
tools: install

run: install
	$(PY) -m gateway.demo

test: install tools
	$(PY) -m pytest -q

test-vllm: install
	$(PY) -m pytest -q -m vllm tests/integration

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: install
	$(PY) bench/relay.py

clean:
	rm -rf $(VENV) $(TOOLS) .cache
