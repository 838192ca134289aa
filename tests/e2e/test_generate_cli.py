"""`launch generate` end to end: a trained run's checkpoint, JSONL in, JSONL out in input order,
the totals on stderr, one error line (status 2) for each bad input, and a ZeRO-3 checkpoint of
two ranks loading into the same weights as a one-rank DCP checkpoint of the same run
(so a split of any engine and dp generates from the model it trained)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from tests.helpers import TRAINED, run_launch

pytestmark = pytest.mark.e2e

PROMPTS = [
    {"prompt": "abc|", "max_new_tokens": 6},
    {"prompt": "hello|", "id": 7},
    {"prompt": "q|", "max_new_tokens": 1},
    {"prompt": "xyzzy|", "stop": "z"},
    {"prompt": "ab|", "max_new_tokens": 3, "seed": 5},
]


@pytest.fixture(scope="module")
def run(trained_run: Path) -> Path:
    return trained_run


def _prompts(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_outputs_in_input_order_whatever_the_slots(run: Path, tmp_path: Path) -> None:
    prompts = _prompts(tmp_path / "p.jsonl", PROMPTS)
    out = tmp_path / "out" / "o.jsonl"
    out.parent.mkdir()
    proc = run_launch(["generate", str(run), str(prompts), "--output", str(out), "serve.slots=3"])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [{k: v for k, v in x.items() if k != "completion"} for x in lines] == PROMPTS
    assert all(isinstance(x["completion"], str) for x in lines)
    assert len(lines[2]["completion"]) <= 1 and "z" not in lines[3]["completion"]
    assert "tokens/s" in proc.stderr and "time to first token" in proc.stderr
    assert "generated 5/5" in proc.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.jsonl"]  # the temporary renamed
    # One slot (each request alone), from the checkpoint directory, to stdout: the same.
    step = sorted((run / "checkpoints").iterdir())[-1]
    alone = run_launch(["generate", str(step), str(prompts), "serve.slots=1"])
    assert [json.loads(x) for x in alone.stdout.splitlines()] == lines


def test_a_tiny_temperature_is_the_greedy_limit(run: Path, tmp_path: Path) -> None:
    """Issue 33: serve.temperature=1e-38 overflowed (logits / temperature = inf) and ended in a
    traceback; now it samples the greedy token (docs/serve.md)."""
    prompts = _prompts(tmp_path / "p.jsonl", PROMPTS[:2])
    greedy = run_launch(["generate", str(run), str(prompts)])
    for temperature in ("1e-38", "5e-324"):
        args = ["generate", str(run), str(prompts), f"serve.temperature={temperature}"]
        proc = run_launch(args, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == greedy.stdout, temperature


def test_bad_inputs_are_one_line_each(
    run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from launcher.serve.command import generate_main

    good = _prompts(tmp_path / "good.jsonl", PROMPTS[:1])
    proc = run_launch(["generate", str(tmp_path / "missing"), str(good)], check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "does not exist" in proc.stderr
    # The rest in-process (the same function `launch generate` calls), to spare start-ups.
    empty_run = tmp_path / "untrained"
    empty_run.mkdir()
    shutil.copy(run / "config.yaml", empty_run / "config.yaml")
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text('{"prompt": "a|"}\n\n{"prompt": "b|"\n')
    too_long = _prompts(tmp_path / "long.jsonl", [{"prompt": "a|"}, {"prompt": "x" * 200}])
    cases = [
        ([str(empty_run), str(good)], "no complete checkpoint"),
        ([str(run / "checkpoints"), str(good)], "neither a run directory"),
        ([str(run), str(malformed)], "line 3 is not valid JSON"),
        ([str(run), str(too_long)], "line 2: the prompt is 200 tokens"),
        ([str(run), str(good), "serve.slotz=2"], "did you mean serve.slots?"),
        ([str(run), str(good), "serve.top_p=2"], "serve.top_p"),
        ([str(run), str(good), "--outptu", "x"], "--outptu"),
        ([str(run)], "PROMPTS.jsonl"),
        ([str(run), str(good), "--output", str(tmp_path)], "is a directory"),
        ([str(run), str(good), "--output", "/proc/launcher/x.jsonl"], "does not exist"),
    ]
    capfd.readouterr()
    for args, words in cases:
        assert generate_main(args) == 2, args
        err = capfd.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (args, err)


def _weights_in_dcp(directory: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a DCP checkpoint as DCP's own converter reads them (not the launcher's
    reader under test)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():  # "no process group: loading in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp_to_torch_save(directory, tmp_path / "whole.pt")
    return torch.load(tmp_path / "whole.pt", weights_only=False)["model_optim"]["model"]


@pytest.mark.multiproc
def test_zero3_checkpoint_of_two_ranks_loads_as_one_model(run: Path, tmp_path: Path) -> None:
    from launcher.config.load import load_config_file
    from launcher.serve.load import load_run
    from launcher.worker.run import build_model

    ds_run = tmp_path / "ds"
    # One eval problem: ZeRO-3 gathers per module in the final eval (its problems are drawn apart
    # from the training data, so the weights are the same).
    zero3 = ["engine=deepspeed", "engine.zero_stage=3", "parallel.dp=2", "data.eval_problems=1"]
    run_launch([*TRAINED, *zero3], ds_run)
    ours = load_run(str(run), torch.device("cpu")).model.state_dict()
    theirs = load_run(str(ds_run), torch.device("cpu")).model.state_dict()
    step = sorted((run / "checkpoints").iterdir())[-1]
    trained = _weights_in_dcp(step / "engine", tmp_path)
    # The seeded weights the ranks started from: a loader that loads nothing gives these (or
    # another draw of them).
    initial = build_model(load_config_file(run / "config.yaml")).state_dict()
    assert ours.keys() == theirs.keys() == trained.keys() == initial.keys()
    for key, value in trained.items():
        assert (value - initial[key]).abs().max() > 1e-3, key  # 20 steps moved every tensor
        assert torch.equal(ours[key], value), key
        # The same training, whatever the engine and split.
        torch.testing.assert_close(theirs[key], value, rtol=1e-4, atol=1e-5, msg=key)
