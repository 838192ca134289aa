# The two quick-start commands: `make train` and `make test`. Each sets up .venv first.
VENV := .venv/bin
ARGS ?=

.PHONY: setup train example test lint bench clean

setup:
	@bash scripts/setup.sh

train: setup
	$(VENV)/launch train $(ARGS)

# The user's own project of examples/own_project (its model, config directory and token files),
# trained on 2 ranks: see examples/own_project/README.md.
example: setup
	cd examples/own_project && ../../$(VENV)/launch train --config-dir conf +experiment=my_run parallel.dp=2 $(ARGS)

test: setup
	bash scripts/test.sh

lint: setup
	$(VENV)/ruff check launcher tests benchmarks examples setup.py
	$(VENV)/ruff format --check launcher tests benchmarks examples setup.py
	$(VENV)/mypy

clean:
	rm -rf outputs multirun .pytest_cache
