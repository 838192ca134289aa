"""The periodic validation loss, and lm-evaluation-harness scores (`eval.harness.*`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from launcher.config.cluster import time_limit_seconds
from launcher.errors import ConfigError

_TASK = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""An lm-eval task or group name (they land in an sbatch script's command line too)."""


@dataclass
class HarnessConfig:
    """lm-evaluation-harness on a checkpoint: `launch eval RUN`, and during training on the
    checkpoints whose step is a multiple of `every` (docs/evaluation.md)."""

    tasks: list[str] = field(default_factory=list)
    """lm-eval task (or group) names, e.g. [hellaswag] or your own under include_path."""
    include_path: str | None = None
    """A directory of your own task YAML files (lm-eval's --include_path); relative to the
    directory `launch` runs in."""
    every: int = 0
    """During training: evaluate each checkpoint whose step is a multiple of N, and the last
    one, in a process (cluster=slurm: a job) of its own (0: never)."""
    limit: int | None = None
    """At most this many documents per task (null: all); for quick checks."""
    num_fewshot: int | None = None
    """Few-shot examples per prompt (null: each task's own default)."""
    batch_size: int = 8
    """Requests answered together: the serving engine's slots."""
    max_gen_toks: int = 256
    """generate_until tasks: tokens generated at most when the task sets no max_gen_toks."""
    log_samples: bool = False
    """Also keep each document's scored responses in eval/step_N.json ("samples")."""
    wait_s: int = 1800
    """cluster=local: at the end of training, wait at most this long for evaluations still
    running (they go on after it, and write their results themselves)."""
    time: str = "01:00:00"
    """cluster=slurm: the evaluation job's time limit, [D-]HH:MM:SS."""

    def __post_init__(self) -> None:
        for index, task in enumerate(self.tasks):
            if not _TASK.fullmatch(str(task)):
                raise ConfigError(
                    f"eval.harness.tasks[{index}]",
                    f"{task!r} is not an lm-eval task name.",
                    "use names of letters, digits, '.', '_' and '-', e.g. "
                    "'eval.harness.tasks=[arc_easy,my_task]'.",
                )
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(
                "eval.harness.tasks", f"names a task twice: {self.tasks}.", "list each task once."
            )
        if self.every < 0:
            raise ConfigError(
                "eval.harness.every",
                f"must be 0 (off) or more, got {self.every}.",
                "set it to 0 or N.",
            )
        if self.every and not self.tasks:
            raise ConfigError(
                ["eval.harness.every", "eval.harness.tasks"],
                "evaluation during training needs the tasks to run.",
                "add 'eval.harness.tasks=[TASK,...]', or set eval.harness.every=0.",
            )
        if self.limit is not None and self.limit < 1:
            raise ConfigError(
                "eval.harness.limit",
                f"must be 1 or more (or null), got {self.limit}.",
                "set eval.harness.limit=N, or null for every document.",
            )
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise ConfigError(
                "eval.harness.num_fewshot",
                f"must be 0 or more (or null), got {self.num_fewshot}.",
                "set eval.harness.num_fewshot=N, or null for each task's own.",
            )
        for key in ("batch_size", "max_gen_toks"):
            if getattr(self, key) < 1:
                raise ConfigError(
                    f"eval.harness.{key}",
                    f"must be 1 or more, got {getattr(self, key)}.",
                    f"set eval.harness.{key}=1 or more.",
                )
        if self.wait_s < 0:
            raise ConfigError(
                "eval.harness.wait_s",
                f"must be 0 or more, got {self.wait_s}.",
                "set eval.harness.wait_s=SECONDS (0: do not wait).",
            )
        try:
            time_limit_seconds(self.time)
        except ConfigError:
            raise ConfigError(
                "eval.harness.time",
                f"{self.time!r} is not a SLURM time limit.",
                "use [D-]HH:MM:SS, e.g. eval.harness.time=00:30:00.",
            ) from None


@dataclass
class EvalConfig:
    """A token-exact validation loss over held-out data, measured on every rank; and
    lm-evaluation-harness scores of checkpoints (`harness`)."""

    every: int = 0
    """Measure val_loss every N optimizer steps and after the last one (0: never)."""
    batches: int = 4
    """Global batches of held-out sequences per measurement (fewer if the held-out set is
    smaller)."""
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    """lm-evaluation-harness (the `eval` extra): `launch eval`, and eval.harness.every."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ConfigError("eval.every", f"must be 0 (off) or more, got {self.every}.")
        if self.batches < 1:
            raise ConfigError("eval.batches", f"must be 1 or more, got {self.batches}.")
