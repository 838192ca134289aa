"""Any map-style dataset, built by `data._target_` (Hydra's convention) with data.args.

Each item is a mapping with "input_ids" and "labels" (tensors, arrays or lists of ints). The
labels are aligned with the model's output positions: labels[t] is the target of the logits at
position t (already shifted for a language model), -100 where nothing is to be predicted; a
classifier's item may carry one label (a scalar).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from launcher.data.sequence import Sample
from launcher.errors import DataError
from launcher.user_code import locate

KEY = "data._target_"


def _tensor(item: Mapping[str, Any], name: str, index: int, target: str) -> torch.Tensor:
    try:
        value = torch.as_tensor(item[name])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataError(
            f"{KEY}: item {index} of {target}: {name!r} is not a tensor of ints ({exc}). "
            "Fix: return a tensor, array or list of token ids."
        ) from None
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise DataError(
            f"{KEY}: item {index} of {target}: {name!r} has dtype {value.dtype}, not integers. "
            "Fix: return token ids as integers (torch.long)."
        )
    return value.long()


class CustomDataset:
    """Wraps the user's dataset: its items become Samples; every item is checked when read."""

    def __init__(self, target: str, args: Mapping[str, Any]) -> None:
        from hydra.utils import instantiate

        self.target = target
        locate(target, KEY)  # from the working directory, as model._target_; else where to run
        try:
            self.base = instantiate({"_target_": target, **args})
        except Exception as exc:  # bad arguments, or the user's own code failing: theirs to fix
            cause = exc.__cause__ or exc
            first = str(cause).splitlines()[0] if str(cause) else ""
            raise DataError(
                f"{KEY}: building {target}({', '.join(args)}) failed ({type(cause).__name__}: "
                f"{first}). Fix: pass the arguments it takes as +data.args.NAME=VALUE (and only "
                "those), or fix the error in your function."
            ) from None
        for method in ("__len__", "__getitem__"):
            if not hasattr(self.base, method):
                raise DataError(
                    f"{KEY}: {target} returned {type(self.base).__name__}, not a map-style "
                    f"dataset (no {method}). Fix: return an object with __len__ and __getitem__."
                )
        if len(self.base) == 0:
            raise DataError(f"{KEY}: {target} returned an empty dataset. Fix: give it samples.")
        self[0]  # check the first item now, before any rank trains

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Sample:
        item = self.base[index]
        if not isinstance(item, Mapping) or not {"input_ids", "labels"} <= set(item):
            got = sorted(item) if isinstance(item, Mapping) else type(item).__name__
            raise DataError(
                f"{KEY}: item {index} of {self.target} is {got}, not a mapping with "
                '"input_ids" and "labels". Fix: return {"input_ids": ids, "labels": targets}.'
            )
        inputs = _tensor(item, "input_ids", index, self.target)
        labels = _tensor(item, "labels", index, self.target)
        if inputs.dim() != 1 or labels.dim() > 1:
            raise DataError(
                f"{KEY}: item {index} of {self.target}: input_ids has shape "
                f"{tuple(inputs.shape)}, labels {tuple(labels.shape)}. Fix: one sequence per "
                "item (input_ids [seq]; labels [seq], or [] for one label per sample)."
            )
        return Sample(inputs, labels)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []
