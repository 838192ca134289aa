"""sweep_summary.png: tokens/s and activation memory per split; the loss curves overlaid, and how
far each one is from its reference (the self-check, on a log scale)."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no global state, no display needed (Agg)
from matplotlib.ticker import MaxNLocator

from launcher.sweep.compare import Verdict
from launcher.sweep.points import Point

if TYPE_CHECKING:
    from launcher.sweep.summary import SweepSummary

MIB = 2**20
FLOOR = 1e-9
"""Relative differences below this (identical curves) are drawn at it: log scale."""


def _tick_labels(summary: SweepSummary) -> list[str]:
    labels = []
    for row in summary.rows:
        text = row["label"]
        if row["status"] != "ok":
            text += f" ({row['status']})"
        labels.append(text)
    return labels


def _bars(ax: Axes, values: list[list[float | None]], names: list[str], ticks: list[str]) -> bool:
    """Grouped bars, one group per point; a missing value leaves a gap. False when all are
    missing."""
    width = 0.8 / len(values)
    drawn = False
    for i, (series, name) in enumerate(zip(values, names, strict=True)):
        xs = [x + (i - (len(values) - 1) / 2) * width for x in range(len(series))]
        present = [(x, v) for x, v in zip(xs, series, strict=True) if v is not None]
        if present:
            ax.bar([x for x, _ in present], [v for _, v in present], width, label=name)
            drawn = True
    ax.set_xticks(range(len(ticks)))
    ax.set_xticklabels(ticks, fontsize=7, rotation=30, ha="right", rotation_mode="anchor")
    return drawn


def _column(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float | None]:
    return [None if r[key] is None else float(r[key]) / scale for r in rows]


def _say(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _speed_and_memory(summary: SweepSummary, speed: Axes, memory: Axes) -> None:
    rows, ticks = summary.rows, _tick_labels(summary)
    if not _bars(speed, [_column(rows, "tokens_per_s")], ["tokens/s"], ticks):
        _say(speed, "no timed steps yet")
    speed.set_title("throughput (median step, the first left out)", fontsize=10)
    speed.set_ylabel("tokens / s")
    series = [_column(rows, "activation_bytes", MIB), _column(rows, "activation_peak_bytes", MIB)]
    if _bars(memory, series, ["saved for backward", "peak in forward + backward"], ticks):
        memory.legend(fontsize=7)
    else:
        _say(memory, "not reported by these runs")
    memory.set_title("activation memory of one micro-batch", fontsize=10)
    memory.set_ylabel("MiB")


def _curves(summary: SweepSummary, loss: Axes, diff: Axes) -> None:
    by_name = {p.name: p for p in summary.points}
    drawn = [
        (p, c, r)
        for p, c, r in zip(summary.points, summary.comparisons, summary.rows, strict=True)
        if p.losses
    ]
    for i, (point, comparison, row) in enumerate(drawn):
        differs = comparison.verdict == Verdict.differs
        style: dict[str, Any] = {
            "linestyle": "--" if differs else "-",
            # Thinner lines on top, so curves that coincide stay visible underneath.
            "linewidth": max(0.8, 3.0 - 2.2 * i / max(1, len(drawn) - 1)),
            "label": row["label"] + (" (DIFFERS)" if differs else ""),
        }
        steps = sorted(point.losses)
        line = loss.plot(steps, [point.losses[s] for s in steps], **style)[0]
        reference = by_name.get(comparison.reference or "")
        if reference is not None and reference is not point:
            _relative(diff, point, reference, color=line.get_color(), **style)
    loss.set_title("loss per optimizer step, overlaid", fontsize=10)
    loss.set_xlabel("step")
    loss.set_ylabel("loss (global token mean)")
    if drawn:
        loss.legend(fontsize=7)
    check = summary.check
    diff.axhline(check.tolerance, color="black", linewidth=0.8, linestyle=":")
    if check.steps:
        diff.axvspan(0.5, check.steps + 0.5, color="0.9", zorder=0, label="steps judged")
    diff.set_yscale("log")
    diff.set_title(
        f"relative difference to the reference (dotted: {check.tolerance:g})", fontsize=10
    )
    diff.set_xlabel("step")
    diff.set_ylabel("|loss - reference| / reference")
    for ax in (loss, diff):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _relative(ax: Axes, point: Point, reference: Point, **style: Any) -> None:
    ref = reference.losses
    steps = sorted(set(point.losses) & set(ref))
    rel = [max(FLOOR, abs(point.losses[s] - ref[s]) / max(abs(ref[s]), 1e-12)) for s in steps]
    ax.plot(steps, rel, **style)


def plot_summary(summary: SweepSummary, out: IO[bytes]) -> None:
    """The figure as PNG into `out`."""
    fig = Figure(figsize=(12.0, 8.0), dpi=80, layout="constrained")
    (speed, memory), (loss, diff) = fig.subplots(2, 2)
    _speed_and_memory(summary, speed, memory)
    _curves(summary, loss, diff)
    fig.suptitle(summary.headline(), fontsize=9)
    fig.savefig(out, format="png")
