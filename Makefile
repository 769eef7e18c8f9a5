# The README names two targets: `make demo` (the main job) and `make test` (every test).
SHELL := /bin/bash
VENV := .venv/bin
PYTEST_WORKERS ?= 2
LINT_DIRS := $(wildcard operator tests e2e bench)

.PHONY: setup demo test lint unit integration crds clean e2e e2e-local bench

setup:
	@bash scripts/bootstrap.sh

demo: setup
	@$(VENV)/sandlot demo $(DEMO_ARGS)

lint: setup
	$(VENV)/ruff check $(LINT_DIRS)
	$(VENV)/ruff format --check $(LINT_DIRS)
	$(VENV)/mypy
	$(VENV)/lint-imports

# The local kubelet cluster's scenarios run on their own (`make e2e-local`): their
# order-dependent steps are not yet reliable inside the parallel suite.
test: lint
	$(VENV)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup \
		--ignore=e2e/test_local_cluster.py $(PYTEST_ARGS)

e2e-local: setup
	$(VENV)/python -m pytest e2e/test_local_cluster.py -n 0 -rs $(PYTEST_ARGS)

unit: setup
	$(VENV)/python -m pytest tests/unit -q

e2e: setup
	$(VENV)/python -m pytest e2e -m kind -rs $(PYTEST_ARGS)

bench: setup
	$(VENV)/python bench/run.py $(BENCH_ARGS)

crds: setup
	$(VENV)/sandlot gen crds

clean:
	rm -rf .venv .dev .pytest_cache .mypy_cache .ruff_cache
