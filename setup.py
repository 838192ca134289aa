"""The package list, which pyproject.toml cannot say: every `launcher*` package found, plus the
repository's conf/ (with its group directories) and slurm/ as `launcher.conf` and `launcher.slurm`.
Their directories are mapped and their files listed in pyproject.toml, with everything else."""

from setuptools import find_namespace_packages, find_packages, setup

CONF = ["launcher.conf", *(f"launcher.conf.{group}" for group in find_namespace_packages("conf"))]

setup(packages=[*find_packages(include=["launcher*"]), *CONF, "launcher.slurm"])
