"""Tokenizing data=hf into its cache with several processes, resumably (issue 32): 1 and 2
processes write byte-identical caches; a preparation killed with kill -9 is resumed by the next
from its progress record, into the same bytes; leftovers are removed only when ours and dead."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.config.data import DataConfig, DataKind
from launcher.data import prepare_cache
from launcher.data.hf import prepare
from launcher.data.partial import OWNER_FILE, this_process
from launcher.errors import ConfigError, DataError
from launcher.logs import get_logger
from tests.data_sources import train_tokenizer, write_pairs, write_texts
from tests.installed import require

require("datasets", "tokenizers")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prep")
    return {
        "tok": train_tokenizer(root / "tok"),
        "texts": uneven(write_texts(root / "texts.jsonl", 4500)),
        "pairs": write_pairs(root / "pairs.jsonl", 2500, seed=1),
    }


def uneven(path: Path) -> Path:
    """The first 1,000 documents (the first range) 30 times longer: with two processes it ends
    last, so a cache written in order of completion would differ from one written in order."""
    lines = path.read_text().splitlines()
    for i in range(1000):
        lines[i] = json.dumps({"text": " ".join([json.loads(lines[i])["text"]] * 30)})
    path.write_text("\n".join(lines) + "\n")
    return path


def cfg_for(files: dict[str, Path], cache: Path, kind: str = "texts", **kw: object) -> DataConfig:
    tuning = {"prompt_field": "prompt", "completion_field": "completion"} if kind == "pairs" else {}
    base = {"path": str(files[kind]), "tokenizer": str(files["tok"]), "cache_dir": str(cache)}
    return DataConfig(name=DataKind.hf, **{**base, **tuning, **kw})  # type: ignore[arg-type]


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def said() -> list[str]:
    handler, log = Lines(), get_logger("data")
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    yield handler.lines
    log.removeHandler(handler)
    log.setLevel(level)


OneWorker = Callable[[str], tuple[Path, list[str]]]


@pytest.fixture(scope="module")
def one_worker(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> OneWorker:
    """Each kind's cache built once by one process, with the lines it said (a line after every
    range): what the two-process build and a resumed one are compared with."""
    built: dict[str, tuple[Path, list[str]]] = {}

    def build(kind: str) -> tuple[Path, list[str]]:
        if kind not in built:
            handler, log = Lines(), get_logger("data")
            log.addHandler(handler)
            level, log.level = log.level, logging.INFO
            try:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(prepare_cache, "PROGRESS_EVERY", 0.0)
                    cfg = cfg_for(files, tmp_path_factory.mktemp(kind), kind, tokenize_workers=1)
                    cache, fresh = prepare("data.path", str(files[kind]), cfg)
            finally:
                log.removeHandler(handler)
                log.setLevel(level)
            assert fresh
            built[kind] = cache, handler.lines
        return built[kind]

    return build


@pytest.mark.parametrize("kind", ["texts", "pairs"])
def test_one_and_two_processes_write_the_same_bytes(
    files: dict[str, Path],
    one_worker: OneWorker,
    tmp_path: Path,
    kind: str,
    said: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one, said_by_one = one_worker(kind)
    said.clear()  # the two-process build's lines from here
    monkeypatch.setattr(prepare_cache, "PROGRESS_EVERY", 0.0)  # a line after every range
    two, built = prepare(
        "data.path", str(files[kind]), cfg_for(files, tmp_path / "b", kind, tokenize_workers=2)
    )
    assert built and one.name == two.name  # the number of processes is not part of the key
    assert any("with 2 process(es)" in line for line in said)
    progress = [
        line
        for line in [*said_by_one, *said]
        if line.startswith(f"tokenizing {files[kind].name}: ")
    ]
    total = 4500 if kind == "texts" else 2500
    assert len(progress) == 2 * (-(-total // 1000))  # every range, for each of the two builds
    assert (
        f"({total:,} of {total:,} records)" in progress[-1] and "tokens/s, eta 0s" in progress[-1]
    )
    expected = {"meta.json", "tokens.bin", "offsets.npy"} | (
        {"mask.bin"} if kind == "pairs" else set()
    )
    assert set(contents(one)) == expected
    assert contents(one) == contents(two)
    meta = json.loads((one / "meta.json").read_text())
    assert meta["records"] == (4500 if kind == "texts" else 2500)
    assert list(meta) == ["format", "tokens", "records", "max_id", "eos_id", "vocab_size", "tuning"]
    assert [p.name for p in (tmp_path / "b").iterdir() if ".tmp-" in p.name] == []


KILLED = """
import json, multiprocessing, os, signal, sys
from pathlib import Path
from launcher.config.data import DataConfig
from launcher.data import prepare_cache
from launcher.data import prepare_cache
from launcher.data.hf import prepare

cfg = DataConfig(**json.loads(sys.argv[1]))
original, count = prepare_cache.Writer.append, [0]

def append(self, part):
    original(self, part)
    count[0] += 1
    if count[0] == 2:
        self.checkpoint()  # 2,000 records recorded as written
    if count[0] == 3:  # a third range written past the record, then killed
        for f in self.files.values():
            f.flush()
        pids = [p.pid for p in multiprocessing.active_children()]
        Path(sys.argv[2]).write_text(json.dumps(pids))
        os.kill(os.getpid(), signal.SIGKILL)

prepare_cache.Writer.append = append
prepare("data.path", cfg.path, cfg)
"""


def test_a_killed_preparation_is_resumed_into_the_same_bytes(
    files: dict[str, Path], one_worker: OneWorker, tmp_path: Path, said: list[str]
) -> None:
    cache = tmp_path / "cache"
    cfg = cfg_for(files, cache, "pairs", tokenize_workers=2)
    fields = {k: getattr(cfg, k) for k in ("path", "tokenizer", "cache_dir", "prompt_field")}
    fields |= {"name": "hf", "completion_field": "completion", "tokenize_workers": 2}
    pids = tmp_path / "pids.json"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, json.dumps(fields), str(pids)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    (partial,) = [p for p in cache.iterdir() if ".tmp-" in p.name]
    assert not [
        p for p in cache.iterdir() if p.is_dir() and ".tmp-" not in p.name and p.name != "hf"
    ]
    assert json.loads((partial / "progress.json").read_text())["records"] == 2000
    assert (partial / "ends.bin").stat().st_size == 2500 * 8  # more than recorded
    workers = json.loads(pids.read_text())
    assert len(workers) == 2
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)  # no orphan left
    resumed, built = prepare("data.path", str(files["pairs"]), cfg)
    assert built and any("resuming the preparation" in line and "2,000" in line for line in said)
    assert [p for p in cache.iterdir() if ".tmp-" in p.name] == []
    clean, _ = one_worker("pairs")
    assert contents(resumed) == contents(clean)


def test_leftovers_removed_only_when_ours_and_dead(
    files: dict[str, Path], tmp_path: Path, said: list[str]
) -> None:
    cache = tmp_path / "cache"
    cfg = cfg_for(files, cache, tokenize_workers=1)
    final, _ = prepare("data.path", str(files["texts"]), cfg)
    import shutil

    shutil.rmtree(final)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(dead.stdout)
    ours_dead = cache / f"{final.name}.tmp-{gone}-aa"
    unmarked = cache / f"{final.name}.tmp-7-bb"
    elsewhere = cache / f"{final.name}.tmp-{gone}-cc"
    for d in (ours_dead, unmarked, elsewhere):
        d.mkdir()
        (d / "tokens.bin").write_bytes(b"x")
    (ours_dead / OWNER_FILE).write_text(json.dumps({**this_process(), "pid": gone}))
    (elsewhere / OWNER_FILE).write_text(
        json.dumps({**this_process(), "pid": gone, "host": "other"})
    )
    again, built = prepare("data.path", str(files["texts"]), cfg)
    assert built and again == final
    assert not ours_dead.exists() and unmarked.exists() and elsewhere.exists()
    assert any(str(unmarked) in line and "rm -r" in line for line in said)


def test_bad_records_and_bad_settings(files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = files["texts"].read_text().splitlines()[:2500]
    lines[2222] = json.dumps({"text": 5})
    bad.write_text("\n".join(lines) + "\n")
    cache = tmp_path / "cache"
    cfg = cfg_for({**files, "texts": bad}, cache, tokenize_workers=2)
    with pytest.raises(DataError, match=r"data.text_field: record 2222 of .*bad.jsonl has text=5"):
        prepare("data.path", str(bad), cfg)
    assert [p for p in cache.iterdir() if ".tmp-" in p.name] == []
    with pytest.raises(ConfigError, match=r"data.tokenize_workers: must be 1 or more, got 0"):
        cfg_for(files, cache, tokenize_workers=0)


def test_a_link_planted_in_a_dead_partial_is_never_written_through(
    files: dict[str, Path], tmp_path: Path, said: list[str]
) -> None:
    # was: adopted, tokens.bin truncated to the progress record through the link and appended
    # to (a root launch writing into any file), and the finished cache held the link
    cache = tmp_path / "cache"
    cfg = cfg_for(files, cache, tokenize_workers=1)
    final = prepare("data.path", str(files["texts"]), cfg)[0]
    import shutil

    shutil.rmtree(final)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data that must survive\n")
    planted = cache / f"{final.name}.tmp-99999999-aa"  # past pid_max: a dead process
    planted.mkdir()
    (planted / OWNER_FILE).write_text(json.dumps({**this_process(), "pid": 99999999}))
    (planted / "progress.json").write_text(json.dumps({"records": 1, "tokens": 2, "top": 1}))
    (planted / "ends.bin").write_bytes((2).to_bytes(8, "little"))
    (planted / "tokens.bin").symlink_to(victim)
    again, built = prepare("data.path", str(files["texts"]), cfg)
    assert built and again == final and not (final / "tokens.bin").is_symlink()
    assert victim.read_text() == "precious data that must survive\n"
    assert any(str(planted) in line and "rm -r" in line for line in said)
    with pytest.raises(ConfigError, match="symbolic link"):  # the writer itself never follows
        prepare_cache.Writer(planted, tuning=False)
    assert victim.read_text() == "precious data that must survive\n"
