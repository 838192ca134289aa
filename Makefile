# The two quick-start commands: `make train` and `make test`. Each sets up .venv first.
VENV := .venv/bin
ARGS ?=

.PHONY: setup train test lint bench clean

setup:
	@bash scripts/setup.sh

train: setup
	$(VENV)/launch train $(ARGS)

test: setup
	bash scripts/test.sh

lint: setup
	$(VENV)/ruff check launcher tests benchmarks
	$(VENV)/ruff format --check launcher tests benchmarks
	$(VENV)/mypy

clean:
	rm -rf outputs multirun .pytest_cache
