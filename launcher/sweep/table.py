"""The summary as sweep_summary.csv (raw numbers) and sweep_summary.md (for people)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from launcher.sweep.job import sweep_name

if TYPE_CHECKING:
    from launcher.sweep.summary import SweepSummary

NOTE_WIDTH = 100


def write_csv(rows: list[dict[str, Any]], columns: Sequence[str], out: IO[str]) -> None:
    """The table into `out` (opened with newline="")."""
    writer = csv.DictWriter(out, fieldnames=list(columns))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


def _mib(n: Any) -> str:
    return "" if n is None else f"{n / 2**20:,.1f} MiB"


def _num(x: Any, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _cell(text: Any, width: int | None = None) -> str:
    text = "" if text is None else " ".join(str(text).split()).replace("|", "\\|")
    if width is not None and len(text) > width:
        text = text[: width - 3] + "..."
    return text


MD_COLUMNS = (
    ("point", lambda r: f"{r['point']}"),
    ("label", lambda r: r["label"]),
    ("status", lambda r: r["status"]),
    (
        "dp x accum x micro",
        lambda r: (
            "" if r["grad_accum"] is None else f"{r['dp']} x {r['grad_accum']} x {r['micro_size']}"
        ),
    ),
    ("ac", lambda r: r["ac"]),
    ("engine", lambda r: r["engine"]),
    ("tokens/s", lambda r: _num(r["tokens_per_s"], ",.0f")),
    ("peak memory", lambda r: _mib(r["peak_memory_bytes"])),
    ("activations saved", lambda r: _mib(r["activation_bytes"])),
    ("activation peak", lambda r: _mib(r["activation_peak_bytes"])),
    ("final loss", lambda r: _num(r["final_loss"], ".6f")),
    ("reference", lambda r: r["reference"]),
    ("max rel. loss diff", lambda r: _num(r["max_rel_loss_diff"], ".1e")),
    ("check", lambda r: f"**{r['check']}**" if r["check"] == "DIFFERS" else r["check"]),
    ("note", lambda r: _cell(r["note"], NOTE_WIDTH)),
)


def _window(steps: int) -> str:
    return f"the first {steps} steps both logged" if steps else "every step both logged"


def _gaps(gaps: list[float | None]) -> str:
    return " ".join("-" if g is None else f"{g:.1e}" for g in gaps)


def _certificates(rows: list[dict[str, Any]]) -> list[str]:
    """`launch verify -m`: one certificate row per point (each point's verify.json)."""
    rows = [row for row in rows if row.get("verify")]
    if not rows:
        return []
    lines = [
        "",
        "## Certificates (`launch verify`)",
        "",
        "| point | label | dp x accum x micro | engine | ac | loss gap per step | worst parameter "
        "| gap | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        split = (
            "" if r["grad_accum"] is None else f"{r['dp']} x {r['grad_accum']} x {r['micro_size']}"
        )
        cells = [
            r["point"],
            r["label"],
            split,
            r["engine"],
            r["ac"],
            _gaps(r.get("verify_loss_gaps") or []),
            r["verify_worst_parameter"],
            _num(r["verify_worst_gap"], ".1e"),
            f"**{r['verify']}**" if r["verify"] != "certified" else r["verify"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def render_markdown(summary: SweepSummary) -> str:
    lines = [
        f"# Sweep summary: {sweep_name(summary.sweep_dir)}",
        "",
        f"{summary.headline()}.",
        "",
        "Each loss curve is compared with the first point that trains the same problem (global "
        "batch, seed, model, data, optimizer, steps, precision) over "
        f"{_window(summary.check.steps)}; `DIFFERS` marks a largest relative "
        f"difference above {summary.check.tolerance:g}: a split that trained a different model "
        "(`max_rel_loss_diff_all_steps` in the CSV shows how far fp32 rounding drifts later). "
        "tokens/s: mean tokens per step over the median step time, the first (warm-up) step "
        "left out. "
        "Empty cells: not reported by the run.",
        "",
        "| " + " | ".join(name for name, _ in MD_COLUMNS) + " |",
        "|" + "|".join("---" for _ in MD_COLUMNS) + "|",
    ]
    for row in summary.rows:
        lines.append("| " + " | ".join(_cell(cell(row)) for _, cell in MD_COLUMNS) + " |")
    lines += _certificates(summary.rows)
    failed = [row for row in summary.rows if row["status"] == "failed"]
    if failed:
        lines += ["", "## Failed points", ""]
        for row in failed:
            lines.append(f"- `{row['point']}` ({row['label']}): {_cell(row['note'])}")
    lines += ["", f"Points: {summary.sweep_dir}", ""]
    return "\n".join(lines)
