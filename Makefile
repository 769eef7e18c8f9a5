# The README names two targets: `make demo` (the main job) and `make test` (every test).
SHELL := /bin/bash
VENV := .venv/bin
PYTEST_WORKERS ?= 2
LINT_DIRS := $(wildcard operator tests e2e bench)

.PHONY: setup demo test lint unit integration crds clean e2e e2e-local bench soak lock

setup:
	@bash scripts/bootstrap.sh

demo: setup
	@$(VENV)/sandlot demo $(DEMO_ARGS)

lint: setup
	$(VENV)/ruff check $(LINT_DIRS)
	$(VENV)/ruff format --check $(LINT_DIRS)
	$(VENV)/mypy
	$(VENV)/mypy bench  # the benchmarks, apart: pyproject's mypy section names the package
	$(VENV)/mypy tests e2e  # the tests, apart too: their fixtures may go unannotated
	$(VENV)/lint-imports

# Two runs, both always: every test but the local cluster's on $(PYTEST_WORKERS)
# workers, then the local cluster's scenarios on their own. Beside two workers of
# other tests a 2-core machine slows the cluster's programs past the scenarios'
# shortened leases (an agent restarted by `helm upgrade` renewing too late).
# The target fails if either run fails, with the first failing run's pytest code.
CLUSTER_TESTS := e2e/test_local_cluster.py
test: lint
	suite=0; cluster=0; \
	$(VENV)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup \
		--ignore=$(CLUSTER_TESTS) $(PYTEST_ARGS) || suite=$$?; \
	$(VENV)/python -m pytest -p tests.support.strict_skips $(CLUSTER_TESTS) -n 0 \
		$(PYTEST_ARGS) || cluster=$$?; \
	if [ $$suite -ne 0 ]; then exit $$suite; fi; exit $$cluster

e2e-local: setup
	$(VENV)/python -m pytest -p tests.support.strict_skips $(CLUSTER_TESTS) -n 0 -rs $(PYTEST_ARGS)

unit: setup
	$(VENV)/python -m pytest tests/unit -q

# The lifecycle's stateful fault test with a long budget and a fresh random seed
# (`make test` runs a fixed budget on a fixed seed). SOAK_EXAMPLES sets the budget.
SOAK_EXAMPLES ?= 5000
soak: setup
	SANDLOT_LIFECYCLE_EXAMPLES=$(SOAK_EXAMPLES) $(VENV)/python -m pytest -n 0 -q \
		tests/unit/test_lifecycle_machine.py

e2e: setup
	$(VENV)/python -m pytest e2e -m kind -rs $(PYTEST_ARGS)

bench: setup
	$(VENV)/python bench/run.py $(BENCH_ARGS)

crds: setup
	$(VENV)/sandlot gen crds

# The locks, with hashes, from pyproject.toml: requirements/runtime.txt is what the
# image installs (Dockerfile, sandlot.devtools.cluster.images), requirements/dev.txt
# what `make setup` and CI install (the `dev` extra too). Existing pins are kept where
# pyproject's bounds allow; to move one, edit or delete its line and run this again.
# pip-tools lives in a virtualenv of its own: it is needed to lock, never to run.
# Resolved for this machine's python3 (3.11, the image's Debian bookworm's).
PIP_TOOLS := .dev/piptools
PIP_COMPILE := $(PIP_TOOLS)/bin/pip-compile --quiet --generate-hashes --strip-extras \
	--allow-unsafe --no-emit-find-links
lock:
	@test -x $(PIP_TOOLS)/bin/pip-compile || { python3 -m venv $(PIP_TOOLS) \
		&& $(PIP_TOOLS)/bin/pip install -q pip-tools==7.6.2; }
	$(PIP_COMPILE) --output-file=requirements/runtime.txt pyproject.toml
	$(PIP_COMPILE) --extra=dev --output-file=requirements/dev.txt pyproject.toml

clean:
	rm -rf .venv .dev .pytest_cache .mypy_cache .ruff_cache
