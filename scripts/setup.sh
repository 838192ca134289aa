#!/usr/bin/env bash
# Creates .venv and installs launcher with its dev tools; re-runs only when pyproject.toml,
# setup.py or constraints.txt changed. torch is pinned by constraints.txt (a CPU build that lies on disk here).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.installed
want=$(cat pyproject.toml setup.py constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "setup: installing launcher and its dependencies into .venv (first run takes a minute or two)"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev,hf]"
echo "$want" > "$stamp"
