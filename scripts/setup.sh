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
# Some machines' pip configuration names package folders that do not exist there; pip then warns
# once per package. Those lines only are dropped; pip's exit status and other output stay.
pip_install() {
    .venv/bin/python -m pip install --quiet "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
pip_install --upgrade pip
pip_install -c constraints.txt -e ".[dev,hf,lora,serve,tracking,eval]"
echo "$want" > "$stamp"
