"""Training-state checkpoints: on-disk layout and discovery, resume rules, collective save and
load, and the restricted DCP readers."""
