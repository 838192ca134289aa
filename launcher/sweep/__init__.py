"""Hydra sweeps: each point's wandb group and failure record, and the self-checking summary.

Import the submodules directly; this package imports nothing heavy (the CLI loads `job` always).
"""
