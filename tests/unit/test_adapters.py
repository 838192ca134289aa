"""adapter=lora on one rank in this process (the built-in GPT; a tiny HF Llama too for the frozen
base): the targets resolved (one error naming the key and listing the layers there are), the
base frozen bitwise, gradients and optimizer state for the adapters only, the checkpoint holding
only what trains, merging equal to the adapters unmerged, and a checkpoint refused on another
base."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from launcher.adapters.apply import apply_adapter, is_adapter_name, merge_adapters
from launcher.adapters.export import tied_trained
from launcher.adapters.targets import resolve
from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.preflight import check_resume
from launcher.config import to_root_config
from launcher.config.ac import AcPolicy
from launcher.config.adapter import AdapterConfig, AdapterKind
from launcher.config.root import RootConfig
from launcher.distributed import DistContext, init_distributed, teardown_distributed
from launcher.errors import ConfigError
from launcher.models.adapted import base_identity
from launcher.models.gpt import GPT
from launcher.worker.run import build_model
from tests.harness import build_trainer, make_config, record_gradients, record_losses
from tests.helpers import max_rel_diff

LORA = {"name": "lora", "rank": 4, "alpha": 8.0, "targets": ["attn.qkv", "mlp.fc"]}


def lora(**changes: object) -> AdapterConfig:
    values: dict[str, object] = {**LORA, "name": AdapterKind.lora, **changes}
    return AdapterConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
def ctx() -> Iterator[DistContext]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    context = init_distributed("cpu")  # a one-rank gloo group in this process
    try:
        yield context
    finally:
        teardown_distributed()
        torch.set_num_threads(threads)


def gpt() -> GPT:
    return GPT(make_config().model)  # type: ignore[arg-type]


def test_targets_resolve_by_suffix_regex_and_all_linear() -> None:
    model = gpt()
    assert resolve(model, lora()).targets == [
        "blocks.0.attn.qkv",
        "blocks.0.mlp.fc",
        "blocks.1.attn.qkv",
        "blocks.1.mlp.fc",
    ]
    assert resolve(model, lora(targets=[r"blocks\.1\..*proj"])).targets == [
        "blocks.1.attn.proj",
        "blocks.1.mlp.proj",
    ]
    every = resolve(model, lora(targets=["all-linear"])).targets
    assert len(every) == 8 and "head" not in every  # the output head is left out, as peft does


def test_a_target_that_matches_nothing_is_one_error_listing_the_layers() -> None:
    with pytest.raises(ConfigError) as error:
        resolve(gpt(), lora(targets=["attn.qkv", "q_proj"]))
    text = str(error.value)
    assert text.startswith("adapter.targets: 'q_proj' matches no layer")
    assert "blocks.*.attn.qkv, blocks.*.attn.proj, blocks.*.mlp.fc" in text
    assert (
        "Fix: name layers by their last parts (e.g. adapter.targets=[attn.qkv,attn.proj])" in text
    )


def test_a_rank_larger_than_a_layer_is_one_error_naming_the_smallest() -> None:
    with pytest.raises(ConfigError) as error:
        resolve(gpt(), lora(rank=40))  # d_model 32: qkv is 32 x 96
    text = str(error.value)
    assert text.startswith("adapter.rank: rank 40 is larger than layer blocks.0.attn.qkv's")
    assert "set adapter.rank to at most 32" in text


def test_train_modules_must_match_and_not_overlap_the_targets() -> None:
    with pytest.raises(ConfigError, match=r"^adapter.train_modules: 'embed_tokens' matches no"):
        resolve(gpt(), lora(train_modules=["embed_tokens"]))
    with pytest.raises(ConfigError, match="both adapted and trained in full"):
        resolve(gpt(), lora(train_modules=["blocks.0.attn"]))
    assert resolve(gpt(), lora(train_modules=["pos_emb"])).train_modules == ["pos_emb"]
    with pytest.raises(ConfigError, match="both adapted and trained in full"):  # head is tok_emb
        resolve(gpt(), lora(targets=["head"], train_modules=["tok_emb"]))
    with pytest.raises(ConfigError, match="nor is it a valid regular expression"):
        resolve(gpt(), lora(targets=[r"blocks\.("]))


def test_a_tied_embedding_in_train_modules_trains() -> None:
    # The GPT's tok_emb.weight is also head.weight: its second name must not freeze it again.
    model = gpt()
    apply_adapter(model, lora(train_modules=["tok_emb"]))
    assert model.head.weight is model.tok_emb.weight
    assert model.tok_emb.weight.requires_grad
    assert not model.pos_emb.weight.requires_grad
    # ... and a peft adapter directory would untie it: launch export refuses without merge.
    assert tied_trained(model) == ["tok_emb"]
    untied = gpt()
    apply_adapter(untied, lora(train_modules=["pos_emb"]))
    assert tied_trained(untied) == []


def test_config_checks_its_own_fields() -> None:
    with pytest.raises(ConfigError, match=r"^adapter\.rank"):
        lora(rank=0)
    with pytest.raises(ConfigError, match=r"^adapter\.dropout.*Fix: adapter\.dropout=0\.0"):
        lora(dropout=1.0)
    with pytest.raises(ConfigError, match=r"^adapter\.targets"):
        lora(targets=[])


def test_merged_model_gives_the_adapted_logits() -> None:
    torch.manual_seed(0)
    model = gpt()
    apply_adapter(model, lora(train_modules=["pos_emb"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # B starts at zero: make the adapters do something
    tokens = torch.randint(0, 256, (2, 16))
    adapted = model(tokens)
    merged = merge_adapters(model)
    assert not any(is_adapter_name(n) for n, _ in merged.named_parameters())
    assert set(merged.state_dict()) == set(gpt().state_dict())  # the plain model's own names
    torch.testing.assert_close(merged(tokens), adapted, rtol=0, atol=1e-5)


LLAMA = {
    "_target_": "launcher.models.hf.build_hf",
    "name": "hf",
    "seq_len": 24,
    "config": str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_llama.json"),
}
FULL_MODULE = {"gpt": "pos_emb", "llama": "model.embed_tokens"}
"""Per model: a module trained in full beside the adapters."""


def adapted_config(kind: str, engine: str) -> RootConfig:
    """adapter=lora with one module trained in full, on the built-in GPT or a tiny HF Llama."""
    adapter = {**LORA, "train_modules": [FULL_MODULE[kind]]}
    if kind == "gpt":
        return make_config(adapter=adapter, engine={"name": engine}, checkpoint={"every": 0})
    pytest.importorskip("transformers")
    adapter["targets"] = ["q_proj", "v_proj", "down_proj"]
    return to_root_config(
        {
            "model": LLAMA,
            "train": {"steps": 4},
            "adapter": adapter,
            "engine": {"name": engine},
            "checkpoint": {"every": 0},
            "wandb": {"mode": "disabled"},
        }
    )


# Llama under DDP left out: the Llama's names under FSDP2, and DDP with the GPT.
@pytest.mark.parametrize(
    ("engine", "kind"),
    [("ddp", "gpt"), ("fsdp", "gpt"), ("fsdp", "llama")],
    ids=["ddp-gpt", "fsdp-gpt", "fsdp-llama"],
)
def test_base_stays_bitwise_and_only_adapters_get_grads_and_state(
    engine: str, kind: str, ctx: DistContext, tmp_path: Path
) -> None:
    cfg = adapted_config(kind, engine)
    full_weight = f"{FULL_MODULE[kind]}.weight"
    base = {n: p.detach().clone() for n, p in build_model(cfg).named_parameters()}
    trainer = build_trainer(cfg, ctx, tmp_path)
    module = trainer.engine.module
    grads: dict[str, bool] = {}
    hooks = [
        p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, True))
        for n, p in module.named_parameters()
        if p.requires_grad
    ]
    trainer.train()
    for hook in hooks:
        hook.remove()
    params = dict(module.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert full_weight in trainable
    assert all(is_adapter_name(n) for n in trainable - {full_weight})
    assert set(grads) == trainable  # every adapter got a gradient, nothing else could
    assert all(params[n].grad is None for n in params if n not in trainable)
    state = trainer.engine.optimizer.state
    assert {id(p) for p in state} == {id(params[n]) for n in trainable}
    for name, value in base.items():
        if name not in trainable:
            assert torch.equal(_full(params[name]), value), name  # frozen: bitwise unchanged
    lora_b = [n for n in trainable if "lora_B" in n]
    assert any(not torch.equal(_full(params[n]), base[n]) for n in lora_b)  # the adapters trained


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)
    return (full() if callable(full) else tensor).detach()


def test_checkpoint_holds_the_adapters_and_refuses_another_base(
    ctx: DistContext, tmp_path: Path
) -> None:
    cfg = make_config(adapter=LORA, checkpoint={"every": 0})
    trainer = build_trainer(cfg, ctx, tmp_path)
    checkpoints = Checkpointer(cfg, tmp_path, ctx, trainer)
    checkpoints.base = base_identity(cfg, trainer.engine.module)
    trainer.train()
    saved = checkpoints.save_final()
    assert saved is not None
    from launcher.engines.dcp import SafeReader, read_model_weights

    MODEL = "model_optim.model."

    fresh = build_model(cfg)
    weights = read_model_weights(saved / "engine", fresh)
    assert weights and all(is_adapter_name(n) for n in weights)
    saved_names = SafeReader(str(saved / "engine")).read_metadata().state_dict_metadata
    model_keys = [k.removeprefix(MODEL) for k in saved_names if k.startswith(MODEL)]
    assert sorted(model_keys) == sorted(weights)  # no frozen base weight in the checkpoint
    # The same config resumes; a base with other weights is refused, naming what differs.
    again = build_trainer(cfg, ctx, tmp_path)
    resumer = Checkpointer(cfg, tmp_path, ctx, again)
    resumer.base = checkpoints.base
    resumed = resumer.resume()
    assert resumed is not None and resumed.step == cfg.train.steps
    other = Checkpointer(cfg, tmp_path, ctx, build_trainer(cfg, ctx, tmp_path))
    assert checkpoints.base is not None
    other.base = {**checkpoints.base, "sha256": "0" * 64}
    with pytest.raises(ConfigError) as refused:
        other.resume()
    text = str(refused.value)
    assert (
        text.startswith("train.seed: checkpoint") and "holds adapters trained on the base" in text
    )


def test_a_target_model_gets_adapters_by_its_own_names(ctx: DistContext, tmp_path: Path) -> None:
    """model=custom model._target_=...: peft wraps any nn.Module by module names."""
    cfg = make_config(
        model={
            "_target_": "tests.fixtures.models.TinyLM",
            "seq_len": 24,
            "n_layer": 2,
        },
        adapter={**LORA, "targets": ["all-linear"]},
        checkpoint={"every": 0},
    )
    trainer = build_trainer(cfg, ctx, tmp_path)
    trainer.train()
    trainable = {n for n, p in trainer.engine.module.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter_name(n) for n in trainable)
    assert not any(n.startswith("head.") for n in trainable)  # all-linear leaves out the head


def _export(directory: Path, seed: int) -> str:
    """A base's weights as `launch export` writes them (model.safetensors by the model's names)."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    state = {n: t.clone() for n, t in gpt().state_dict().items()}
    directory.mkdir()
    save_file(state, str(directory / "model.safetensors"))
    return str(directory)


def test_another_init_from_base_is_refused_by_name(ctx: DistContext, tmp_path: Path) -> None:
    first, other = _export(tmp_path / "a", 1), _export(tmp_path / "b", 2)
    run_dir = tmp_path / "run"
    cfg = make_config(model={"init_from": first}, adapter=LORA, checkpoint={"every": 0})
    trainer = build_trainer(cfg, ctx, run_dir)
    checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
    checkpoints.base = base_identity(cfg, trainer.engine.module)
    assert checkpoints.base is not None and checkpoints.base["source"] == first
    trainer.train()
    checkpoints.save_final()
    moved = make_config(model={"init_from": other}, adapter=LORA, checkpoint={"every": 0})
    with pytest.raises(ConfigError, match=r"^model\.init_from: checkpoint .* holds adapters"):
        check_resume(moved, run_dir)  # `launch`, before any rank starts
    check_resume(cfg, run_dir)  # the same base resumes
    again = build_trainer(moved, ctx, run_dir)
    resumer = Checkpointer(moved, run_dir, ctx, again)
    resumer.base = base_identity(moved, again.engine.module)
    with pytest.raises(ConfigError) as refused:
        resumer.resume()
    text = str(refused.value)
    assert text.startswith(f"model.init_from: checkpoint {run_dir}/checkpoints/step_4 holds")
    assert f"trained on the base {first}" in text and f"this run's base is {other}" in text
    assert f"Fix: resume with the base the checkpoint was trained on (model.init_from={first}" in (
        text
    )


def test_the_base_digest_does_not_depend_on_recompute() -> None:
    """A resumed run may change ac: recompute is not part of the base's identity."""
    plain = make_config(adapter=LORA)
    wrapped = make_config(adapter=LORA, ac={"policy": "full"})
    first, second = (
        base_identity(plain, build_model(plain)),
        base_identity(wrapped, build_model(wrapped)),
    )
    assert first is not None and second is not None and first["sha256"] == second["sha256"]


def test_a_frozen_duplicate_in_a_checkpoint_is_not_unexpected() -> None:
    """DeepSpeed's exclude_frozen_parameters keeps a tied frozen weight under its second name
    (GPT's head.weight); reading the adapters back must not refuse it."""
    from launcher.checkpoint.weights import load_strict

    model = gpt()
    apply_adapter(model, lora())
    state = {n: t.clone() for n, t in model.state_dict().items() if is_adapter_name(n)}
    state["head.weight"] = model.state_dict()["head.weight"].clone()
    load_strict(model, state)
    del state["blocks.0.attn.qkv.lora_A.default.weight"]
    with pytest.raises(KeyError, match="missing"):
        load_strict(model, state)


def test_an_adapter_run_loads_its_relative_base_from_any_directory(
    ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # model.init_from as typed (relative to where `launch train` ran): `launch export`,
    # `generate` and `serve` of the run use the base the checkpoint recorded, from anywhere.
    from launcher.checkpoint.files import find_checkpoints
    from launcher.checkpoint.weights import adapted_model

    monkeypatch.chdir(tmp_path)
    _export(tmp_path / "a", 1)
    run_dir = tmp_path / "run"
    cfg = make_config(model={"init_from": "a"}, adapter=LORA, checkpoint={"every": 0})
    trainer = build_trainer(cfg, ctx, run_dir)
    checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
    checkpoints.base = base_identity(cfg, trainer.engine.module)
    trainer.train()
    checkpoints.save_final()
    monkeypatch.chdir(run_dir)  # elsewhere: "a" is not here
    model = adapted_model(cfg, find_checkpoints(run_dir)[0])
    trained = dict(trainer.engine.module.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param, trained[name].detach()), name

    # ... and refuses a base whose files changed since: the adapters would be on other weights.
    _export(tmp_path / "b", 2)
    (tmp_path / "a" / "model.safetensors").unlink()
    (tmp_path / "b" / "model.safetensors").rename(tmp_path / "a" / "model.safetensors")
    with pytest.raises(ConfigError, match=r"^model\.init_from: the base .*/a has changed since"):
        adapted_model(cfg, find_checkpoints(run_dir)[0])


def _lora_curve(ctx: DistContext, tmp_path: Path, ac: str) -> tuple[list[float], list[float]]:
    """Loss and the synchronised gradients of 3 steps of adapter=lora under one recompute policy."""
    cfg = make_config(
        adapter=LORA,
        ac={"policy": ac},
        train={"steps": 3, "precision": "fp32"},
        optim={"warmup_steps": 0},
        checkpoint={"enabled": False},
    )
    trainer = build_trainer(cfg, ctx, tmp_path / ac)
    losses, grads = record_losses(trainer), record_gradients(trainer)
    trainer.train()
    assert None not in losses
    return [float(x) for x in losses if x is not None], [float(g.norm()) for g in grads]


def test_every_recompute_policy_trains_the_adapters_as_without_recompute(
    ctx: DistContext, tmp_path: Path
) -> None:
    """Issue 34: every recompute policy with adapters: the frozen base inside a recomputed block
    still passes the adapters' gradients (the same curve as ac=none, 1e-6)."""
    losses, grads = _lora_curve(ctx, tmp_path, "none")
    assert len(losses) == len(grads) == 3 and all(g > 0 for g in grads)
    for policy in [p.value for p in AcPolicy.granularities() if p != AcPolicy.none]:
        other_losses, other_grads = _lora_curve(ctx, tmp_path, policy)
        assert max_rel_diff(other_losses, losses) < 1e-6, (policy, other_losses, losses)
        assert max_rel_diff(other_grads, grads) < 1e-6, (policy, other_grads, grads)
