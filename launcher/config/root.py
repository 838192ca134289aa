"""The root config: every section, and the checks that span sections."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from launcher.config.ac import AcConfig
from launcher.config.adapter import AdapterConfig
from launcher.config.checks import require_finite
from launcher.config.cluster import ClusterConfig, ClusterKind
from launcher.config.data import DataConfig
from launcher.config.engine import EngineConfig, EngineName
from launcher.config.eval import EvalConfig
from launcher.config.export import ExportConfig
from launcher.config.model import AnyModelConfig, ModelConfig
from launcher.config.parallel import BatchConfig, ParallelConfig
from launcher.config.serve import ServeConfig
from launcher.config.train import CheckpointConfig, DebugConfig, OptimConfig, TrainConfig
from launcher.config.verify import VerifyConfig
from launcher.config.wandb import WandbConfig
from launcher.errors import ConfigError
from launcher.training.batch import BatchSplit, resolve_batch

if TYPE_CHECKING:
    ModelSection = AnyModelConfig
else:  # OmegaConf sees an open node: the built-in GPT's fields or a user model's own keys
    ModelSection = Any


@dataclass
class RootConfig:
    """A whole run. Built from Hydra's composed config by `to_root_config`."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    model: ModelSection = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ac: AcConfig = field(default_factory=AcConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)

    def __post_init__(self) -> None:
        # Every section's float fields, also those of a section that does not check its own.
        for f in fields(self):
            require_finite(f.name, getattr(self, f.name))
        self.split()  # raises on a batch split that does not multiply out
        if self.parallel.nodes > 1 and self.cluster.name != ClusterKind.slurm:
            raise ConfigError(
                ["parallel.nodes", "cluster"],
                f"{self.parallel.nodes} nodes need a scheduler, but "
                f"cluster={self.cluster.name.value}.",
                "add cluster=slurm, or set parallel.nodes=1.",
            )
        if (self.parallel.replicate or 1) > 1 and self.engine.name != EngineName.fsdp:
            raise ConfigError(
                ["parallel.replicate", "engine"],
                f"hybrid sharding (replicate={self.parallel.replicate}) is FSDP2's; engine is "
                f"{self.engine.name.value}.",
                "add engine=fsdp, or drop parallel.replicate.",
            )
        if self.data.max_len * 2 + 2 > self.model.seq_len and self.data.name.value == "reverse":
            raise ConfigError(
                ["data.max_len", "model.seq_len"],
                f"a reversal problem of length {self.data.max_len} needs "
                f"{self.data.max_len * 2 + 2} tokens, but seq_len={self.model.seq_len}.",
                f"raise model.seq_len to {self.data.max_len * 2 + 2} or lower data.max_len.",
            )
        held_out = self.data.name.value in ("reverse", "jsonl") or self.data.holdout > 0
        if self.eval.every and not (held_out or self.data.val_path):
            raise ConfigError(
                ["eval.every", "data.val_path"],
                f"a validation loss needs held-out data, and data={self.data.name.value} has none.",
                "add data.val_path=FILE (tokens, hf, text) or data.holdout=N (the last N samples),"
                " or set eval.every=0.",
            )
        if self.checkpoint.async_ and self.engine.name == EngineName.deepspeed:
            raise ConfigError(
                ["checkpoint.async", "engine"],
                "asynchronous checkpoints are written with torch.distributed.checkpoint, which "
                "engine=deepspeed does not use (DeepSpeed saves its own format, synchronously).",
                "set checkpoint.async=false, or use engine=fsdp or engine=ddp.",
            )

    def replicas(self) -> int:
        """HSDP's replica groups: parallel.replicate, its default under FSDP, 1 otherwise."""
        if self.engine.name != EngineName.fsdp:
            return 1
        if self.parallel.replicate is not None:
            return self.parallel.replicate
        return self.parallel.default_replicate()

    def split(self) -> BatchSplit:
        """The resolved batch split (the one function that does batch arithmetic)."""
        return resolve_batch(
            self.batch.global_size, self.batch.micro, self.batch.grad_accum, self.parallel.dp
        )
