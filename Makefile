# Quick start: `make run` (install + tiny CPU run), `make test` (install + every test tier).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= examples/tiny_cpu.yaml

.PHONY: install run test unit integration lint protos clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/relayrl up $(CONFIG)

protos: install
	$(PY) scripts/gen_protos.py

lint: install
	$(PY) scripts/gen_protos.py --check
	$(VENV)/bin/ruff check .

unit: install
	$(PY) -m pytest tests/unit -q

integration: install
	$(PY) -m pytest tests/integration -q

test: install lint
	$(PY) -m pytest tests -q

clean:
	rm -rf runs .pytest_cache
