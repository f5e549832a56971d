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

# The CDK CLI runs offline and quietly: no version check, no telemetry; jsii's Node 20 end-of-life banner is noise.
export CDK_DISABLE_VERSION_CHECK := 1
export CDK_DISABLE_CLI_TELEMETRY := true
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

demo: setup
	$(VENV)/bin/genai-constructs demo
	node_modules/.bin/cdk synth --quiet
	@echo "Synthesized every example into cdk.out/ (cdk-nag AwsSolutions, NIST 800-53 R5 and HIPAA packs on)."
	$(PY) -m genai_constructs.testing

deploy-local: setup
	$(PY) -m genai_constructs.testing

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check genai_constructs tests examples benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
