"""The public contract of `launch` (DESIGN.md, "Contract") as a normalised snapshot.

Each scenario runs the CLI exactly as a user would (`python -m launcher.cli`, cwd = the repo
root): `launch plan` in one directory and, for training scenarios, `launch train` with the same
overrides in another. This module's command line starts new interpreters; the test forks them
from its warm server (tests/served.py), the same process without Python's start-up.

The snapshot keeps what users and other code rely on: the plan's printed lines, plan.json,
config.yaml, ds_config.json, train.sbatch, the exit codes, the run directory's file names,
checkpoint layout, and the keys of metrics.jsonl and summary.json. It replaces what legitimately
varies from run to run or machine to machine:

- the run directory's absolute path -> <RUN>, the Python executable -> <PYTHON>, the repo
  root -> <REPO>;
- wandb's run timestamp and random id -> <TIMESTAMP>, <WANDB_ID>;
- OMP_NUM_THREADS (local CPU count // ranks per node) -> <CPUS/RANKS_PER_NODE>, but only when it
  has exactly that value; the warning `launch` prints when there are fewer cores than ranks is
  dropped (it depends on the machine, not the config);
- values in metrics.jsonl and summary.json that are measurements (times, throughput, memory,
  losses, accuracy, measured FLOP ratios) -> "<measured>"; values fixed by the config and the
  seed (step, tokens, lr, split, engine, ...) are kept.

Regenerate the goldens (from the code whose behaviour is the reference):

    python -m tests.e2e.contract_snapshot --write [SCENARIO ...]

Without --write it compares against the goldens and prints a unified diff per difference.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "tests" / "golden" / "contract"

# Small and fast, but everything the contract names still happens: two optimizer steps, a
# checkpoint after each (checkpoint.keep=2 keeps both), a final eval. train.device=cpu keeps the
# snapshot the same on a machine with GPUs.
TINY = (
    "model=tiny",
    "model.d_model=64",
    "model.n_head=2",
    "data.eval_problems=16",
    "batch.global_size=8",
    "train.steps=2",
    "checkpoint.every=1",
    "train.device=cpu",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    overrides: tuple[str, ...]
    train: bool
    """Also run `launch train` (otherwise `launch plan` only)."""
    ranks_per_node: int
    multiproc: bool = False


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # dp=1, in-process; wandb left at its default (offline), so wandb/ is part of the run dir.
        Scenario("default", TINY, train=True, ranks_per_node=1),
        Scenario(
            "dp2",
            (*TINY, "wandb.mode=disabled", "parallel.dp=2"),
            train=True,
            ranks_per_node=2,
            multiproc=True,
        ),
        Scenario(
            "deepspeed_zero3",
            (
                *TINY,
                "wandb.mode=disabled",
                "engine=deepspeed",
                "engine.zero_stage=3",
                "parallel.dp=2",
            ),
            train=True,
            ranks_per_node=2,
            multiproc=True,
        ),
        Scenario(
            "slurm_plan",
            ("cluster=slurm", "parallel.nodes=2", "parallel.dp=2"),
            train=False,
            ranks_per_node=1,
        ),
    )
}

# Contract files copied into the snapshot when a directory holds them.
JSON_FILES = ("plan.json", "ds_config.json")
TEXT_FILES = ("config.yaml", "train.sbatch")

# Values fixed by the config, the data and the seed; every other value is a measurement.
METRIC_VALUES = frozenset(
    {"step", "tokens", "rank_tokens_min", "rank_tokens_max", "padding_fraction", "lr", "skipped"}
)
SUMMARY_VALUES = frozenset(
    {
        "steps",
        "tokens",
        "world_size",
        "dp",
        "tp",
        "pp",
        "micro_size",
        "grad_accum",
        "global_size",
        "engine",
        "ac",
        "status",
        "resumed_from_step",
        "flops_per_token",
        "peak_flops",
        "device",
        "padding_fraction",
        "rank_tokens_min",
        "rank_tokens_max",
    }
)
MEASURED = "<measured>"

# The launcher adds these to the ranks' environment only when they are not already set (and the
# plan lists what it adds), and these make a process think it is a rank or a SLURM job.
_ENV_DROP = {
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}
_ENV_DROP_PREFIXES = ("SLURM_", "TORCHELASTIC_")

_CORES_WARNING = re.compile(r"parallel\.dp=\d+ ranks on \d+ CPU core\(s\)")
_WANDB_RUN = re.compile(r"\b(offline-run|run)-\d{8}_\d{6}-[0-9a-z]+\b")
_MACHINE_BUDGET = re.compile(r"\d+% of the budget [\d.,]+ [KMGT]?i?B")


def local_cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cli_env(served: bool = False) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _ENV_DROP and not key.startswith(_ENV_DROP_PREFIXES)
    }
    if not served:  # a fork of the tests' server imports the repo already; PYTHONPATH would
        # differ from the server's start-up and make tests/served.py start an interpreter
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["WANDB_MODE"] = "offline"
    env["WANDB_SILENT"] = "true"
    return env


def run_cli(
    args: list[str], run_dir: Path, served: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m launcher.cli ARGS` in the repo root; served: forked from the tests' warm server
    (tests/served.py: the same process without an interpreter's start-up)."""
    args = [*args, f"hydra.run.dir={run_dir}"]
    if served:
        from tests.served import served_run

        return served_run(args, REPO, cli_env(served=True), timeout=600)
    argv = [sys.executable, "-m", "launcher.cli", *args]
    return subprocess.run(
        argv, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600, check=False
    )


class Normaliser:
    def __init__(self, run_dirs: list[Path], ranks_per_node: int) -> None:
        pairs: dict[str, str] = {}
        for path, token in [
            *((d, "<RUN>") for d in run_dirs),
            (Path(sys.executable), "<PYTHON>"),
            (REPO, "<REPO>"),
        ]:
            pairs.setdefault(str(path), token)
            pairs.setdefault(os.path.realpath(path), token)
        # Longest first: the venv's python may live under the repo root.
        self.pairs = sorted(pairs.items(), key=lambda kv: len(kv[0]), reverse=True)
        self.threads = str(max(1, local_cpu_count() // ranks_per_node))

    def text(self, value: str) -> str:
        for old, new in self.pairs:
            value = value.replace(old, new)
        value = _WANDB_RUN.sub(lambda m: f"{m[1]}-<TIMESTAMP>-<WANDB_ID>", value)
        # The default memory budget is this machine's RAM shared by its ranks.
        value = _MACHINE_BUDGET.sub("<SHARE> of the budget <RAM/RANKS_PER_NODE>", value)
        return re.sub(
            rf"\bOMP_NUM_THREADS={self.threads}\b",
            "OMP_NUM_THREADS=<CPUS/RANKS_PER_NODE>",
            value,
        )

    def lines(self, value: str) -> list[str]:
        return [self.text(line) for line in value.splitlines() if not _CORES_WARNING.search(line)]

    def data(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.data(v) for v in value]
        if isinstance(value, dict):
            out = {self.text(k): self.data(v) for k, v in value.items()}
            if out.get("OMP_NUM_THREADS") == self.threads:  # plan.json's "env"
                out["OMP_NUM_THREADS"] = "<CPUS/RANKS_PER_NODE>"
            if isinstance(out.get("memory_budget_bytes"), int):  # plan.json: this machine's RAM
                out["memory_budget_bytes"] = "<RAM/RANKS_PER_NODE>"
            return out
        return value


def _entry(path: Path, root: Path) -> str:
    name = path.relative_to(root).as_posix()
    return name + "/" if path.is_dir() else name


def run_dir_files(run_dir: Path, norm: Normaliser) -> list[str]:
    """Top-level names; checkpoints/ in full; wandb/ one level (dirs end in '/')."""
    if not run_dir.is_dir():
        return []
    names: list[str] = []
    for path in run_dir.iterdir():
        names.append(_entry(path, run_dir))
        if path.name == "checkpoints" and path.is_dir():
            names += [_entry(p, run_dir) for p in path.rglob("*")]
        elif path.name == "wandb" and path.is_dir():
            names += [_entry(p, run_dir) for p in path.iterdir()]
    return sorted(norm.text(name) for name in names)


def contract_files(run_dir: Path, norm: Normaliser) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in JSON_FILES:
        if (run_dir / name).is_file():
            out[name] = norm.data(json.loads((run_dir / name).read_text()))
    for name in TEXT_FILES:
        if (run_dir / name).is_file():
            out[name] = norm.lines((run_dir / name).read_text())
    return out


def keep_values(record: dict[str, Any], keep: frozenset[str]) -> dict[str, Any]:
    """Every key (sorted); the value where the config fixes it, else <measured> (null stays)."""
    return {
        key: record[key] if key in keep or record[key] is None else MEASURED
        for key in sorted(record)
    }


def _failure(proc: subprocess.CompletedProcess[str], norm: Normaliser) -> dict[str, Any]:
    """On a non-zero exit: the output's end, so the diff says why."""
    if proc.returncode == 0:
        return {}
    return {
        "stderr_tail": norm.lines(proc.stderr)[-30:],
        "stdout_tail": norm.lines(proc.stdout)[-30:],
    }


def snapshot(scenario: Scenario | str, workdir: Path | str, served: bool = False) -> dict[str, Any]:
    """Run the scenario under `workdir` (which must be empty or absent) and return its contract.
    served: the CLI forked from the tests' warm server (the test) instead of new interpreters."""
    if isinstance(scenario, str):
        scenario = SCENARIOS[scenario]
    workdir = Path(workdir)
    plan_dir, run_dir = workdir / "plan", workdir / "run"
    norm = Normaliser([plan_dir, run_dir], scenario.ranks_per_node)
    overrides = list(scenario.overrides)

    plan = run_cli(["plan", *overrides], plan_dir, served)
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "plan": {
            "argv": ["launch", "plan", *overrides, "hydra.run.dir=<RUN>"],
            "exit_code": plan.returncode,
            "stdout": norm.lines(plan.stdout),
            "stderr": norm.lines(plan.stderr),
            "files": run_dir_files(plan_dir, norm),
            **contract_files(plan_dir, norm),
        },
    }
    if not scenario.train:
        return out

    train = run_cli(["train", *overrides], run_dir, served)
    stdout = norm.lines(train.stdout)
    # The plan `launch train` prints before it starts (the rest of its output is progress).
    head = next((i + 1 for i, line in enumerate(stdout) if line.startswith("run directory:")), 0)
    metrics_path, summary_path = run_dir / "metrics.jsonl", run_dir / "summary.json"
    metrics = (
        [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
        if metrics_path.is_file()
        else []
    )
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    out["train"] = {
        "argv": ["launch", "train", *overrides, "hydra.run.dir=<RUN>"],
        "exit_code": train.returncode,
        **_failure(train, norm),
        "stdout_plan": stdout[:head],
        "files": run_dir_files(run_dir, norm),
        **contract_files(run_dir, norm),
        "metrics.jsonl": [keep_values(m, METRIC_VALUES) for m in metrics],
        "summary.json": None
        if summary is None
        else norm.data(keep_values(summary, SUMMARY_VALUES)),
    }
    return out


def render(snap: dict[str, Any]) -> str:
    return json.dumps(snap, indent=2, ensure_ascii=False) + "\n"


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def unified_diff(expected: str, actual: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"golden {golden_path(name).relative_to(REPO)}",
            tofile=f"current code ({name})",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="(re)write the golden files")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=", ".join(SCENARIOS))
    args = parser.parse_args(argv)
    names = args.scenarios or list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    status = 0
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"contract-{name}-") as workdir:
            text = render(snapshot(name, workdir))
        path = golden_path(name)
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
            continue
        expected = render(json.loads(path.read_text())) if path.is_file() else ""
        diff = unified_diff(expected, text, name)
        print(f"{name}: {'differs' if diff else 'same'}")
        if diff:
            print(diff)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
