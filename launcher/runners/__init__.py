"""Plan -> process: in-process for one rank, torchrun for several, sbatch for SLURM."""
