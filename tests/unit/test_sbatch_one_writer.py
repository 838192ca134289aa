"""One module writes every #SBATCH line (launcher/config/sbatch.py): the training job's, a
dependent job's and an evaluation job's, under one rule. The source is read, not imported: a
string in code (not a docstring or a comment) that holds `#SBATCH` writes such a line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.config.cluster import ClusterConfig, ClusterKind
from launcher.config.sbatch import SbatchJob, is_directive, sbatch_directives
from launcher.errors import ConfigError
from tests.helpers import REPO

WRITER = "launcher/config/sbatch.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (of a module, class or function, or
    an attribute's, the string right after an assignment)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                found.add(id(stmt.value))
    return found


def writers(root: Path) -> set[str]:
    """The modules under root whose code holds a string with #SBATCH in it."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and "#SBATCH" in text and id(node) not in docs:
                found.add(path.relative_to(root.parent).as_posix())
    return found


def test_one_module_writes_every_sbatch_line() -> None:
    assert writers(REPO / "launcher") == {WRITER}


def test_the_search_finds_a_writer(tmp_path: Path) -> None:
    """The negative control: a second module that writes a line is found; a docstring or a
    comment naming #SBATCH is not a writer."""
    package = tmp_path / "launcher"
    package.mkdir()
    (package / "quiet.py").write_text('"""Writes no #SBATCH line."""\n# nor does #SBATCH here\n')
    (package / "loud.py").write_text('def f(o):\n    return f"#SBATCH {o}"\n')
    assert writers(package) == {"launcher/loud.py"}


def test_every_line_is_checked_by_one_rule(tmp_path: Path) -> None:
    cluster = ClusterConfig(name=ClusterKind.slurm, partition="debug")
    job = SbatchJob(name="x", time="00:10:00", output=tmp_path / "a-%j.out", log_key="k")
    assert sbatch_directives(job, cluster).splitlines() == [
        "#SBATCH --job-name=x",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --time=00:10:00",
        "#SBATCH --partition=debug",
        f"#SBATCH --output={tmp_path}/a-%j.out",
        "#SBATCH --no-requeue",
    ]
    for bad in ("--comment=a b", "--comment=$(id)", "--comment=`id`", "--x\n--y", "-N 4"):
        assert not is_directive(bad)
        with pytest.raises(ConfigError) as info:
            sbatch_directives(SbatchJob("x", "1", tmp_path / "o", "k", extra=("--a", bad)), cluster)
        assert info.value.keys == ["cluster.extra_directives[1]"]
    for name in ("a b", "50%", "x$y", "q'"):  # the logs' directory: '%' too (sbatch's patterns)
        with pytest.raises(ConfigError) as info:
            sbatch_directives(
                SbatchJob("x", "1", tmp_path / name / "o-%j", "hydra.run.dir"), cluster
            )
        assert info.value.keys == ["hydra.run.dir"] and "Fix:" in str(info.value)
