"""The sweep summary files (sweep_summary.csv, .md, .png in the sweep directory the user names)
follow launcher/userpath's rule: nothing planted beside them is touched, a file's permission
bits are kept, a link is written through, and a name that cannot be written is one error before
any of the three is written."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from launcher.sweep.command import summary_main
from tests.planted import Planted
from tests.unit.test_sweep_summary import make_point, split

NAMES = ("sweep_summary.csv", "sweep_summary.md", "sweep_summary.png")


def _sweep(root: Path) -> Path:
    sweep = root / "sweep"
    make_point(sweep, "0", settings=split(16, 1))
    make_point(sweep, "1", settings=split(16, 2))
    return sweep


@pytest.mark.parametrize("as_link", [False, True], ids=["partial-file", "partial-link"])
def test_planted_partials_are_untouched(tmp_path: Path, as_link: bool) -> None:
    sweep = _sweep(tmp_path)
    outputs = [sweep / name for name in NAMES]
    planted = Planted(outputs, tmp_path / "elsewhere", as_link)
    assert summary_main([str(sweep)]) == 0
    assert all(path.is_file() for path in outputs)
    planted.unchanged(*outputs)
    assert summary_main([str(sweep)]) == 0  # replacing them
    planted.unchanged(*outputs)


def test_permission_bits_are_kept_and_a_link_is_written_through(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    (sweep / "sweep_summary.md").write_text("old\n")
    (sweep / "sweep_summary.md").chmod(0o600)
    plots = tmp_path / "plots"
    plots.mkdir()
    (sweep / "sweep_summary.png").symlink_to(plots / "latest.png")
    (plots / "latest.png").write_bytes(b"old")
    assert summary_main([str(sweep)]) == 0
    assert stat.S_IMODE((sweep / "sweep_summary.md").stat().st_mode) == 0o600
    assert (sweep / "sweep_summary.md").read_text().startswith("# Sweep summary")
    assert (sweep / "sweep_summary.png").is_symlink()
    assert (plots / "latest.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in plots.iterdir()] == ["latest.png"]


def test_a_name_taken_by_a_directory_is_one_error_before_any_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    sweep = _sweep(tmp_path)
    (sweep / "sweep_summary.png").mkdir()
    capfd.readouterr()
    assert summary_main([str(sweep)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"SWEEP_DIR: {sweep}/sweep_summary.png is a directory" in err[0]
    assert not (sweep / "sweep_summary.csv").exists() and not (sweep / "sweep_summary.md").exists()
    assert "Traceback" not in "".join(err)
