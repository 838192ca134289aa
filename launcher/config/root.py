"""The root config: every section, and the checks that span sections."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from launcher.config.ac import AcConfig
from launcher.config.adapter import AdapterConfig
from launcher.config.batch import BatchSplit, resolve_batch
from launcher.config.checks import require_finite
from launcher.config.cluster import ENDPOINT_EXAMPLE, ClusterConfig, ClusterKind
from launcher.config.data import DataConfig, DataKind
from launcher.config.engine import EngineConfig, EngineName
from launcher.config.eval import EvalConfig
from launcher.config.export import ExportConfig
from launcher.config.model import AUTO, BYTE_VOCAB, AnyModelConfig, ModelConfig
from launcher.config.parallel import BatchConfig, ParallelConfig
from launcher.config.pipeline import check_pipeline
from launcher.config.serve import ServeConfig
from launcher.config.tensor_parallel import check_tensor_parallel
from launcher.config.tracking import TrackingConfig
from launcher.config.train import (
    CheckpointConfig,
    DebugConfig,
    OptimConfig,
    TrainConfig,
    elastic_restarts,
)
from launcher.config.verify import VerifyConfig
from launcher.config.wandb import WandbConfig
from launcher.errors import ConfigError

BYTE_DATA = (DataKind.reverse, DataKind.text, DataKind.jsonl)
"""Data whose tokens are bytes (0..255)."""

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
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
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
        self._check_vocab()
        check_tensor_parallel(self)
        check_pipeline(self)
        if self.cluster.name != ClusterKind.torchrun:  # torchrun: once nodes come from the env
            self.parallel.check_min_nodes()
        local = self.cluster.name == ClusterKind.local
        if self.parallel.nodes > 1 and local and not self.parallel.elastic:
            raise ConfigError(
                ["parallel.nodes", "cluster"],
                f"{self.parallel.nodes} nodes need a scheduler or a rendezvous, but "
                f"cluster={self.cluster.name.value}.",
                "add cluster=slurm; or run the same command with cluster=torchrun "
                f"{ENDPOINT_EXAMPLE} (the first node's address) on every node "
                "(docs/multinode.md); or set parallel.nodes=1 "
                "(or, to try an elastic job on this machine, parallel.min_nodes=1).",
            )
        self._resolve_restarts()
        if self.parallel.elastic and self.verify.first:
            raise ConfigError(
                ["verify.first", "parallel.min_nodes"],
                "verify.first certifies the planned split inside the job, but an elastic job "
                "may start on fewer nodes, where that split does not run.",
                "set verify.first=false, and certify the splits before with `launch verify` and "
                "the same overrides, once per node count the job may run on (parallel.nodes=K "
                "for each K down to parallel.min_nodes).",
            )
        if self.parallel.elastic and not self.batch.auto:  # auto: the plan checks its choice
            self.check_elastic()
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
        if self.eval.harness.every and not self.checkpoint.enabled:
            raise ConfigError(
                ["eval.harness.every", "checkpoint.enabled"],
                "evaluation during training scores the run's checkpoints, and "
                "checkpoint.enabled=false saves none.",
                "set checkpoint.enabled=true, or eval.harness.every=0 (and run `launch eval RUN` "
                "on a checkpoint later).",
            )
        if self.checkpoint.async_ and self.engine.name == EngineName.deepspeed:
            raise ConfigError(
                ["checkpoint.async", "engine"],
                "asynchronous checkpoints are written with torch.distributed.checkpoint, which "
                "engine=deepspeed does not use (DeepSpeed saves its own format, synchronously).",
                "set checkpoint.async=false, or use engine=fsdp or engine=ddp.",
            )

    def _resolve_restarts(self) -> None:
        """train.max_restarts=null (the default): 0, or for an elastic job the restarts it needs
        (`elastic_restarts`); an explicit number stays, but an elastic job needs at least 1."""
        parallel, train = self.parallel, self.train
        if train.max_restarts is None:
            train.max_restarts = elastic_restarts(parallel) if parallel.elastic else 0
        elif parallel.elastic and train.max_restarts == 0:
            raise ConfigError(
                ["parallel.min_nodes", "train.max_restarts"],
                "an elastic job goes on after a lost node by restarting its ranks, and "
                "train.max_restarts=0 allows none.",
                f"set train.max_restarts={elastic_restarts(parallel)} (or null, the elastic "
                "default), or drop parallel.min_nodes.",
            )

    @property
    def restarts(self) -> int:
        """train.max_restarts as resolved: the restarts torchrun (and a SLURM job's relaunches
        after a lost node) may make."""
        return self.train.max_restarts or 0

    def restarts_note(self) -> list[str]:
        """`launch plan`'s line on an elastic job's restarts (none when not elastic)."""
        if not self.parallel.elastic:
            return []
        return [
            f"elastic     {self.restarts} restart(s) (train.max_restarts): each lost node or "
            "failed rank uses one"
        ]

    def replicas(self) -> int:
        """HSDP's replica groups: parallel.replicate, its default under FSDP, 1 otherwise."""
        if self.engine.name != EngineName.fsdp:
            return 1
        if self.parallel.replicate is not None:
            return self.parallel.replicate
        return self.parallel.default_replicate()

    def _check_vocab(self) -> None:
        """model.vocab_size=auto without a tokenizer is the bytes' 256 (data=hf: the tokenizer's,
        resolved with the data, launcher/data/vocab.py); byte-level data needs all 256."""
        if not isinstance(self.model, ModelConfig):
            return
        if self.model.vocab_size == AUTO and self.data.name != DataKind.hf:
            self.model.vocab_size = BYTE_VOCAB
        if self.data.name in BYTE_DATA and self.model.vocab < BYTE_VOCAB:
            raise ConfigError(
                "model.vocab_size",
                f"data={self.data.name.value} is byte-level: it needs at least 256 tokens, got "
                f"{self.model.vocab}.",
                "set model.vocab_size=auto (256).",
            )

    def on_nodes(self, nodes: int) -> RootConfig:
        """This run on `nodes` of its nodes (an elastic job that lost some): the same ranks per
        node, the same global batch and micro-batch, grad_accum derived again."""
        parallel, split = self.parallel, self.split()
        if nodes == parallel.nodes:
            return self
        dp = nodes * parallel.ranks_per_node
        resolve_batch(split.global_size, split.micro_size, None, dp)  # raises when it does not
        return replace(
            self,
            parallel=replace(parallel, dp=dp, nodes=nodes, replicate=None),
            batch=replace(self.batch, micro_size=split.micro_size, grad_accum=None),
        )

    def check_elastic(self) -> None:
        """Every allowed number of nodes holds the global batch in whole micro-batches; else one
        error naming the sizes that do not."""
        parallel, split = self.parallel, self.split()
        bad = []
        for nodes in range(parallel.least_nodes, parallel.nodes):
            try:
                self.on_nodes(nodes)
            except ConfigError:
                bad.append(nodes)
        if bad:
            sizes = ", ".join(f"{n} node(s) (dp {n * parallel.ranks_per_node})" for n in bad)
            raise ConfigError(
                ["parallel.min_nodes", "batch.global_size", "batch.micro_size"],
                f"the global batch of {split.global_size} does not split into micro-batches of "
                f"{split.micro_size} on {sizes}.",
                f"set parallel.min_nodes={max(bad) + 1}, or a batch.global_size that is a "
                f"multiple of batch.micro_size x dp for every size from {parallel.least_nodes} to "
                f"{parallel.nodes} nodes.",
            )

    def split(self) -> BatchSplit:
        """The resolved batch split (the one function that does batch arithmetic)."""
        return resolve_batch(
            self.batch.global_size, self.batch.micro, self.batch.grad_accum, self.parallel.dp
        )
