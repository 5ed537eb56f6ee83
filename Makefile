# notes-exports — every target sets up what it needs (venv, OS packages) by itself.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

PYTEST_ARGS ?=

.PHONY: help
help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml libs/exportcore/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e libs/exportcore -e '.[dev]'
	touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install the packages (editable) with dev tools

.PHONY: os-packages
os-packages: ## Install PostgreSQL and Redis from the OS packages when absent
	bash scripts/localstack.sh os-packages

.PHONY: dev
dev: install os-packages ## Run the whole stack locally (PostgreSQL, Redis, api, publisher, workers)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/dev.sh

.PHONY: test
test: install os-packages ## Run the test suite (unit, integration, e2e) on real PostgreSQL + Redis
	$(BIN)/pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: install os-packages ## Unit and integration tests only (no e2e processes)
	$(BIN)/pytest -m "not e2e" $(PYTEST_ARGS)

.PHONY: lint
lint: install ## ruff check, ruff format --check, mypy on libs/exportcore
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

.PHONY: format
format: install ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: migrate
migrate: install ## Apply migrations to DATABASE_URL
	$(BIN)/exportctl migrate

.PHONY: clean
clean: ## Stop local servers and remove .dev/ and .test/ state
	-bash scripts/localstack.sh pg-stop .dev/pg
	-bash scripts/localstack.sh redis-stop .dev/redis 56379
	-bash scripts/localstack.sh pg-stop .test/pg
	-bash scripts/localstack.sh redis-stop .test/redis 56380
	rm -rf .dev .test
