#!/usr/bin/env bash
# The whole check: lint, types, then the test suite. SLURM tests run when a cluster answers
# (CI starts one first with ../shared/slurm/start.sh); GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline WANDB_SILENT=true
.venv/bin/ruff check launcher tests benchmarks examples setup.py
.venv/bin/ruff format --check --quiet launcher tests benchmarks examples setup.py
.venv/bin/mypy
# The slowest tests are listed at the end: where the suite's time goes, in every CI log.
.venv/bin/python -m pytest --durations=25 "$@"
