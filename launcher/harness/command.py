"""`launch eval RUN|CHECKPOINT [eval.harness.* overrides]`: lm-evaluation-harness on a run's
newest complete checkpoint (or the checkpoints/step_<N> given); the scores in
<run dir>/eval/step_N.json, metrics.jsonl and the run's trackers (launcher/harness/record.py).
Every bad input is one line on stderr and exit status 2, before the model loads."""

from __future__ import annotations

import dataclasses
import sys
import traceback
from typing import Any

from launcher.config.eval import HarnessConfig
from launcher.config.suggest import did_you_mean, suggestions
from launcher.errors import ConfigError, LauncherError
from launcher.exit_codes import CONFIG_ERROR
from launcher.logs import get_logger, setup_logging
from launcher.secrets import redact

EVAL_USAGE = """\
usage: launch eval RUN_DIR_OR_CHECKPOINT [overrides]

lm-evaluation-harness (lm-eval's own evaluator) on a run's newest complete checkpoint, or the
checkpoints/step_<N> given, of any engine (no export needed); local tasks only, no network.
Scores go to <run dir>/eval/step_<N>.json, a metrics.jsonl line at step N and the run's trackers.
Needs the eval extra: pip install 'launcher[eval]'.

overrides: eval.harness.tasks=[TASK,...] eval.harness.include_path=DIR eval.harness.limit=N
           eval.harness.num_fewshot=N eval.harness.batch_size=N eval.harness.max_gen_toks=N
           eval.harness.log_samples=true train.device=auto|cpu|cuda
(the defaults are the run's own eval.harness section)
"""

PREFIX = "eval.harness."
DEVICE_KEY = "train.device"
RECORD_FAILURE = "--record-failure"
"""Internal (evaluation during training): a failure is written to eval/step_N.json and
metrics.jsonl too, so that training's log and trackers show it."""


def apply_harness_overrides(
    harness: HarnessConfig, overrides: dict[str, str]
) -> tuple[HarnessConfig, str]:
    """(the run's eval.harness with the overrides, the device asked for). Values are parsed as
    Hydra's command line parses them ([a,b] is a list); HarnessConfig checks them."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    keys = [f"{PREFIX}{f.name}" for f in dataclasses.fields(HarnessConfig)]
    device, dotlist = "auto", []
    for key, value in overrides.items():
        if key == DEVICE_KEY:
            if value not in ("auto", "cpu", "cuda"):
                raise ConfigError(key, f"unknown device {value!r}.", "use auto, cpu or cuda.")
            device = value
        elif key in keys:
            dotlist.append(f"{key.removeprefix(PREFIX)}={value}")
        else:
            near = suggestions(key, [*keys, DEVICE_KEY])
            raise ConfigError(
                key,
                "launch eval takes no such key.",
                f"{did_you_mean(near)}it takes {', '.join(keys)} and {DEVICE_KEY}.",
            )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(harness), OmegaConf.from_dotlist(dotlist))
        result = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = f"{PREFIX}{exc.full_key}" if getattr(exc, "full_key", None) else "eval.harness"
        raise ConfigError(key, f"{exc.msg if hasattr(exc, 'msg') else exc}.") from None
    assert isinstance(result, HarnessConfig)
    return result, device


def eval_main(argv: list[str]) -> int:
    setup_logging(0)
    record_failure = RECORD_FAILURE in argv
    argv = [a for a in argv if a != RECORD_FAILURE]
    log = get_logger("eval")
    found: Any = None
    try:
        from launcher.serve.options import parse_argv

        line = parse_argv(argv, "eval", takes_output=False)
        if line.help:
            print(EVAL_USAGE, end="")
            return 0
        if len(line.positionals) != 1:
            raise ConfigError(
                "RUN_DIR_OR_CHECKPOINT",
                "expected one run directory or checkpoint, got "
                f"{' '.join(line.positionals) or 'nothing'}.",
                "launch eval RUN_DIR_OR_CHECKPOINT 'eval.harness.tasks=[TASK]'.",
            )
        from launcher.config.load import load_config_file
        from launcher.harness.evaluate import go_offline, require_lm_eval, task_manager
        from launcher.rundir import CONFIG_FILE
        from launcher.serve.load import find_checkpoint

        apply_harness_overrides(HarnessConfig(), line.overrides)  # keys and types, early
        run_dir, checkpoint = find_checkpoint(line.positionals[0])
        found = (run_dir, checkpoint)
        base = load_config_file(run_dir / CONFIG_FILE)
        harness, device_name = apply_harness_overrides(base.eval.harness, line.overrides)
        require_lm_eval()
        go_offline()
        manager = task_manager(harness)  # a task lm-eval lacks is named before the model loads
        return _run(line.positionals[0], harness, device_name, manager, log)
    except LauncherError as exc:
        log.error(str(exc))
        if record_failure and found is not None:
            _record_failure(found, str(exc))
        return exc.exit_code or CONFIG_ERROR
    except Exception as exc:
        if not (record_failure and found is not None):
            raise
        traceback.print_exc()
        _record_failure(found, f"{type(exc).__name__}: {exc}")
        return 1


def _run(argument: str, harness: HarnessConfig, device_name: str, manager: Any, log: Any) -> int:
    from launcher.distributed import pick_device
    from launcher.harness.evaluate import evaluate
    from launcher.harness.record import flat_scores, write_record
    from launcher.serve.command import apply_thread_rule
    from launcher.serve.load import find_checkpoint, load_run

    threads = apply_thread_rule()
    device = pick_device(device_name, 0)
    run = load_run(argument, device)
    run_dir, _ = find_checkpoint(argument)
    _read(run_dir, run.checkpoint.step)
    print(
        f"evaluating {run.checkpoint.path} (step {run.checkpoint.step}) on "
        f"{', '.join(harness.tasks)} ({harness.batch_size} slots, {threads} CPU threads)",
        file=sys.stderr,
    )
    record = evaluate(run, harness, manager, device)
    path = write_record(run.cfg, run_dir, run.checkpoint.step, record)
    scores = flat_scores(record["results"])
    shown = ", ".join(f"{k.removeprefix('harness/')} {v:.4f}" for k, v in scores.items())
    log.info(f"step {run.checkpoint.step}: {shown}; written to {path}")
    return 0


def _read(run_dir: Any, step: int) -> None:
    """The checkpoint is in memory: checkpoint.keep may prune it now."""
    from launcher.rundir import PENDING_SUFFIX, harness_file

    harness_file(run_dir, step, PENDING_SUFFIX).unlink(missing_ok=True)


def _record_failure(found: Any, error: str) -> None:
    from launcher.config.load import load_config_file
    from launcher.harness.record import write_record
    from launcher.rundir import CONFIG_FILE

    run_dir, checkpoint = found
    _read(run_dir, checkpoint.step)
    record = {"step": checkpoint.step, "checkpoint": str(checkpoint.path), "error": redact(error)}
    try:
        write_record(load_config_file(run_dir / CONFIG_FILE), run_dir, checkpoint.step, record)
    except Exception as exc:  # nothing more to report with
        get_logger("eval").error(f"the failure could not be recorded ({exc}).")
