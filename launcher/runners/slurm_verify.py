"""The lines of a SLURM script that certify the split (`launch verify`, verify.first): the split
runs in the allocation (srun, one torchrun per node, as the training step does), then the
reference and the certificate on the batch host (launcher/verify/job.py).

`launch train verify.first=true` adds them to train.sbatch before the training step (a requeued
job does not verify again); `launch verify` writes verify.sbatch, the same script ending after
the certificate, which the SLURM runner submits and waits for (launcher/runners/slurm.py).
"""

from __future__ import annotations

_SPLIT_STEP = r"""VERIFY_DIR="$RUN_DIR"/verify/split
"$PYTHON" -m launcher.verify.job prepare "$RUN_DIR" || exit 1
VERIFY_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --kill-on-bad-exit=1 --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \
    ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} \
    "$PYTHON" -m launcher.runners.slurm_node \
    --nnodes="$SLURM_NNODES" --nproc_per_node="$RANKS_PER_NODE" --max_restarts=0 \
    --rdzv_backend=c10d --rdzv_endpoint="$VERIFY_HEAD:$(( RDZV_PORT + 1 ))" \
    --rdzv_id="$SLURM_JOB_ID-verify" \
    -m launcher.verify.worker "$VERIFY_DIR/config.yaml"
VERIFIED=$?
if [ "$VERIFIED" -eq 0 ]; then
    "$PYTHON" -m launcher.verify.job certify "$RUN_DIR"
    VERIFIED=$?
fi"""


def verify_step(verify_only: bool) -> str:
    """The lines train.sbatch gets after its set-up (they start with a blank line)."""
    if verify_only:
        return (
            "\n\n# --- launch verify: the configured split in this allocation, then the "
            "certificate (verify.json)\n" + _SPLIT_STEP + '\nexit "$VERIFIED"'
        )
    body = "\n".join(f"    {line}" if line else line for line in _SPLIT_STEP.splitlines())
    return (
        "\n\n# --- verify.first: certify the split in this allocation before the first step (a "
        "requeued job has)\n"
        'if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then\n'
        + body
        + '\n    if [ "$VERIFIED" -ne 0 ]; then\n'
        '        echo "launcher: verify.first: the split is not certified (see '
        '$RUN_DIR/verify.json); training not started"\n'
        '        exit "$VERIFIED"\n'
        "    fi\n"
        "fi"
    )
