"""Activation checkpointing: the policies applied to a model's block list, the selective op
policy, the plan's estimates, and measurement of saved bytes and FLOPs."""
