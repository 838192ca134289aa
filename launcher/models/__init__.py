"""Models. They know nothing of distribution: engines and recompute policies wrap them."""

from launcher.models.blocks import BlockList, find_blocks, require_blocks
from launcher.models.build import build_model
from launcher.models.gpt import GPT

__all__ = ["GPT", "BlockList", "build_model", "find_blocks", "require_blocks"]
