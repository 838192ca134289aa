"""eval.harness.* (issue 36): each bad value is one ConfigError naming the key with a Fix;
`launch eval`'s overrides parse as Hydra's command line does; lm-eval's results flatten to the
harness/<task>/<metric> numbers of metrics.jsonl; which checkpoints training evaluates."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launcher.config.eval import HarnessConfig
from launcher.errors import ConfigError
from launcher.harness.command import apply_harness_overrides
from launcher.harness.dispatch import evaluates
from launcher.harness.record import flat_scores
from tests.goldens import compose_config


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"every": 2}, "eval.harness.tasks"),
        ({"tasks": ["a b"]}, "eval.harness.tasks[0]"),
        ({"tasks": ["a", "a"]}, "eval.harness.tasks"),
        ({"tasks": ["a"], "every": -1}, "eval.harness.every"),
        ({"limit": 0}, "eval.harness.limit"),
        ({"batch_size": 0}, "eval.harness.batch_size"),
        ({"time": "soon"}, "eval.harness.time"),
    ],
)
def test_bad_values_name_their_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        HarnessConfig(**kwargs)  # type: ignore[arg-type]
    assert key in info.value.keys and info.value.fix


def test_overrides_parse_lists_and_refuse_unknown_keys() -> None:
    harness, device = apply_harness_overrides(
        HarnessConfig(), {"eval.harness.tasks": "[a,b]", "eval.harness.limit": "3"}
    )
    assert harness.tasks == ["a", "b"] and harness.limit == 3 and device == "auto"
    with pytest.raises(ConfigError, match=r"did you mean eval\.harness\.tasks"):
        apply_harness_overrides(HarnessConfig(), {"eval.harness.task": "[a]"})


def test_evaluation_during_training_needs_checkpoints() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.enabled"):
        compose_config(
            ["eval.harness.every=2", "eval.harness.tasks=[a]", "checkpoint.enabled=false"]
        )


def test_multiples_and_the_last_step_are_evaluated() -> None:
    cfg = compose_config(["eval.harness.every=4", "eval.harness.tasks=[a]", "train.steps=10"])
    assert [s for s in range(1, 11) if evaluates(cfg, s)] == [4, 8, 10]


def test_scores_flatten_to_numbers() -> None:
    results = {
        "t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": "N/A", "em,strict": 1.0},
    }
    assert flat_scores(results) == {"harness/t/acc": 0.5, "harness/t/em/strict": 1.0}


def test_the_eval_job_script_is_quoted_and_refuses_a_credential(tmp_path: Path) -> None:
    from launcher.harness.slurm_job import render_eval_sbatch

    base = ["cluster=slurm", "cluster.partition=gpu-a", "eval.harness.tasks=[a]"]
    argv = [str(tmp_path / "run dir/checkpoints/step_2"), "eval.harness.tasks=[a]"]
    script = render_eval_sbatch(compose_config(base), tmp_path, 2, argv)
    assert "#SBATCH --partition=gpu-a\n" in script  # the cluster's placement, as training's
    command = next(line for line in script.splitlines() if line.startswith("exec "))
    assert shlex.split(command)[-2:] == argv  # every value quoted for the shell
    typed = compose_config([*base, "cluster.setup=['export HF_TOKEN=hf_0123456789abcdef']"])
    with pytest.raises(ConfigError) as info:
        render_eval_sbatch(typed, tmp_path, 2, argv)
    assert info.value.keys == ["cluster.setup[0]"]
    assert "eval/step_2.sbatch" in str(info.value)
