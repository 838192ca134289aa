"""The SLURM tests' `sinfo` probe: once per session, with a short timeout (issue 17, item 6).

Without a controller, sinfo retries for about 9 s before it fails; the probe ran three times per
suite (about 27 s of skips). A fake sinfo that hangs like that must cost one short timeout, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm import conftest as slurm


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    slurm.cluster_probe.cache_clear()
    yield
    slurm.cluster_probe.cache_clear()  # the real probe runs again for the SLURM tests


def fake_sinfo(bin_dir: Path, body: str) -> Path:
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    script = bin_dir / "sinfo"
    script.write_text(f'#!/bin/sh\necho call >> "{calls}"\n{body}\n')
    script.chmod(0o755)
    return calls


def test_a_hanging_sinfo_is_probed_once_with_a_short_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_probe: None
) -> None:
    calls = fake_sinfo(tmp_path / "bin", "exec sleep 9")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert [slurm.cluster_nodes() for _ in range(3)] == [0, 0, 0]
    assert calls.read_text().count("call") == 1  # cached for the session
    # The probe's timeout ended the wait, not sinfo (which would answer "no node up" after 9 s).
    assert "did not answer within 3 s" in slurm.cluster_probe()[1]


def test_no_config_file_means_no_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_probe: None
) -> None:
    calls = fake_sinfo(tmp_path / "bin", "exit 1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    nodes, why = slurm.cluster_probe()
    assert nodes == 0 and "missing.conf" in why
    assert not calls.exists()


def test_nodes_that_answer_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_probe: None
) -> None:
    fake_sinfo(tmp_path / "bin", "printf 'n1 idle\\nn2 mixed\\nn3 down\\n'")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert slurm.cluster_probe() == (2, "")


@pytest.mark.parametrize(("ci", "outcome"), [("true", "failed"), ("", "skipped"), ("0", "skipped")])
def test_no_cluster_fails_in_ci_and_skips_elsewhere(
    ci: str, outcome: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_probe: None
) -> None:
    """Issue 25: a CI run without SLURM coverage must not be green."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    monkeypatch.setenv("CI", ci)
    outcomes = {"failed": pytest.fail.Exception, "skipped": pytest.skip.Exception}
    with pytest.raises(outcomes[outcome]) as info:
        slurm.require_nodes(1)
    assert "missing.conf" in str(info.value) and "start.sh" in str(info.value)
