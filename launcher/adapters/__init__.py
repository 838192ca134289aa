"""Adapters (LoRA through peft) on a frozen base model: which layers, applied how, the base's
identity, and the files peft reads. Below models/ in the package order: it knows nn.Modules and
the config, nothing of engines or checkpoints."""
