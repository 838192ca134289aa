#!/usr/bin/env bash
# The whole check: lint, types, then the test suite. SLURM tests run when a cluster answers
# (CI starts one first with ../shared/slurm/start.sh); GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline WANDB_SILENT=true
# Python's byte-code cache on: each of the suite's hundreds of rank and `launch` starts otherwise
# compiles the launcher's modules from source again (about 0.2 CPU-seconds a start, measured),
# where an environment sets PYTHONDONTWRITEBYTECODE (some CI images do).
unset PYTHONDONTWRITEBYTECODE
# DeepSpeed JIT-builds its CPU shared-memory op on the first multi-rank run (half a minute or
# more, single-threaded). Built here, beside the lint, the suite's first DeepSpeed test does not
# wait for it; into the directory tests/conftest.py names. A failed build is only a slower suite
# (the test's own run builds it again and reports the error): a warning, not a failure.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}
op_log=$(mktemp)
.venv/bin/python -c 'import importlib; importlib.import_module("deepspeed.comm.torch").build_shm_op()' >"$op_log" 2>&1 &
op_build=$!
status=0
.venv/bin/ruff check launcher tests benchmarks examples setup.py || status=1
.venv/bin/ruff format --check --quiet launcher tests benchmarks examples setup.py || status=1
.venv/bin/mypy || status=1
if wait "$op_build"; then
    rm -f "$op_log"
else
    echo "test.sh: DeepSpeed's CPU op did not build here; the tests build it (log: $op_log)" >&2
fi
[ "$status" = 0 ] || exit 1
# pytest-xdist: two workers per core (one test's wait is another's turn), each test holding core
# tokens for the processes it keeps busy (tests/cores.py: three per core). --dist loadscope keeps a
# module's tests and its module fixtures on one worker; --no-loadscope-reorder hands modules out in
# tests/schedule.py's order (the SLURM modules' waits among the end-to-end modules, the quick unit
# tests to fill the end). --max-worker-restart=0: a worker that dies fails the run at once (xdist
# 3.8's loadscope hangs when it replaces one; tried).
# The slowest tests are listed at the end: where the suite's time goes, in every CI log.
# Then tests/suite_profile.py's summary: the tests that held core tokens without using them and the
# waits for tokens (LAUNCHER_TEST_PROFILE=FILE keeps its per-test lines).
workers=$(.venv/bin/python -c 'import os; print(2 * len(os.sched_getaffinity(0)))')
profile=${LAUNCHER_TEST_PROFILE:-}
if [ -z "$profile" ]; then
    profile=$(mktemp)
    trap 'rm -f "$profile"' EXIT
fi
export LAUNCHER_TEST_PROFILE=$profile
tests=0
.venv/bin/python -m pytest -n "$workers" --dist loadscope --no-loadscope-reorder \
    --max-worker-restart=0 --durations=25 "$@" || tests=$?
if [ -s "$profile" ]; then
    echo "=== where the suite's time went (tests/suite_profile.py) ==="
    .venv/bin/python -m tests.suite_profile "$profile" || true
fi
exit "$tests"
