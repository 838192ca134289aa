"""Models. They know nothing of distribution: engines and recompute policies wrap them."""

from launcher.models.gpt import GPT

__all__ = ["GPT"]
