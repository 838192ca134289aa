"""The launches each test module started, from the file LAUNCHER_TESTS_LAUNCH_LOG names
(tests/helpers.py appends a line per launch): `python -m tests.launch_counts LOG`.

Per module: launches in all, how many ran in the test process, as a subprocess or in the
background, the ranks they started (a dp=2 train counts 2) and the seconds of those that were
waited for. Counts, unlike seconds, do not depend on how busy the machine was.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def counts(lines: list[str]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        module = record["test"].split("::", 1)[0] or "?"
        row = table[module]
        row["launches"] += 1
        row[record["how"]] += 1
        if record["command"] in ("train", "verify"):
            row["ranks"] += record["ranks"]
        row["seconds"] += record["seconds"] or 0.0
    return table


def main(argv: list[str]) -> int:
    table = counts(Path(argv[0]).read_text().splitlines())
    columns = ("launches", "in-process", "subprocess", "background", "ranks", "seconds")
    print(f"{'module':48} " + " ".join(f"{c:>10}" for c in columns))
    for module, row in sorted(table.items()):
        cells = " ".join(f"{row.get(c, 0):>10.0f}" for c in columns)
        print(f"{module:48} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
