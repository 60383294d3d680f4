# Two commands do everything on a fresh clone: `make demo` and `make test`.
# Both create the virtualenv and install the project first.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv upgrade browser brokers node-door dist reference demo test lint docs openapi format bench loadtest loadtest-ramp chaos clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements-dev.lock tools/install-venv
	$(PYTHON) -m venv $(VENV)
	tools/install-venv $(VENV)
	touch $(STAMP)

venv: $(STAMP) ## Create the virtualenv and install the project with dev extras (at the lock's pins)

# On purpose, never by itself: newer releases of everything the dev extras bring,
# written to requirements-dev.lock, installed, and the suite run on them. Commit the
# lock only when the suite passes. UPGRADE="--upgrade-package NAME" takes one package.
upgrade: $(STAMP) ## Refresh requirements-dev.lock to the newest releases, reinstall, run the suite
	tools/lock-dev $(VENV) $(or $(UPGRADE),--upgrade)
	tools/install-venv $(VENV)
	touch $(STAMP)
	$(MAKE) test

dist: $(STAMP) ## Build the release: an sdist and a wheel in dist/ (install the wheel into your project)
	$(BIN)/python -m build --no-isolation --outdir dist .

demo: $(STAMP) ## Run `poller demo` on embedded PostgreSQL + Redis
	$(BIN)/poller demo

browser: ## Install Debian's Chromium for the dashboard's browser tests (idempotent)
	@tools/install-browser

brokers: ## Install Debian's RabbitMQ for the broker destinations' tests (idempotent; NATS comes with the venv)
	@tools/install-brokers

# Three workers on two cores: most tests wait on servers, leases and timers, not the
# CPU. A test that measures a rate never runs beside one that runs a fleet
# (tests/conftest.py: a lock the workers share).
TEST_WORKERS ?= 3

node-door: ## Install Node's pg for the doors' conformance suite (tests/doors/node; idempotent)
	@tools/install-node-door

test: $(STAMP) browser brokers node-door ## Run the whole test suite (real PostgreSQL, Redis, NATS, RabbitMQ, HTTP on 127.0.0.1, Chromium)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=15

lint: $(STAMP) ## ruff (lint + format check), mypy --strict and the import layers
	$(BIN)/ruff check poller tests loadtest db examples
	$(BIN)/ruff format --check poller tests loadtest db examples
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

docs: $(STAMP) ## Build the documentation site into site/ (mkdocs build --strict)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

reference: $(STAMP) ## Rewrite the reference sections generated from the code (settings, errors, SQLSTATEs, API routes, module map) in docs/
	$(BIN)/python docs/hooks/reference.py

openapi: $(STAMP) ## Write the management API's OpenAPI document to docs/api/openapi.json
	$(BIN)/python -c 'from poller.web.api import openapi, routes; print(openapi.text(routes.openapi_document()), end="")' > docs/api/openapi.json

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix poller tests loadtest db examples
	$(BIN)/ruff format poller tests loadtest db examples

bench: $(STAMP) brokers ## Benchmarks (not tests): each HTTP client's cost per request, claims vs raw psycopg, the governed claim over 10,000 endpoints, the plain claim by a poller's share of the shards, deliveries per CPU s with each client vs raw aiohttp and raw pyreqwest, deliveries to NATS, RabbitMQ and Redis vs each raw client, where commit→receipt goes, the poller's own CPU per delivery, ordered vs unordered, beside a dead endpoint, a tenant's fast endpoint beside another's slow ones, a key held open, publish vs enqueue, every door into the outbox vs a plain INSERT, a 1M backlog and the purge, the dashboard on 1M rows, tracing off/on/dead collector
	$(BIN)/python -m loadtest.clients
	$(BIN)/python -m loadtest.claims
	$(BIN)/python -m loadtest.governed
	$(BIN)/python -m loadtest.scopes
	$(BIN)/python -m loadtest.deliveries --processes 1,2
	$(BIN)/python -m loadtest.brokers_bench
	$(BIN)/python -m loadtest.latency
	$(BIN)/python -m loadtest.overhead
	$(BIN)/python -m loadtest.overhead --wire
	$(BIN)/python -m loadtest.ordered
	$(BIN)/python -m loadtest.health
	$(BIN)/python -m loadtest.fairness
	$(BIN)/python -m loadtest.held_key
	$(BIN)/python -m loadtest.publish
	$(BIN)/python -m loadtest.doors
	$(BIN)/python -m loadtest.backlog
	$(BIN)/python -m loadtest.dashboard
	$(BIN)/python -m loadtest.span_cost
	$(BIN)/python -m loadtest.tracing_bench

loadtest: $(STAMP) ## Locust load test (bounded) + report in loadtest/out; FAULTS=1 injects faults
	FAULTS=$(FAULTS) $(BIN)/python -m loadtest.run

loadtest-ramp: $(STAMP) ## Raise the order rate step by step until p99 commit→receipt passes 1 s; report the knee
	$(BIN)/python -m loadtest.ramp $(RAMP_ARGS)

chaos: $(STAMP) brokers ## Full chaos run (20,000 messages, every fault at once), the single-fault scenarios the suite leaves out + long fault hunts, HTTP and brokers (SEEDS=30 each)
	$(BIN)/python -m loadtest.chaos --scenario chaos --messages 20000 --deadline 300
	$(BIN)/python -m loadtest.chaos --scenario kill --scenario freeze --scenario receiver-faults --messages 5000 --deadline 180
	$(BIN)/python -m loadtest.hunt --seeds $(or $(SEEDS),30) --messages 1000
	$(BIN)/python -m loadtest.hunt_brokers --seeds $(or $(SEEDS),30) --messages 400

clean: ## Remove the virtualenv and local data
	rm -rf $(VENV) .poller .pytest_cache .mypy_cache .ruff_cache site
