"""Every "Fix:" works as written (issue 22): for a sample of errors, each fix the message prints
that is an override (`key=value`, `+key=value`, or `key in {a, b}`), applied to the refused
command line, makes `launch plan` accept it. Placeholders (FILE, DIR, N) are not commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import REPO, run_launch

pytestmark = pytest.mark.e2e

OVERRIDE = re.compile(r"(?<![\w.+])(\+{0,2}[a-z_]+(?:\.[a-z_]+)+=[^\s,;()]+)")
CHOICES = re.compile(r"(\+?[a-z_]+(?:\.[a-z_]+)+) in \{([^}]*)\}")


def fixes(message: str) -> list[str]:
    """The overrides a message's Fix: offers, without placeholders."""
    text = message.split("Fix:", 1)[1]
    found = [m.rstrip(".") for m in OVERRIDE.findall(text)]
    for key, values in CHOICES.findall(text):
        found += [f"{key}={v.strip()}" for v in values.split(",")]
    return [f for f in found if not re.search(r"=[A-Z]+$", f)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fixes")
    big = root / "big.bin"
    np.array([1, 2, 300] * 40, dtype=np.uint16).tofile(big)  # a token id past 256
    return {"big": big, "example": REPO / "examples" / "own_project" / "data"}


def _cases(d: dict[str, Path]) -> dict[str, list[str]]:
    tokens = ["data=tokens", f"data.path={d['big']}"]
    tiny = ["model.seq_len=16"]
    example = d.get("example", Path())
    hf = ["data=hf", f"data.path={example}/corpus.jsonl", f"data.tokenizer={example}/tokenizer"]
    return {
        "builtin_tokens": [*tokens, *tiny],
        "hf_config_tokens": [
            *tokens,
            "model=hf",
            f"model.config={REPO}/tests/fixtures/tiny_llama.json",
            *tiny,
        ],
        "target_tokens": [
            *tokens,
            "model=custom",
            "model._target_=tests.fixtures.models.TinyLM",
            *tiny,
        ],
        # A tokenizer of 512 tokens and a vocabulary set too small on purpose (unset, it
        # follows the tokenizer): the fix's key differs by model, each works as printed.
        "builtin_hf": [*hf, "model.vocab_size=300", *tiny],
        "hf_config_hf": [
            *hf,
            "model=hf",
            f"model.config={REPO}/tests/fixtures/tiny_llama.json",
            "+model.vocab_size=300",
            *tiny,
        ],
        "batch_split": ["parallel.dp=3", "batch.global_size=4"],
        "elastic_verify_first": [
            "cluster=slurm",
            "parallel.nodes=2",
            "parallel.min_nodes=1",
            "parallel.dp=2",
            "train.max_restarts=1",
            "verify.first=true",
        ],
        "elastic_without_restarts": [
            "cluster=slurm",
            "parallel.nodes=2",
            "parallel.min_nodes=1",
            "parallel.dp=2",
            "train.max_restarts=0",
        ],
        "eval_without_heldout": [*tokens, "model.vocab_size=301", "eval.every=5", *tiny],
    }


CASES = list(_cases({"big": Path()}))


@pytest.mark.parametrize("case", CASES)
def test_each_printed_fix_makes_the_command_pass(
    case: str, data: dict[str, Path], tmp_path: Path
) -> None:
    args = [*_cases(data)[case], f"data.cache_dir={tmp_path}/cache"]
    refused = run_launch(["plan", *args], tmp_path / "refused", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = next(line for line in refused.stderr.splitlines() if "Fix:" in line)
    offered = fixes(message)
    assert offered, message
    for i, fix in enumerate(offered):
        key = fix.lstrip("+").split("=", 1)[0]
        kept = [a for a in args if a.lstrip("+").split("=", 1)[0] != key]
        run_launch(["plan", *kept, fix], tmp_path / f"fixed_{i}")  # raises with the output


# Fixes whose overrides go together (issue 33): each alternative of the Fix (split on "; " and
# ", or ") is one group of overrides, applied together to the refused command line.
GROUP_OVERRIDE = re.compile(r"(?<![\w.+])(\+?[a-z_]+(?:\.[a-z_]+)*=[^\s,;()]+)")
BUDGET = "train.memory_budget"


def groups(message: str) -> list[list[str]]:
    """The Fix's alternatives, each the overrides it names (without placeholders or figures)."""
    text = message.split("Fix:", 1)[1]
    found = []
    for part in re.split(r"; |, or ", text):
        if "still over" in part:
            continue  # offered for its figure, not as a fix
        overrides = [m.rstrip(".") for m in GROUP_OVERRIDE.findall(part)]
        overrides = [o for o in overrides if not re.search(r"=[A-Z]+$", o)]
        if overrides:
            found.append(overrides)
    return found


def applied(args: list[str], overrides: list[str]) -> list[str]:
    keys = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    return [*(a for a in args if a.lstrip("+").split("=", 1)[0] not in keys), *overrides]


def refusal(args: list[str], run_dir: Path) -> str:
    refused = run_launch(["plan", *args], run_dir, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    return next(line for line in refused.stderr.splitlines() if "Fix:" in line)


# The command on the tiny model: auto split, FSDP on a SLURM job's GPUs (so offload is
# among the choices), a budget nothing fits in.
AUTO_FSDP = [
    "batch.global_size=16",
    "parallel.dp=2",
    "engine=fsdp",
    "cluster=slurm",
    "cluster.gpus_per_node=2",
    "batch.micro_size=auto",
    "ac=auto",
    "train.memory_budget=1MiB",
]
SMALLER_SPLIT = [*AUTO_FSDP[:5], "batch.grad_accum=2", "ac=none", "train.memory_budget=5MiB"]


@pytest.mark.parametrize(
    ("args", "kind"), [(AUTO_FSDP, "no split fits"), (SMALLER_SPLIT, "change")]
)
def test_the_budget_refusal_offers_budgets_and_splits_that_are_accepted(
    args: list[str], kind: str, tmp_path: Path
) -> None:
    message = refusal(args, tmp_path / "refused")
    assert ("No split fits" in message) == (kind == "no split fits"), message
    offered = groups(message)
    assert offered, message
    for i, overrides in enumerate(offered):
        run_launch(["plan", *applied(args, overrides)], tmp_path / f"fixed_{i}")
    if kind == "no split fits":
        # The budget printed holds the automatic choice's margin: pasted alone, auto fits in it.
        budget = next(o for o in offered[0] if o.startswith(BUDGET))
        run_launch(["plan", *applied(args, [budget])], tmp_path / "budget_alone")
        # ... and it is the smallest such figure the message's precision can say.
        value = float(re.sub(r"[A-Za-z]+$", "", budget.split("=")[1]))
        less = budget.replace(budget.split("=")[1], f"{value - 0.1:.1f}MiB")
        assert (
            run_launch(["plan", *applied(args, [less])], tmp_path / "less", check=False).returncode
            == 2
        )


def test_the_gpu_count_refusal_offers_what_runs(tmp_path: Path) -> None:
    n = max(2, torch.cuda.device_count() + 1)  # more ranks than this machine has GPUs
    args = ["engine=fsdp", f"parallel.dp={n}", f"batch.global_size={2 * n}", "train.device=cuda"]
    message = refusal(args, tmp_path / "refused")
    assert "parallel.dp<=" not in message
    offered = groups(message)
    assert ["train.device=cpu"] in offered, message
    assert ["cluster=slurm", f"cluster.gpus_per_node={n}"] in offered, message
    for i, overrides in enumerate(offered):
        run_launch(["plan", *applied(args, overrides)], tmp_path / f"fixed_{i}")


ADVICE = re.compile(r"Largest part: (\w+) [\d.,]+ [MG]iB \((?:shrink it with ([^;]*)|[^;]*)\);")
ENGINE_CASES = {
    "ddp": ["engine=ddp", "parallel.dp=2"],
    # One rank: the optimizer state is the largest part (the case: "engine=fsdp" was
    # advised to an fsdp run).
    "fsdp": ["engine=fsdp", "parallel.dp=1"],
    "zero0": ["engine=deepspeed", "engine.zero_stage=0", "parallel.dp=2"],
    "zero1": ["engine=deepspeed", "engine.zero_stage=1", "parallel.dp=2"],
}


@pytest.mark.parametrize("engine", list(ENGINE_CASES))
def test_the_budget_refusal_advises_only_other_configs_that_shrink_the_part(
    engine: str, tmp_path: Path
) -> None:
    """The "shrink it with" advice names the engine's leaner and offload variants and a larger
    dp, only those that differ from the run and were planned to shrink the part: each, planned,
    holds less of it."""
    args = [*ENGINE_CASES[engine], "batch.global_size=8", "batch.micro_size=1", "ac=full"]
    match = ADVICE.search(refusal([*args, "train.memory_budget=1MiB"], tmp_path / "refused"))
    assert match, engine
    part, advice = match.group(1), match.group(2) or ""
    roomy = [*args, "train.memory_budget=100GiB"]
    run_launch(["plan", *roomy], tmp_path / "as_is")
    held = json.loads((tmp_path / "as_is" / "plan.json").read_text())["memory_plan"]["parts"]
    named = [a for a in advice.split(" or ") if "=" in a]
    for current in ENGINE_CASES[engine]:  # the run's own engine is never advised
        assert current not in advice, advice
    if "a larger parallel.dp" in advice.split(" or "):
        dp = int(next(a for a in args if a.startswith("parallel.dp=")).split("=")[1])
        named.append(f"parallel.dp={2 * dp}")
    for i, keys in enumerate(named):
        run_launch(["plan", *applied(roomy, keys.split())], tmp_path / f"v{i}")
        parts = json.loads((tmp_path / f"v{i}" / "plan.json").read_text())["memory_plan"]["parts"]
        assert parts[part] < held[part], (keys, part)
    if engine != "zero1":  # its largest part is DeepSpeed's bucket, advised in words
        assert named, advice
