# Two commands for people: `make demo` and `make test`. Each sets itself up on a fresh machine
# (Python 3.11 + Node 20) and is a no-op for setup when nothing changed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
NODE_STAMP := node_modules/.installed-$(shell cat package.json package-lock.json | sha1sum | cut -c1-12)

.PHONY: demo test setup lint deploy-local clean

setup: $(STAMP) $(NODE_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,worker]'
	rm -f $(VENV)/.installed-*
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: setup
	$(VENV)/bin/genai-constructs demo

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check genai_constructs tests examples benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
