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
# --no-compile: pip would byte-compile every installed module (torch's thousands: about half the
# set-up's CPU time, measured 82 s -> 49 s on 2 cores); Python compiles what is imported, once.
pip_install() {
    .venv/bin/python -m pip install --quiet --no-compile "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
pip_install --upgrade pip
pip_install -c constraints.txt -e ".[dev,hf,lora,serve,tracking,eval]"
# What every run imports, compiled now (6 s) even where PYTHONDONTWRITEBYTECODE is set, so that
# no `launch` or rank compiles torch from source at each start.
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import launcher.cli, launcher.worker.run, \
torch.optim, torch._dynamo, torch.distributed.run, torch.distributed.checkpoint, \
torch.distributed.tensor, torch.nn.parallel, hydra, omegaconf"
echo "$want" > "$stamp"
