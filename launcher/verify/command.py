"""`launch verify` and `launch train verify.first=true`: run the configured split the way training
runs it, then its one-big-batch reference, compare, diagnose, and write the certificate.

The run directory keeps the training contract: `launch verify` writes config.yaml and plan.json
of the configured run (what `launch plan` would write, so that the certificate sits beside the
plan it certifies) and refuses a directory where a training run has started. Its own runs live
under <run dir>/verify/ (launcher/verify/results.py), each with the config.yaml and plan.json its
ranks use; the certificate is <run dir>/verify.json.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from launcher.config.batch import divisors
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.lifetime import RunLock
from launcher.logs import get_logger
from launcher.plan import Plan, build_plan
from launcher.prepare import check_environment, prepare_run, refuse_started_run, write_run_files
from launcher.runners import Runner, runner_for
from launcher.runners.inprocess import InProcessRunner
from launcher.verify.compare import compare, statistics_gaps
from launcher.verify.diagnose import diagnose
from launcher.verify.report import Certificate, write_certificate
from launcher.verify.results import (
    REFERENCE_DIR,
    REPEAT_DIR,
    SPLIT_DIR,
    VERIFY_DIR,
    clear_results,
    read_result,
)
from launcher.verify.settings import TOLERANCES, compared_precision, reference_config, split_config
from launcher.verify.worker import WORKER

log = get_logger("verify")


VERIFY_REFUSAL = (
    "training run",
    "`launch verify` would overwrite the config.yaml and plan.json it resumes from.",
    "verify into a new directory (hydra.run.dir=...), or start new runs with `launch train "
    "verify.first=true`.",
)


def refuse_training_run(run_dir: Path) -> None:
    refuse_started_run(run_dir, VERIFY_REFUSAL)


def verify_command(cfg: RootConfig, run_dir: Path) -> int:
    """`launch verify`: exit 0 when the split is certified, 1 when not (or the split's own
    failure status when it could not run)."""
    refuse_training_run(run_dir)
    lock = RunLock(run_dir)
    try:
        cfg, runner, plan = prepare_run(cfg, run_dir, lock, dry_run=True)
        log.info(f"verify: the run to certify\n{plan.describe()}")
        submitted = runner.submit_verify(cfg, run_dir)  # SLURM: verify.sbatch, in the allocation
        return verify_split(cfg, run_dir) if submitted is None else submitted
    finally:
        lock.release()


def verify_split(cfg: RootConfig, run_dir: Path) -> int:
    """Run the configured split on this machine (in-process or torchrun), then certify it."""
    split_cfg = split_config(cfg)
    split_dir = run_dir / VERIFY_DIR / SPLIT_DIR
    log.info(f"verify: the configured split, {split_cfg.train.steps} steps ({split_dir})")
    code = run_planned(split_cfg, split_dir, runner_for(split_cfg))
    if code:
        log.error(f"verify: the configured split failed (exit status {code}); not certified.")
        return code
    return certify(cfg, run_dir)


def run_planned(cfg: RootConfig, out_dir: Path, runner: Runner, plan: Plan | None = None) -> int:
    """Plan and run one verified run with `runner` (the verify worker on every rank)."""
    runner.worker = WORKER
    if plan is None:
        cfg = check_environment(cfg, runner)
        plan = build_plan(cfg, out_dir, runner)
    cfg = plan.config or cfg  # batch.micro_size=auto, ac=auto: what the ranks run
    write_run_files(cfg, out_dir, plan)
    clear_results(out_dir)
    return runner.run(cfg, out_dir, plan)


def plan_reference(split_cfg: RootConfig, out_dir: Path) -> tuple[RootConfig, Plan, str]:
    """The reference: one process, one micro-batch of the whole global batch; where that does
    not fit the memory plan (a GPU), the fewest micro-batches that do, said so."""
    global_size = split_cfg.split().global_size
    runner = InProcessRunner()
    runner.worker = WORKER
    accums = divisors(global_size)
    for accum in accums:
        cfg = check_environment(reference_config(split_cfg, accum), runner)
        try:
            plan = build_plan(cfg, out_dir, runner)
        except ConfigError:
            if accum == accums[-1]:
                raise
            continue
        note = (
            ""
            if accum == 1
            else f" (one micro-batch of {global_size} does not fit the memory plan; the closest "
            f"split that does: {accum} micro-batches of {global_size // accum})"
        )
        return plan.config or cfg, plan, note
    raise AssertionError("unreachable: accum == global_size always plans")


def certify(cfg: RootConfig, run_dir: Path) -> int:
    """The split has run (its results are under verify/split): run the reference, compare,
    diagnose a failure, print the certificate and write verify.json. 0 certified, 1 not."""
    split_cfg = split_config(cfg)
    verify_dir = run_dir / VERIFY_DIR
    shutil.rmtree(verify_dir / REPEAT_DIR, ignore_errors=True)  # an earlier verify's
    split = read_result(verify_dir / SPLIT_DIR)
    ref_cfg, ref_plan, note = plan_reference(split_cfg, verify_dir / REFERENCE_DIR)
    if note:
        log.warning(f"verify: the reference is not one big batch{note}.")
    log.info(f"verify: the reference, dp 1 x micro {ref_plan.micro_size}")
    code = run_planned(ref_cfg, verify_dir / REFERENCE_DIR, InProcessRunner(), ref_plan)
    if code:
        log.error(f"verify: the reference run failed (exit status {code}); not certified.")
        return code
    reference = read_result(verify_dir / REFERENCE_DIR)
    tolerance = TOLERANCES[compared_precision(cfg)]
    comparison = compare(split, reference, tolerance)
    repeat, evidence, deterministic = None, None, None
    if not comparison.certified:
        # Before blaming the split: does the reference agree with itself?
        log.info("verify: not certified; running the reference again (determinism)")
        again = verify_dir / REPEAT_DIR
        if run_planned(ref_cfg, again, InProcessRunner(), ref_plan) == 0:
            repeat = compare(read_result(again), reference, tolerance)
            deterministic = repeat.certified
        from launcher.verify.probe import gather_evidence

        evidence = gather_evidence(ref_cfg, split_cfg)
    findings = diagnose(split_cfg, comparison, repeat, evidence, statistics_gaps(split, reference))
    certificate = Certificate(
        split_cfg, split, reference, note, comparison, deterministic, findings
    )
    path = write_certificate(run_dir, certificate)
    (log.info if certificate.certified else log.error)(f"{certificate.describe()}\nwrote {path}")
    return 0 if certificate.certified else 1


def verify_before_training(cfg: RootConfig, run_dir: Path) -> int:
    """`launch train verify.first=true` on this machine: 0 when the split is certified."""
    log.info("verify.first=true: certifying the split before training")
    code = verify_split(cfg, run_dir)
    if code:
        log.error(
            "verify.first=true: the split is not certified (verify.json says why); training was "
            "not started. Fix the cause, or train without verify.first."
        )
    return code
