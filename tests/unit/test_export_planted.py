"""`launch export --output DIR` beside what a user left there (issue 33, item 4): a planted
DIR.partial (a file, or a link to a file elsewhere) is untouched by an export and by one that
replaces DIR; a replaced directory keeps its permission bits; a dangling link as --output is one
error before anything. The directory writer is launcher/export/output.py; files follow
launcher/userpath (tests/unit/test_userpath.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.export.output import check_output, commit, temporary_sibling
from tests.planted import Planted


def _export(out: Path, run_dir: Path, overwrite: bool) -> None:
    """What export_main does around the weights: check, write into the sibling, rename."""
    check_output(out, overwrite, run_dir)
    tmp = temporary_sibling(out)
    (tmp / "config.json").write_text('{"new": true}\n')
    commit(tmp, out, overwrite, run_dir)


@pytest.mark.parametrize("as_link", [False, True], ids=["partial-file", "partial-link"])
def test_a_planted_partial_is_untouched(tmp_path: Path, as_link: bool) -> None:
    out = tmp_path / "exports" / "model"
    out.parent.mkdir()
    planted = Planted(out, tmp_path / "elsewhere", as_link)
    _export(out, tmp_path / "run", overwrite=False)
    planted.unchanged(out)
    _export(out, tmp_path / "run", overwrite=True)  # replacing it
    assert (out / "config.json").read_text() == '{"new": true}\n'
    planted.unchanged(out)


def test_a_replaced_directory_keeps_its_permission_bits(tmp_path: Path) -> None:
    out = tmp_path / "model"
    _export(out, tmp_path / "run", overwrite=False)
    out.chmod(0o700)
    _export(out, tmp_path / "run", overwrite=True)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_dangling_link_is_one_error_before_anything(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="is a symbolic link") as refused:
        check_output(out, overwrite=True, run_dir=tmp_path / "run")
    assert refused.value.fix == "give a new directory path (--output DIR)."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
