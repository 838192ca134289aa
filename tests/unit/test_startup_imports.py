"""Start-up without timing it (issue 43): what a rank's import and the `launch` process load, and
how many times Hydra composes the config. Each check runs in a fresh interpreter, where
sys.modules holds exactly what the code imported (one interpreter may run several launches: a
module none of them imports is absent after all of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.hydra_record import sets_mode
from tests.helpers import run_launch

REPO = Path(__file__).resolve().parents[2]

# Imported only on the paths that use them: saving or loading a DCP checkpoint, FSDP, DeepSpeed,
# a Hugging Face model, wandb; torch's compiler only by torch itself (an optimizer's first
# param group) or the memory probe on a cache miss.
HEAVY = (
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
    "deepspeed",
    "transformers",
    "wandb",
    "torch._dynamo",
)

COUNTING_LAUNCH = """
import json, sys
from hydra._internal.hydra import Hydra
from hydra.core.global_hydra import GlobalHydra
composed = []
compose = Hydra.compose_config
def counting(self, *args, **kwargs):
    composed.append(kwargs.get("run_mode"))
    return compose(self, *args, **kwargs)
Hydra.compose_config = counting
from launcher.cli import main
found = {"codes": [], "composed": []}
for argv in json.loads(sys.argv[1]):  # each launch in turn, as `launch` would run it
    composed.clear()
    GlobalHydra.instance().clear()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    found["codes"].append(code)
    found["composed"].append(len(composed))
found["modules"] = sorted(sys.modules)
print("RESULT " + json.dumps(found))
"""


def _fresh(args: list[str], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_a_rank_imports_no_checkpoint_or_optional_library() -> None:
    code = (
        "import json, sys, launcher.worker.run; print('RESULT ' + json.dumps(sorted(sys.modules)))"
    )
    modules = _fresh(["-c", code])
    assert "torch" in modules and "launcher.checkpoint.checkpointer" in modules
    assert _loaded(modules, HEAVY) == []


def launches(*argvs: list[str]) -> list[str]:
    """COUNTING_LAUNCH's arguments: the launches to run in one interpreter."""
    return ["-c", COUNTING_LAUNCH, json.dumps([list(argv) for argv in argvs])]


def test_launch_composes_once_and_imports_what_the_plan_needs(tmp_path: Path) -> None:
    """`launch plan` of a DDP job and of a ZeRO-3 one (its ds_config.json written without
    DeepSpeed); each engine's plan goes through its own spec."""
    env = {"LAUNCHER_CACHE_DIR": str(tmp_path / "cache")}
    plans = {
        "ddp": ["parallel.dp=2"],
        "zero3": ["engine=deepspeed", "engine.zero_stage=3", "parallel.dp=2"],
    }
    # The activation probe's cache filled by a plan in this process: the plans below are a
    # user's launches after the first on this model (a miss imports the probe's machinery).
    for name, args in plans.items():
        run_launch(["plan", *args, "wandb.mode=disabled"], tmp_path / f"first_{name}", env=env)
    argvs = [
        ["plan", *args, "wandb.mode=disabled", f"hydra.run.dir={tmp_path / name}"]
        for name, args in plans.items()
    ]
    result = _fresh(launches(*argvs), env)
    assert result["codes"] == [0, 0]
    assert result["composed"] == [1, 1]  # Hydra's own reading of hydra.mode is not a second one
    assert (tmp_path / "zero3" / "ds_config.json").is_file()
    modules = result["modules"]
    assert "launcher.plan" in modules and "torch" in modules
    assert _loaded(modules, HEAVY) == []
    assert _loaded(modules, ("launcher.worker", "launcher.training.loop", "launcher.serve")) == []


def test_launch_composes_twice_when_a_config_may_set_the_mode(tmp_path: Path) -> None:
    """A user's config directory may set hydra.mode: Hydra reads it (a composition of its own)."""
    own = tmp_path / "conf"
    (own / "model").mkdir(parents=True)
    (own / "model" / "mine.yaml").write_text("defaults:\n  - tiny\n", encoding="utf-8")
    args = ["plan", "--config-dir", str(own), f"hydra.run.dir={tmp_path / 'run'}"]
    result = _fresh(launches([*args, "wandb.mode=disabled"]))
    assert result["codes"] == [0] and result["composed"] == [2]


def test_conf_never_sets_the_hydra_mode() -> None:
    """What lets `launch` compose once: nothing in conf/ sets hydra.mode."""
    files = sorted((REPO / "conf").rglob("*.yaml"))
    assert len(files) > 10
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        assert "mode" not in (data.get("hydra") or {}), path


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["hydra.mode=MULTIRUN"], True),
        (["+hydra.mode=RUN"], True),
        (["hydra/launcher=basic"], True),
        (["hydra={mode: MULTIRUN}"], True),
        (
            ["model=tiny", "hydra.run.dir=out", "hydra.job.chdir=false", "batch.grad_accum=1,2"],
            False,
        ),
    ],
)
def test_which_overrides_may_set_the_mode(overrides: list[str], expected: bool) -> None:
    assert sets_mode(overrides) is expected
