"""What FSDP shards by, shared by its plan-time spec and its runtime engine (a module of its own so
that neither imports the other back)."""

NEEDS_BLOCKS = "engine=fsdp (one shard unit per block)"
"""How the refusal of a model without repeated blocks names the engine."""
