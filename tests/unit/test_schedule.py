"""The suite's module order (tests/schedule.py): SLURM's waits spread among the end-to-end
modules, then the multi-process modules, then the unit tests; each module whole."""

from __future__ import annotations

from tests.schedule import module_order, reorder


def test_slurm_modules_are_spread_among_the_end_to_end_ones() -> None:
    e2e = [f"tests/e2e/test_{i}.py" for i in range(6)]
    slurm = ["tests/slurm/test_a.py", "tests/slurm/test_b.py"]
    tail = ["tests/multiproc/test_m.py", "tests/unit/test_u.py"]
    order = module_order([*e2e, *tail, *slurm])
    assert order[0] == e2e[0] and order[-2:] == tail
    assert [m for m in order if "/e2e/" in m] == e2e
    positions = [order.index(m) for m in slurm]
    assert positions[0] == 1 and positions[1] - positions[0] > 2  # not side by side


def test_items_keep_their_module_together_and_their_order_within_it() -> None:
    items = ["tests/unit/u.py::a", "tests/e2e/e.py::b", "tests/unit/u.py::c", "tests/e2e/e.py::d"]
    ordered = reorder(items, lambda item: item.split("::")[0])
    assert ordered == [
        "tests/e2e/e.py::b",
        "tests/e2e/e.py::d",
        "tests/unit/u.py::a",
        "tests/unit/u.py::c",
    ]
