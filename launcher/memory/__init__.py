"""The memory plan: per-rank peak by part, measured activations, the budget, the automatic split,
and the measured peak of a run's first steps (docs/memory.md)."""
