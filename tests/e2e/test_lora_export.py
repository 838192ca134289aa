"""An adapter run of a tiny Hugging Face Llama (`model=hf model.path=BASE adapter=lora`) out of
the launcher: `launch export` writes a peft adapter directory that `PeftModel.from_pretrained`
loads onto the base, and with export.merge=true a plain `from_pretrained` directory; both give
the launcher's own logits (the adapters unmerged, as trained) within 1e-5 in fp32, in a fresh
process that imports nothing of the launcher. `launch generate` runs the adapter run directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launcher.checkpoint.files import find_checkpoints
from launcher.checkpoint.weights import adapted_model
from launcher.config import load_config_file
from tests.helpers import read_metrics, run_launch

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRAIN = [
    "train",
    "model=hf",
    "model.seq_len=24",
    "adapter=lora",
    "adapter.rank=4",
    "adapter.targets=[q_proj,v_proj,down_proj]",
    "adapter.train_modules=[embed_tokens]",
    "train.steps=3",
    "batch.global_size=4",
    "optim.lr=0.01",
    "data.eval_problems=1",
    "wandb.mode=disabled",
]
FRESH = """
import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base_dir, adapter_dir, merged_dir, tokens_file, out = sys.argv[1:]
tokens = torch.load(tokens_file)
base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
with torch.no_grad():
    peft_logits = PeftModel.from_pretrained(base, adapter_dir).eval()(tokens).logits
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    merged_logits = merged(tokens).logits
torch.save({"peft": peft_logits, "merged": merged_logits, "modules": sorted(sys.modules)}, out)
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint on disk, as a user's base model would be."""
    import transformers

    fields = json.loads((FIXTURES / "tiny_llama.json").read_text())
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(1)
    directory = tmp_path_factory.mktemp("base") / "llama"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def run(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    run_launch([*TRAIN, f"model.path={base}"], run_dir)
    assert len(read_metrics(run_dir)) == 3
    return run_dir


def test_adapter_and_merged_exports_give_the_launchers_logits(
    base: Path, run: Path, tmp_path: Path
) -> None:
    adapter_dir, merged_dir = tmp_path / "adapter", tmp_path / "merged"
    run_launch(["export", str(run), "--output", str(adapter_dir)])
    run_launch(["export", str(run), "--output", str(merged_dir), "export.merge=true"])
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base)
    assert config["r"] == 4 and config["modules_to_save"] == ["model.embed_tokens"]
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert not list(adapter_dir.glob("model*.safetensors"))  # the adapters, not the model
    assert (merged_dir / "config.json").is_file() and not (
        merged_dir / "adapter_config.json"
    ).exists()

    cfg = load_config_file(run / "config.yaml")
    checkpoint = find_checkpoints(run, warn=False)[0]
    model = adapted_model(cfg, checkpoint).eval()  # as trained: the adapters unmerged
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        ours = model(tokens)
    base_logits = _base_logits(base, tokens)
    assert (ours - base_logits).abs().max() > 1e-3  # the adapters (and embeddings) trained
    torch.save(tokens, tmp_path / "tokens.pt")
    out = tmp_path / "logits.pt"
    args = [str(base), str(adapter_dir), str(merged_dir), str(tmp_path / "tokens.pt"), str(out)]
    subprocess.run([sys.executable, "-c", FRESH, *args], check=True, timeout=300)
    theirs = torch.load(out)
    assert not any(m == "launcher" or m.startswith("launcher.") for m in theirs["modules"])
    torch.testing.assert_close(theirs["peft"], ours, rtol=0, atol=1e-5)
    torch.testing.assert_close(theirs["merged"], ours, rtol=0, atol=1e-5)


def _base_logits(base: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(tokens).logits


def test_generate_runs_the_adapter_run_merged_in_memory(run: Path, tmp_path: Path) -> None:
    """`launch generate` on the run (merged in memory) continues greedily as the adapters
    unmerged do, decoded here token by token with the run's own codec."""
    from launcher.serve.codec import codec_for

    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompt, new = "abcab", 6
    prompts.write_text(json.dumps({"prompt": prompt, "max_new_tokens": new}) + "\n")
    run_launch(["generate", str(run), str(prompts), "--output", str(output)])
    # No `launch serve` of it too: serve loads a run by the same load_run as generate.
    answer = json.loads(output.read_text().splitlines()[0])

    cfg = load_config_file(run / "config.yaml")
    codec = codec_for(cfg.data)
    model = adapted_model(cfg, find_checkpoints(run, warn=False)[0]).eval()
    ids = codec.encode(prompt)
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    expected = codec.decode(ids[len(codec.encode(prompt)) :])
    assert answer["completion"] == expected[: len(answer["completion"])]
    assert answer["completion"]  # a stop token may end it sooner, never with nothing
