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
# ruff first (a second): a lint error stops here. mypy (a minute of one core on a fresh clone,
# torch's stubs) runs beside the tests instead of before them: the suite leaves a core idle while
# tests wait, and the type check fills those gaps. mypy's verdict is printed after the tests and
# fails the run as before.
.venv/bin/ruff check launcher tests benchmarks examples setup.py
.venv/bin/ruff format --check --quiet launcher tests benchmarks examples setup.py
beside=$(mktemp -d)
# An interrupted suite takes mypy with it (`|| true`: under set -e a kill of a finished job would be
# the script's exit status).
type_check=
trap '[ -z "$type_check" ] || kill "$type_check" 2>/dev/null || true; rm -rf "$beside"' EXIT
nice -n 10 .venv/bin/mypy >"$beside/mypy.log" 2>&1 &
type_check=$!
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
    profile=$beside/profile.jsonl
fi
export LAUNCHER_TEST_PROFILE=$profile
tests=0
.venv/bin/python -m pytest -n "$workers" --dist loadscope --no-loadscope-reorder \
    --max-worker-restart=0 --durations=25 "$@" || tests=$?
if [ -s "$profile" ]; then
    echo "=== where the suite's time went (tests/suite_profile.py) ==="
    .venv/bin/python -m tests.suite_profile "$profile" || true
fi
echo "test.sh: waiting for mypy, started beside the tests"
types=0
wait "$type_check" || types=$?
echo "=== mypy (run beside the tests) ==="
cat "$beside/mypy.log"
[ "$tests" = 0 ] || exit "$tests"
exit "$types"
