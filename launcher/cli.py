"""`launch`: subcommands and the Hydra entry. Parsing and dispatch only; the work is in
commands.py."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from launcher.config.load import to_root_config
from launcher.config.store import register_configs
from launcher.errors import LauncherError
from launcher.exit_codes import ABORTED, CONFIG_ERROR
from launcher.hydra_record import (
    check_run_dir,
    explicit_run_dir,
    keep_record_on_refusal,
    one_compose,
    sets_mode,
)
from launcher.lifetime import RunDirectoryBusy, exit_now
from launcher.logs import get_logger, mark, setup_logging
from launcher.resources import conf_dir
from launcher.rundir import HYDRA_DIR, LOCK_FILE
from launcher.sweep import job as sweep_job

CONF_DIR = conf_dir()  # conf/ in the checkout, launcher/conf in an installed wheel

USAGE = """\
usage: launch <command> [hydra overrides] [-m/--multirun] [--cfg job] [--help]

commands:
  train      run a training job (in-process, torchrun, or sbatch on SLURM)
  plan       resolve and validate, print the plan and its memory table, write config.yaml and
             plan.json; run nothing
  verify     run the configured split and a one-big-batch reference for verify.steps steps and
             compare losses and every gradient; writes verify.json (exit 0 certified, 1 not)
  generate RUN PROMPTS.jsonl [--output FILE] [serve.* overrides]
             batched offline generation from a run's checkpoint (continuous batching)
  serve RUN [serve.* overrides]
             an HTTP server (POST /v1/completions) on a run's checkpoint; needs the [serve] extra
  export RUN [--output DIR] [export.dtype=fp32|bf16|fp16] [export.overwrite=true]
             the trained weights as a from_pretrained directory (transformers models) or
             model.safetensors + model.yaml; a new run starts from it (model.init_from=DIR)
  eval RUN 'eval.harness.tasks=[TASK,...]' [eval.harness.include_path=DIR]
             lm-evaluation-harness on a run's checkpoint (any engine, no export): scores in
             RUN/eval/step_N.json, metrics.jsonl and the trackers; needs the [eval] extra
  sweep-summary SWEEP_DIR
             write sweep_summary.csv/.md/.png: one row per point, loss curves checked
             (`launch train -m` writes them itself, and with cluster=slurm submits a job that
             writes them again once the points' jobs have ended)

main config keys (override as key=value; groups as group=name):
  model=tiny|small|gpt2      model.n_layer model.n_head model.d_model model.seq_len model.dropout
  model=custom|hf            model._target_ (your nn.Module), model.path / model.config (HF)
  data=reverse|text|jsonl|tokens|hf|custom   data.path data.val_path data.tokenizer
  eval.every  eval.batches   a token-exact validation loss (val_loss)
  eval.harness.tasks eval.harness.include_path eval.harness.every   lm-eval scores of checkpoints
  parallel.dp  parallel.nodes
  batch.global_size  batch.micro_size  batch.grad_accum   (any two; the third is derived)
  batch.micro_size=auto  train.memory_budget=40GiB   a split chosen to fit (global batch kept)
  ac=none|full|every_n|sqrt|selective|auto   ac.every_n  ac.offload
  engine=ddp|fsdp|deepspeed  engine.zero_stage  engine.extra
  cluster=local|slurm|torchrun  cluster.partition cluster.time; cluster.rdzv_endpoint ...
  train.steps train.seed train.precision=fp32|bf16|fp16 train.resume=auto|never|PATH
  train.max_restarts  train.hang_timeout  checkpoint.every  checkpoint.keep  checkpoint.overwrite
  optim.lr  wandb.mode=offline|online|disabled  tracking.backends=[wandb,tensorboard,mlflow]
  model.init_from=DIR        start from the weights of `launch export` (export.at_end=true)
  hydra.run.dir=DIR          where the run's files go (default outputs/<date>/<time>)

examples:
  launch train
  launch train parallel.dp=2 batch.global_size=32 batch.grad_accum=4
  launch plan engine=deepspeed engine.zero_stage=3
  launch train -m batch.global_size=16 batch.grad_accum=1,2,4
  launch train -m +sweep=accumulation
  launch train --config-dir my_conf model=my_net data=my_corpus   (your groups beside conf/'s)

`launch train --help` lists every config group and key; `launch train --cfg job` prints the config.
Exit status: 0 done, 1 failed (the first rank to fail is named), 2 bad config or run directory
in use (nothing started), 3 the loss became NaN/inf (the last good checkpoint is kept), 75
stopped on SIGTERM/SIGUSR1/Ctrl-C after a checkpoint (run the same command to resume), 130
aborted by a second Ctrl-C, 143 stopped at once by a second SIGTERM.
"""

COMMANDS = ("train", "plan", "verify")


def _discard_empty_run_dir(run_dir: Path) -> None:
    """After a config error, leave no run directory behind that holds only Hydra's own files
    (and the lock this run took and released)."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {HYDRA_DIR, LOCK_FILE}:
        shutil.rmtree(run_dir, ignore_errors=True)


def _job(cfg: DictConfig, command: str) -> int:
    mark("composed")
    setup_logging(0)
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        root = to_root_config(cfg)
        if multirun:
            root = sweep_job.start_point(root, run_dir, Path(hydra_cfg.sweep.dir))
        from launcher import commands

        mark("imported")
        if command == "plan":
            commands.plan_command(root, run_dir)
            return 0
        if command == "verify":
            from launcher.verify.command import verify_command

            code = verify_command(root, run_dir)
        else:
            code = commands.train_command(root, run_dir)
    except LauncherError as exc:
        get_logger().error(str(exc))
        if multirun:
            # A failing point fails alone; .hydra/overrides.yaml stays to name it in the summary.
            sweep_job.record_failure(run_dir, str(exc))
            return exc.exit_code
        if not isinstance(exc, RunDirectoryBusy):  # the directory is another run's
            _discard_empty_run_dir(run_dir)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if not multirun:
            raise
        return sweep_job.record_crash(run_dir, exc)
    finally:
        if multirun:
            sweep_job.scrub_secrets(run_dir, Path(hydra_cfg.sweep.dir))
    if code and multirun and not sweep_job.record_exit(run_dir, code):
        return code  # the sweep goes on with the next point
    if code:
        sys.exit(code)
    return code


def _refuse(exc: LauncherError) -> NoReturn:
    """A problem found before Hydra starts a job: one line, nothing written."""
    setup_logging(0)
    get_logger().error(str(exc))
    sys.exit(exc.exit_code)


def _check_command_line(command: str, rest: list[str]) -> bool:
    """--help, and the overrides checked against the schema and conf/ before Hydra composes.
    Returns whether the run's mode is known without composing (hydra_record.one_compose)."""
    from hydra._internal.utils import get_args_parser

    from launcher.config.overrides import check_overrides
    from launcher.config.searchpath import user_configs

    args = get_args_parser().parse_args(rest)  # a bad flag: argparse's usage, status 2
    try:
        # The user's own config directories (--config-dir, hydra.searchpath) extend conf/.
        own = user_configs(args.config_dir, args.overrides, args.config_path, args.config_name)
        if args.help:
            from launcher.config.help import render_help

            print(render_help(command, CONF_DIR, args.overrides, own.dirs), end="")
            sys.exit(0)
        check_overrides(
            args.overrides, CONF_DIR, command, groups_known=own.complete, user_dirs=own.dirs
        )
    except LauncherError as exc:
        _refuse(exc)
    return not own.any and not sets_mode(args.overrides)


def _overrides_of(rest: list[str]) -> list[str]:
    from hydra._internal.utils import get_args_parser

    return list(get_args_parser().parse_args(rest).overrides)


def _hydra_entry(command: str, rest: list[str]) -> None:
    register_configs()
    mode_known = _check_command_line(command, rest)

    jobs_started: list[DictConfig] = []
    # Until a job starts, Hydra raises its errors (instead of printing several lines and exiting
    # 1), so that they are reported here in the launcher's form; a job's own errors are Hydra's.
    raise_hydra_errors = "HYDRA_FULL_ERROR" not in os.environ
    if raise_hydra_errors:
        os.environ["HYDRA_FULL_ERROR"] = "1"

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def entry(cfg: DictConfig) -> int:
        jobs_started.append(cfg)
        if raise_hydra_errors:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        return _job(cfg, command)

    multirun = "-m" in rest or "--multirun" in rest
    run_dir = None if multirun else explicit_run_dir(_overrides_of(rest))
    try:
        if run_dir is not None:
            check_run_dir(run_dir)
        with keep_record_on_refusal(run_dir), one_compose(mode_known):
            entry()
    except LauncherError as exc:
        _refuse(exc)
    except SystemExit as exc:
        # Hydra reports a bad override or config group (already printed) with status 1 before
        # any job starts; to the user that is a config error like ours: status 2.
        if exc.code == 1 and not jobs_started:
            sys.exit(CONFIG_ERROR)
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        if jobs_started or not raise_hydra_errors:
            raise
        from launcher.config.overrides import translate_hydra_error

        _refuse(translate_hydra_error(exc, command))
    finally:
        if raise_hydra_errors:
            os.environ.pop("HYDRA_FULL_ERROR", None)


def main(argv: list[str] | None = None) -> None:
    mark("start")
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        sys.exit(0)
    command, rest = args[0], args[1:]
    if command == "sweep-summary":
        from launcher.sweep.command import summary_main

        sys.exit(summary_main(rest))
    if command in ("generate", "serve"):
        from launcher.serve.command import generate_main, serve_main

        main_of = generate_main if command == "generate" else serve_main
        sys.exit(main_of(rest))
    if command == "eval":
        from launcher.harness.command import eval_main

        sys.exit(eval_main(rest))
    if command == "export":
        from launcher.export.command import export_main

        sys.exit(export_main(rest))
    if command not in COMMANDS:
        print(f"launch: unknown command {command!r}\n", file=sys.stderr)
        print(USAGE, end="", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"launch {command}", *rest]
    code = 0
    try:
        _hydra_entry(command, rest)
    except SystemExit as exc:
        if not (exc.code is None or isinstance(exc.code, int)):
            raise
        code = exc.code or 0
    except KeyboardInterrupt:
        # A second Ctrl-C (the first asks the run to stop after the step and save), or one
        # before the run started: no traceback.
        setup_logging(0)
        get_logger().warning(
            "aborted (Ctrl-C); a rerun of the same command resumes from the last complete "
            "checkpoint."
        )
        code = ABORTED
    if argv is None:  # the `launch` command itself: skip the interpreter's slow shutdown
        exit_now(code)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
