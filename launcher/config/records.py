"""How records become sequences (data=hf): the targets of a conversation (data.train_on) and the
packing of records into windows (data.packing), as DataConfig reads them."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from launcher.errors import ConfigError


class TrainOn(str, Enum):
    assistant = "assistant"
    all = "all"


CONCAT = "concat"
"""data.packing=concat: records concatenated and cut into windows."""
if TYPE_CHECKING:
    Packing = bool | str
else:  # OmegaConf 2.3 has no unions: an open node, checked in DataConfig.__post_init__
    Packing = Any


def packing_value(value: Any) -> bool | str:
    """data.packing as False, True or "concat" (the command line may give a string)."""
    text = str(value).strip().lower()
    if isinstance(value, bool) or text in ("true", "false"):
        return text == "true"
    if text == CONCAT:
        return CONCAT
    raise ConfigError(
        "data.packing",
        f"unknown value {value!r}.",
        "use data.packing=false (one record per sequence), true (whole records packed, each "
        "with its own attention) or concat (concatenated and cut).",
    )
