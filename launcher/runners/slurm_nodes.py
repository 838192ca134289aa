"""What train.sbatch asks SLURM for in nodes and CPUs, and what an elastic job
(parallel.min_nodes < parallel.nodes) adds to the script: the fewest nodes it goes on with, the
CPUs of a node's task, and the node range asked for again after a requeue."""

from __future__ import annotations

from launcher.config.root import RootConfig


def node_options(cfg: RootConfig) -> list[str]:
    """One task per node for N nodes; or (elastic, parallel.min_nodes) the range MIN-N, so that
    a requeued job (a node failed) starts on the nodes there are, and its ranks derive the split
    for the world they get (launcher/worker/elastic.py). A range alone starts on MIN nodes even
    when N are idle (select/cons_tres takes the fewest nodes that hold the tasks), so the job
    asks for N tasks spread over as many nodes as are free, at most ceil(N/MIN) on one node;
    train.sbatch runs one task per allocated node whatever SLURM placed, and after a node failure
    runs the step again on the nodes left (--no-kill)."""
    parallel = cfg.parallel
    if not parallel.elastic:
        return [f"--nodes={parallel.nodes}", "--ntasks-per-node=1"]
    most_per_node = -(-parallel.nodes // parallel.least_nodes)
    return [
        f"--nodes={parallel.least_nodes}-{parallel.nodes}",
        f"--ntasks={parallel.nodes}",
        f"--ntasks-per-node={most_per_node}",
        "--spread-job",
        "--no-kill",  # a failed node leaves the job its other nodes (train.sbatch goes on there)
    ]


def cpus_option(cfg: RootConfig) -> str | None:
    """cluster.cpus_per_task for the one task per node: per task, or in an elastic job per node
    (--mincpus), since on fewer nodes one node holds several of its N tasks and N x CPUs would
    not fit one node."""
    cpus = cfg.cluster.cpus_per_task
    if not cpus:
        return None
    return f"--mincpus={cpus}" if cfg.parallel.elastic else f"--cpus-per-task={cpus}"


# The CPUs of a node's task: SLURM's --cpus-per-task; in an elastic job the fewest CPUs a node of
# the allocation has (SLURM_JOB_CPUS_PER_NODE reads like "4(x2),2").
_STEP_CPUS = "${SLURM_CPUS_PER_TASK:-}"
_ELASTIC_STEP_CPUS = (
    "$(tr , '\\n' <<< \"${SLURM_JOB_CPUS_PER_NODE:-}\" | sed 's/(.*//' | sort -n | head -n 1)"
)
# SLURM rewrites a started job's node count to the nodes it got (and its tasks to nodes x
# --ntasks-per-node), so a requeued elastic job would wait for those: ask for the range again.
_RESTORE_RANGE = """            RANGE_ASKED=
            for _ in 1 2 3 4 5 6; do
                scontrol update JobId="$SLURM_JOB_ID" NumNodes={range} NumTasks={tasks} \\
                    2>/dev/null && RANGE_ASKED=1 && break
                sleep 0.5
            done
            [ -n "$RANGE_ASKED" ] || echo "launcher: the requeued job may wait for the nodes it" \\
                "had; ask for the range: scontrol update JobId=$SLURM_JOB_ID NumNodes={range}" \\
                "NumTasks={tasks}\""""


def elastic_values(cfg: RootConfig) -> dict[str, str]:
    """train.sbatch's {{min_nodes}}, {{step_cpus}} and {{after_requeue}}."""
    parallel = cfg.parallel
    if not parallel.elastic:
        # All of them, so a lost node ends the job (SLURM requeues it, or not).
        return {
            "min_nodes": '"$SLURM_NNODES"',
            "step_cpus": _STEP_CPUS,
            "after_requeue": "            # (not elastic: it waits for its N nodes)",
        }
    restore = _RESTORE_RANGE.format(
        range=f"{parallel.least_nodes}-{parallel.nodes}", tasks=parallel.nodes
    )
    return {
        "min_nodes": str(parallel.least_nodes),
        "step_cpus": _ELASTIC_STEP_CPUS,
        "after_requeue": restore,
    }
