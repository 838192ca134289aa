"""train.sbatch rendering: golden files, each number once, validated or quoted values, no
secrets."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.config import to_root_config
from launcher.errors import ConfigError
from launcher.runners.slurm import render_sbatch, sbatch_argv
from tests.goldens import PYTHON, RUN_DIR, SBATCH_CASES, changed_message, sbatch_golden, sbatch_text


def slurm_config(**sections: Any) -> Any:
    base: dict[str, Any] = {"cluster": {"name": "slurm", "python": PYTHON}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return to_root_config(base)


@pytest.mark.parametrize("case", sorted(SBATCH_CASES))
def test_golden(case: str) -> None:
    """Only `python -m tests.goldens --write` rewrites the golden, after a reviewed change."""
    text, path = sbatch_text(case), sbatch_golden(case)
    assert text == path.read_text(encoding="utf-8"), changed_message(path, text)


@pytest.mark.parametrize("case", sorted(SBATCH_CASES))
def test_script_is_valid_bash(case: str) -> None:
    text = sbatch_text(case)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_every_number_once() -> None:
    cfg = slurm_config(
        train={"max_restarts": 8},
        parallel={"dp": 15, "nodes": 3},
        batch={"global_size": 30},
        cluster={
            "gpus_per_node": 6,
            "cpus_per_task": 7,
            "signal_seconds": 97,
            "max_requeues": 4,
            "port": 29517,
            "mem": "123G",
            "time": "11:22:33",
        },
    )
    text = render_sbatch(cfg, RUN_DIR)
    for number in ("3", "5", "6", "7", "97", "4", "29517", "123", "11", "22", "33", "75", "8"):
        assert len(re.findall(rf"(?<![\w.-]){number}(?![\d.])", text)) == 1, number


def test_job_shapes() -> None:
    text = render_sbatch(
        slurm_config(parallel={"dp": 8, "nodes": 2}, cluster={"gpus_per_node": 4}), RUN_DIR
    )
    assert "#SBATCH --nodes=2\n" in text
    assert "#SBATCH --ntasks-per-node=1\n" in text
    assert (
        "#SBATCH --no-kill" not in text and 'MIN_NODES="$SLURM_NNODES"\n' in text
    )  # a lost node ends it
    assert "#SBATCH --gpus-per-node=4\n" in text
    assert "RANKS_PER_NODE=4\n" in text
    assert '--nnodes="$NODES" --nproc_per_node="$RANKS_PER_NODE"' in text
    assert "--rdzv_backend=c10d" in text and '--rdzv_endpoint="$HEAD_NODE:$RDZV_PORT"' in text
    assert "#SBATCH --signal=B:USR1@120\n" in text and "#SBATCH --requeue\n" in text
    assert f"#SBATCH --output={RUN_DIR}/slurm-%j.out\n" in text
    assert (
        "& \n    STEP=$!" not in text and "&\n    STEP=$!" in text
    )  # the step runs in the background
    assert "trap 'stop_step USR1' USR1" in text and "trap 'stop_step TERM' TERM" in text


def test_no_requeue_and_no_signal() -> None:
    text = render_sbatch(slurm_config(cluster={"max_requeues": 0, "signal_seconds": 0}), RUN_DIR)
    assert "#SBATCH --no-requeue\n" in text and "#SBATCH --signal" not in text


def test_default_port_is_per_job() -> None:
    text = render_sbatch(slurm_config(), RUN_DIR)
    assert 'RDZV_PORT=$("$PYTHON" -m launcher.runners.ports "$SLURM_JOB_ID")' in text


def test_default_python_is_this_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    cfg = to_root_config({"cluster": {"name": "slurm"}})
    assert f"PYTHON={sys.executable}\n" in render_sbatch(cfg, RUN_DIR)


def test_body_values_are_quoted(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    evil = f"/opt/x $(touch {sentinel})/`touch {sentinel}`/python"
    text = render_sbatch(slurm_config(cluster={"python": evil}), RUN_DIR)
    line = next(ln for ln in text.splitlines() if ln.startswith("PYTHON="))
    # Run the assignment the script makes: the value comes back verbatim, nothing runs.
    out = subprocess.run(
        ["bash", "-c", f'{line}\nprintf %s "$PYTHON"'], capture_output=True, text=True, check=True
    )
    assert out.stdout == evil
    assert not sentinel.exists()


@pytest.mark.parametrize(
    ("cluster", "keys"),
    [
        ({"job_name": "x$(touch /tmp/pwned)"}, ["cluster.job_name"]),
        ({"job_name": "a b"}, ["cluster.job_name"]),
        ({"python": "python3 -u"}, ["cluster.python"]),  # a command with arguments
        ({"partition": "gpu;rm -rf"}, ["cluster.partition"]),
        ({"account": "a\nb"}, ["cluster.account"]),
        ({"constraint": "a100 #x"}, ["cluster.constraint"]),
        ({"mem": "64 GB"}, ["cluster.mem"]),
        ({"time": "soon"}, ["cluster.time"]),
        ({"time": "00:01:00", "signal_seconds": 60}, ["cluster.signal_seconds", "cluster.time"]),
        ({"signal_seconds": 70000, "time": "3-00:00:00"}, ["cluster.signal_seconds"]),
        ({"port": 80}, ["cluster.port"]),
        ({"extra_directives": ["--comment=$(touch /tmp/pwned)"]}, ["cluster.extra_directives[0]"]),
        ({"extra_directives": ["--exclusive", "--x\n/bin/true"]}, ["cluster.extra_directives[1]"]),
        ({"extra_directives": ["-N 4"]}, ["cluster.extra_directives[0]"]),
        ({"extra_directives": ["--nodes=4"]}, ["cluster.extra_directives[0]"]),
        ({"extra_directives": ["--output=/tmp/x"]}, ["cluster.extra_directives[0]"]),
        ({"setup": ["module load a\ntouch /tmp/pwned"]}, ["cluster.setup[0]"]),
        ({"gpus_per_node": -1}, ["cluster.gpus_per_node"]),
        ({"cpus_per_task": 0}, ["cluster.cpus_per_task"]),
    ],
)
def test_bad_values_name_the_key(cluster: dict[str, Any], keys: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        to_root_config({"cluster": {"name": "slurm", **cluster}})
    assert info.value.keys == keys


@pytest.mark.parametrize("key", ["job_name", "partition", "rdzv_id"])
def test_an_empty_name_is_said_to_be_empty(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        to_root_config({"cluster": {"name": "slurm", key: ""}})
    assert info.value.keys == [f"cluster.{key}"]
    assert "is empty" in str(info.value) and "characters" not in str(info.value).split("Fix")[0]


@pytest.mark.parametrize(
    ("sections", "run_dir", "keys"),
    [
        (
            {"parallel": {"dp": 8, "nodes": 2}, "cluster": {"gpus_per_node": 2}},
            RUN_DIR,
            ["parallel.dp", "parallel.nodes", "cluster.gpus_per_node"],
        ),
        ({"train": {"device": "cuda"}}, RUN_DIR, ["train.device", "cluster.gpus_per_node"]),
        ({}, Path("/scratch/my runs/a"), ["hydra.run.dir"]),
        ({}, Path("/scratch/100%/a"), ["hydra.run.dir"]),
    ],
)
def test_cross_checks(sections: dict[str, Any], run_dir: Path, keys: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        sbatch_argv(slurm_config(**sections), run_dir)
    assert info.value.keys == keys


def test_time_formats() -> None:
    from launcher.config.cluster import time_limit_seconds

    assert time_limit_seconds("30") == 1800
    assert time_limit_seconds("30:15") == 1815
    assert time_limit_seconds("02:00:00") == 7200
    assert time_limit_seconds("1-0") == 86400
    assert time_limit_seconds("1-02:30") == 95400
    assert time_limit_seconds("1-00:00:01") == 86401


def test_environment_secret_is_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = "wandb-sentinel-0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", sentinel)
    text = render_sbatch(slurm_config(cluster={"setup": ["module load cuda"]}), RUN_DIR)
    assert sentinel not in text
    assert "WANDB" not in text  # the environment is not copied; sbatch propagates it


def test_secret_in_setup_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cfg = slurm_config(
        cluster={"setup": ["module load cuda", "export HF_TOKEN=hf_0123456789abcdef"]}
    )
    with pytest.raises(ConfigError) as info:
        render_sbatch(cfg, RUN_DIR)
    assert info.value.keys == ["cluster.setup[1]"]


def test_sbatch_argv() -> None:
    assert sbatch_argv(slurm_config(), RUN_DIR) == [
        "sbatch",
        "--parsable",
        f"{RUN_DIR}/train.sbatch",
    ]
    assert sbatch_argv(slurm_config(cluster={"wait": True}), RUN_DIR)[:3] == [
        "sbatch",
        "--parsable",
        "--wait",
    ]


def test_an_elastic_job_asks_for_a_node_count_range_and_is_requeued() -> None:
    cfg = slurm_config(
        parallel={"dp": 4, "nodes": 2, "min_nodes": 1},
        batch={"global_size": 8, "micro_size": 2},
        train={"max_restarts": 1},
        cluster={"max_requeues": 3},
    )
    text = render_sbatch(cfg, RUN_DIR)
    assert "#SBATCH --nodes=1-2\n" in text and "#SBATCH --requeue\n" in text
    # Both nodes when both are free (a range alone starts on one), both tasks on one when not.
    assert "#SBATCH --ntasks=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --spread-job\n" in text
    assert 'srun --kill-on-bad-exit=1 --nodes="$NODES" --ntasks="$NODES"' in text
    assert "NODES=$SLURM_NNODES\n" in text  # the allocation's nodes, whatever SLURM gave
    assert "#SBATCH --no-kill\n" in text and "MIN_NODES=1\n" in text  # a lost node: go on
    # SLURM pins a started job to the nodes it got: a requeue asks for the range again.
    assert 'scontrol update JobId="$SLURM_JOB_ID" NumNodes=1-2 NumTasks=2' in text
    assert '--max_restarts="$(( TORCHRUN_RESTARTS - RELAUNCHES ))"' in text  # one budget


def test_an_elastic_job_asks_for_cpus_per_node() -> None:
    """N tasks of C CPUs would not fit MIN nodes (a node holds several of them): C per node."""
    cfg = slurm_config(
        parallel={"dp": 2, "nodes": 2, "min_nodes": 1},
        train={"max_restarts": 1},
        cluster={"cpus_per_task": 2},
    )
    text = render_sbatch(cfg, RUN_DIR)
    assert "#SBATCH --mincpus=2\n" in text and "--cpus-per-task=2" not in text
    assert "STEP_CPUS=$(tr , " in text and "${STEP_CPUS:+--cpus-per-task=$STEP_CPUS}" in text
