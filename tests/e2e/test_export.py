"""`launch export` (issue 22): a Hugging Face GPT-2 trained under FSDP2 and ZeRO-3 at dp=2 and
DDP (one rank), and a Llama under DDP (one rank), exported, load in a fresh process with
transformers' own AutoModelForCausalLM and AutoTokenizer and give the launcher's logits exactly;
a `_target_` model's export rebuilds with hydra's instantiate and a strict load; bf16 is bf16 on
disk; a second run started from an export begins at the exported model's loss; the output
directory is never clobbered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.data_sources import train_tokenizer, write_texts, write_tokens
from tests.helpers import REPO, read_losses, run_launch
from tests.installed import require

require("transformers")

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

FIXTURES = REPO / "tests" / "fixtures"
STEPS = ["train.steps=2", "wandb.mode=disabled", "batch.global_size=4"]
ENGINES = {
    "fsdp": ["engine=fsdp"],
    "zero3": ["engine=deepspeed", "engine.zero_stage=3"],
    "ddp": ["engine=ddp"],
}
MODELS = {"llama": "tiny_llama.json", "gpt2": "tiny_gpt2.json"}
# A dp=2 run of GPT-2 under each sharding engine (what an engine saves is read back by that
# engine's weight reader; GPT-2's tied embedding is the hard case for a sharded one), and the
# Llama on one rank (its names, untied head and grouped-query heads). Export reads an engine's
# checkpoint and maps a family's names in two separate steps: the Llama's names need no sharded
# run (DCP's files of several ranks are read back from the GPT-2 FSDP2 and ZeRO-3 runs;
# tests/e2e/test_harness.py exports an FSDP2 dp=2 Llama and scores it with lm-eval's `hf` model).
# DDP's checkpoint is the plain model's, replicated: one rank saves what two would, in the test
# process (issue 43: no rank start-ups).
RUNS = {
    f"{model}_{engine}": (
        MODELS[model],
        [f"parallel.dp={1 if engine == 'ddp' else 2}", *ENGINES[engine]],
    )
    for model, engine in [("llama", "ddp"), ("gpt2", "fsdp"), ("gpt2", "zero3"), ("gpt2", "ddp")]
}
TEXT = "the cat sat on a mat"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """{name: (run dir, export dir)} of the runs, each trained 2 steps and exported."""
    root = tmp_path_factory.mktemp("export")
    tok = train_tokenizer(root / "tok")
    texts = write_texts(root / "texts.jsonl", 200)
    data = ["data=hf", f"data.path={texts}", f"data.tokenizer={tok}", f"data.cache_dir={root}/c"]
    out = {}
    for name, (config, engine) in RUNS.items():
        model = ["model=hf", f"model.config={FIXTURES / config}", "model.seq_len=32"]
        run = root / name
        run_launch(["train", *model, *data, *STEPS, *engine], run)
        run_launch(["export", str(run)])
        out[name] = (run, run / "export")
    return out


@pytest.fixture(scope="module")
def fresh(exported: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What a fresh Python process with transformers alone reads from each export."""
    out = tmp_path_factory.mktemp("probe") / "probe.pt"
    dirs = [str(export) for _, export in exported.values()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-m", "tests.e2e.export_probe", str(out), TEXT, *dirs],
        cwd=REPO,
        env=env,
        check=True,
        timeout=300,
    )
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("name", list(RUNS))
def test_from_pretrained_gives_the_launchers_logits_exactly(
    name: str, exported: dict[str, tuple[Path, Path]], fresh: Any
) -> None:
    from launcher.data.tokenizer import load_tokenizer
    from launcher.serve.load import load_run

    run, export = exported[name]
    theirs = fresh["results"][str(export)]
    loaded = load_run(str(run), torch.device("cpu"))
    torch.set_num_threads(1)
    with torch.no_grad():
        ours = loaded.model(fresh["input"])
    assert theirs["dtype"] == "torch.float32"
    assert (theirs["logits"] - ours).abs().max().item() == 0.0
    tok = load_tokenizer(str(loaded.cfg.data.tokenizer), None)
    assert theirs["ids"] == tok.encode([TEXT])[0]
    files = {p.name for p in export.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= files
    from safetensors import safe_open

    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert meta["launcher.step"] == "2" and meta["launcher.run"] == str(run)


def test_bf16_export_is_bf16_on_disk_and_refuses_to_clobber(
    exported: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from safetensors import safe_open

    run, _ = exported["gpt2_ddp"]
    out = tmp_path / "bf16"
    run_launch(
        ["export", str(run / "checkpoints" / "step_2"), "--output", str(out), "export.dtype=bf16"]
    )
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    umask = os.umask(0)
    os.umask(umask)  # every file as the user's other files (safetensors alone writes 0600)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o666 & ~umask for p in out.iterdir()
    }

    again = run_launch(["export", str(run), "--output", str(out)], check=False)
    assert again.returncode == 2 and "export.overwrite=true" in again.stderr
    link = tmp_path / "link"
    link.symlink_to(out)
    for target in (link, Path("/dev/null")):
        refused = run_launch(
            ["export", str(run), "--output", str(target), "export.overwrite=true"], check=False
        )
        assert refused.returncode == 2, refused.stderr
    assert link.is_symlink() and Path("/dev/null").exists()
    run_launch(["export", str(run), "--output", str(out), "export.overwrite=true"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # noqa: SIM118


def _one_batch_text(path: Path) -> list[str]:
    """A text file of exactly one global batch (4 windows of 16 bytes): every step trains on the
    same samples, so a step's loss is the loss of the weights it starts from."""
    path.write_text(("the cat sat on a mat " * 4)[: 4 * 16 + 1])
    return [
        "data=text",
        f"data.path={path}",
        "model.seq_len=16",
        "batch.global_size=4",
        "wandb.mode=disabled",
    ]


@pytest.mark.parametrize("kind", ["builtin", "hf"])
def test_a_run_started_from_an_export_begins_at_its_loss(kind: str, tmp_path: Path) -> None:
    data = _one_batch_text(tmp_path / "text.txt")
    model = (
        ["model.n_layer=1", "model.d_model=32", "model.n_head=2"]
        if kind == "builtin"
        else ["model=hf", f"model.config={FIXTURES / 'tiny_gpt2.json'}"]
    )
    first = tmp_path / "first"
    at_end = ["export.at_end=true"] if kind == "builtin" else []
    run_launch(["train", *model, *data, "train.steps=3", "checkpoint.every=2", *at_end], first)
    if at_end:  # the final step's weights, in the run directory
        record = json.loads((first / "export" / "launcher_export.json").read_text())
        assert record["launcher.step"] == "3"
    export = tmp_path / "exported"
    run_launch(["export", str(first / "checkpoints" / "step_2"), "--output", str(export)])
    start = (
        ["model=hf", f"model.path={export}"]
        if kind == "hf"
        else [*model, f"model.init_from={export}"]
    )
    second = tmp_path / "second"
    run_launch(["train", *start, *data, "train.steps=1"], second)
    resumed_loss = read_losses(first)[2]  # step 3 starts from step 2's weights
    assert abs(read_losses(second)[0] - resumed_loss) <= 1e-6 * resumed_loss


def test_a_target_model_export_rebuilds_with_instantiate_and_a_strict_load(
    tmp_path: Path,
) -> None:
    """Trained on a token file, which has no tokenizer: export needs none."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from launcher.serve.load import load_model

    run = tmp_path / "run"
    model = [
        "model=custom",
        "model._target_=tests.fixtures.models.TinyLM",
        "+model.d_model=32",
        "+model.n_layer=2",
        "model.seq_len=16",
    ]
    tokens = write_tokens(tmp_path / "train.bin", 2000)
    run_launch(["train", *model, "data=tokens", f"data.path={tokens}", "train.steps=1"], run)
    run_launch(["export", str(run)])
    rebuilt = instantiate(OmegaConf.load(run / "export" / "model.yaml"))
    rebuilt.load_state_dict(load_file(str(run / "export" / "model.safetensors")), strict=True)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(
            rebuilt.eval()(ids),
            load_model(str(run), torch.device("cpu"))[1](ids),
            rtol=0,
            atol=0,
        )


def test_overwrite_never_replaces_the_run_being_exported(
    exported: dict[str, tuple[Path, Path]], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """export.overwrite=true replaces an earlier export, never the run it reads: not the run
    directory, nor a directory holding it, nor a part of it (all once deleted the run)."""
    import shutil

    from launcher.export.command import export_main

    run = tmp_path / "parent" / "run"
    shutil.copytree(exported["gpt2_ddp"][0], run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    capfd.readouterr()
    for output in (
        run,
        run.parent,
        run / "checkpoints",
        run / "checkpoints" / "step_2",
        run / ".hydra",
    ):
        code = export_main([str(run), "--output", str(output), "export.overwrite=true"])
        err = capfd.readouterr().err
        assert code == 2 and err.count("\n") == 1 and str(output) in err, (output, err)
        assert "Fix: " in err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    # The default, RUN/export (an earlier export), is refused without overwrite, replaced with it.
    assert export_main([str(run)]) == 2
    assert export_main([str(run), "export.overwrite=true"]) == 0
    assert (run / "export" / "model.safetensors").is_file()


def test_a_checkpoint_deleted_while_read_is_one_clear_error(
    exported: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """A run still training deletes its older checkpoints (checkpoint.keep) while an export
    reads one: one error saying so, not DCP's traceback."""
    import shutil

    from launcher.errors import ConfigError
    from launcher.export.command import _load_while_it_lasts
    from launcher.serve.load import find_checkpoint

    run = tmp_path / "run"
    shutil.copytree(exported["gpt2_ddp"][0], run)
    step = run / "checkpoints" / "step_2"
    _, chosen = find_checkpoint(str(step))
    shutil.rmtree(step)  # as the training's pruning would, between finding and reading
    with pytest.raises(ConfigError, match="was deleted while it was read") as caught:
        _load_while_it_lasts(str(step), chosen)
    assert "Fix: run the same launch export again" in str(caught.value)


def test_a_step_that_does_not_exist_names_the_steps_that_do(
    exported: dict[str, tuple[Path, Path]],
) -> None:
    from launcher.errors import ConfigError
    from launcher.serve.load import find_checkpoint

    run = exported["gpt2_ddp"][0]
    with pytest.raises(ConfigError) as caught:
        find_checkpoint(str(run / "checkpoints" / "step_99"))
    message = str(caught.value)
    assert "step_99 does not exist" in message and "checkpoints of" in message
    assert message.endswith(f"Fix: pass one of them, or the run directory {run} for its newest.")
    assert "are step_2." in message
    assert find_checkpoint(str(run))[1].step == 2  # the Fix as written
