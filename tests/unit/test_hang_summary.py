"""summary.json of a job the hang watchdog ended: the step, the status, and the hang's record that
names the rank, also when this node's ranks only waited for a peer on another node, or failed
because another node's watchdog killed that peer before this node's own watchdog fired."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.events import record_event
from launcher.exit_codes import HUNG
from launcher.tracking.run_end import peer_named_hang, write_hung_summary


def test_the_record_that_names_the_rank_is_the_summarys(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3)) + '{"step": 4, '
    )  # the last line cut short by the kill
    old = record_event(tmp_path, "hang", ranks=[3], hosts=["n1"])  # an earlier attempt's
    old_time = old["time"]
    lines = (tmp_path / "events.jsonl").read_text().replace(str(old_time), str(old_time - 3600))
    (tmp_path / "events.jsonl").write_text(lines)
    waited = record_event(tmp_path, "hang", ranks=[], hosts=[])  # this node: all waited
    named = record_event(tmp_path, "hang", ranks=[1], hosts=["n2"], stopped=[1])

    values = write_hung_summary(tmp_path, waited, HUNG)
    assert values == json.loads((tmp_path / "summary.json").read_text())
    assert (values["status"], values["exit_status"], values["steps"]) == ("hung", HUNG, 3)
    assert values["hang"] == named and len(values["events"]) == 3


def test_a_record_that_names_the_rank_is_kept(tmp_path: Path) -> None:
    own = record_event(tmp_path, "hang", ranks=[0], hosts=["n1"], stopped=[0])
    assert write_hung_summary(tmp_path, own, HUNG)["hang"] == own


def test_the_contracts_keys_are_there_unmeasured(tmp_path: Path) -> None:
    values = write_hung_summary(tmp_path, record_event(tmp_path, "hang", ranks=[0]), HUNG)
    for key in ("final_loss", "tokens_per_s", "world_size", "grad_accum", "peak_memory_bytes"):
        assert key in values and values[key] is None
    assert values["steps"] == 0  # nothing logged


def test_ranks_that_lost_a_peer_another_node_killed_for_hanging_are_in_that_hang(
    tmp_path: Path,
) -> None:
    named = record_event(tmp_path, "hang", ranks=[1], hosts=["n2"], hang_timeout=4, report="r")
    failed_at = int(named["time"])  # torchrun's whole seconds: may be before the record
    [mine] = peer_named_hang(tmp_path, failed_at)
    assert (mine["ranks"], mine["hang_timeout"], mine["report"]) == ([], 4, "r")
    assert write_hung_summary(tmp_path, mine, HUNG)["hang"] == named


def test_a_failure_long_after_or_before_a_hang_is_no_part_of_it(tmp_path: Path) -> None:
    named = record_event(tmp_path, "hang", ranks=[1], hosts=["n2"], hang_timeout=4, report="r")
    assert peer_named_hang(tmp_path, named["time"] + 3600) == []
    assert peer_named_hang(tmp_path, named["time"] - 30) == []  # failed before the hang was seen
    assert peer_named_hang(tmp_path / "none", named["time"]) == []
