"""A model's own tensor-parallel plan (model.tp_plan: module-name patterns -> colwise, rowwise or
colwise_rep), resolved on the built model: which layers it splits and how, checked before any rank
starts (the plan builds the model on the meta device), and each parameter's share on one rank
for the memory plan. launcher/parallel/user_plan.py applies the same resolution on the ranks."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from torch import nn

from launcher.config.suggest import did_you_mean, suggestions
from launcher.errors import ConfigError

KEY = "model.tp_plan"
SPLITTABLE = (nn.Linear, nn.Embedding)
"""What torch's ColwiseParallel and RowwiseParallel split."""


@dataclass(frozen=True)
class Planned:
    """One layer of the plan: its name, the module and its style."""

    name: str
    module: nn.Module
    style: str


@dataclass(frozen=True)
class TpShare:
    """One tensor-parallel rank's share of the parameters under a module plan: what the memory
    plan counts instead of the whole model."""

    sizes: tuple[int, ...]
    """Elements of each parameter on one rank, in model.parameters() order."""
    block: int
    """Elements of the first repeated block on one rank (0: no blocks)."""


def matches(name: str, pattern: str) -> bool:
    """parallelize_module's rule: the same number of dotted parts, each matching (fnmatch)."""
    parts, atoms = name.split("."), pattern.split(".")
    return len(parts) == len(atoms) and all(map(fnmatchcase, parts, atoms))


def layer_patterns(model: nn.Module) -> list[str]:
    """The model's splittable layers, a block index written as * (what a plan can name)."""
    found: dict[str, None] = {}
    for name, module in model.named_modules():
        if name and isinstance(module, SPLITTABLE):
            found[".".join("*" if p.isdigit() else p for p in name.split("."))] = None
    return list(found)


def resolve(model: nn.Module, plan: dict[str, str]) -> list[Planned]:
    """Every layer the plan names, in the model's order; a ConfigError for a pattern that names
    none, a layer named twice, or one that is not an nn.Linear or nn.Embedding."""
    modules = {name: m for name, m in model.named_modules() if name}
    chosen: dict[str, str] = {}
    for pattern, style in plan.items():
        names = [name for name in modules if matches(name, pattern)]
        if not names:
            layers = layer_patterns(model)
            near = did_you_mean(suggestions(pattern, layers))
            raise ConfigError(
                KEY,
                f"{pattern!r} matches no module of {type(model).__name__}."
                + (f" {near.strip()}" if near else ""),
                "name its layers as the model does (a pattern per dotted part, * for a block "
                f"index): {', '.join(layers[:12]) or '(no nn.Linear or nn.Embedding)'}.",
            )
        for name in names:
            if name in chosen:
                raise ConfigError(
                    KEY,
                    f"{name} is matched by two patterns ({chosen[name]} and {pattern}).",
                    f"keep one of them in {KEY}.",
                )
            chosen[name] = pattern
            if not isinstance(modules[name], SPLITTABLE):
                raise ConfigError(
                    KEY,
                    f"{pattern} matches {name}, a {type(modules[name]).__name__}: {style} "
                    "splits nn.Linear and nn.Embedding layers only (norms stay whole).",
                    f"remove {pattern} from {KEY} (it stays whole on every rank); the layers "
                    f"a plan splits: {', '.join(layer_patterns(model)[:12])}.",
                )
    return [Planned(name, modules[name], plan[chosen[name]]) for name in modules if name in chosen]


def split_dim(planned: Planned, parameter: str) -> int | None:
    """The dimension of the layer's parameter that the style splits over the ranks (None: the
    parameter stays whole on every rank)."""
    colwise = planned.style in ("colwise", "colwise_rep")
    if isinstance(planned.module, nn.Embedding):  # weight [vocab, width]
        return 1 if colwise else 0
    if parameter == "bias":
        return 0 if colwise else None  # a rowwise bias is added once, after the sum
    return 0 if colwise else 1  # weight [out, in]


def split_sizes(planned: Planned) -> dict[str, int]:
    """What tp must divide: the size each style splits."""
    module = planned.module
    colwise = planned.style in ("colwise", "colwise_rep")
    if isinstance(module, nn.Embedding):
        if colwise:
            return {"embedding_dim": module.embedding_dim}
        return {"num_embeddings": module.num_embeddings}
    assert isinstance(module, nn.Linear)
    return {"out_features": module.out_features} if colwise else {"in_features": module.in_features}


def check_plan(model: nn.Module, plan: dict[str, str], tp: int) -> list[Planned]:
    """The resolved plan, once tp divides every size it splits and tied weights split alike."""
    planned = resolve(model, plan)
    sizes = {(p.name, key): n for p in planned for key, n in split_sizes(p).items()}
    for (name, key), n in sizes.items():
        if n % tp:
            fits = max(t for t in range(1, tp) if all(m % t == 0 for m in sizes.values()))
            raise ConfigError(
                ["parallel.tp", KEY],
                f"tp={tp} does not divide {name}'s {key}={n}, which its plan splits.",
                f"set parallel.tp={fits}.",
            )
    _check_ties(model, planned)
    return planned


def placements(model: nn.Module, planned: list[Planned]) -> dict[tuple[int, str], int | None]:
    """(id of a module, parameter name) -> the dimension split over the ranks, or None."""
    by_module = {id(p.module): p for p in planned}
    found = {}
    for module in model.modules():
        layer = by_module.get(id(module))
        for name, _ in module.named_parameters(recurse=False):
            found[(id(module), name)] = None if layer is None else split_dim(layer, name)
    return found


def tied_groups(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Parameters held by more than one module (a head tied to the embedding): their holders."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, name))
    return [group for group in holders.values() if len(group) > 1]


def _check_ties(model: nn.Module, planned: list[Planned]) -> None:
    where = placements(model, planned)
    names = {id(m): name for name, m in model.named_modules()}
    for group in tied_groups(model):
        splits = {where[(id(m), p)] for m, p in group}
        if len(splits) > 1:
            held = " and ".join(f"{names[id(m)]}.{p}" for m, p in group)
            raise ConfigError(
                KEY,
                f"{held} are one tied weight, and the plan splits it differently for each.",
                "split both by vocabulary rows (rowwise for the embedding, colwise_rep for the "
                "head), or leave both out of the plan.",
            )


def rank_share(
    model: nn.Module, planned: list[Planned], tp: int, block: nn.Module | None
) -> TpShare:
    """Each parameter's elements on one rank (split ones divided by tp, the rest whole)."""
    where = placements(model, planned)
    per_param: dict[int, int] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            split = where[(id(module), name)] is not None
            per_param[id(param)] = param.numel() // tp if split else param.numel()
    sizes = tuple(per_param[id(p)] for p in model.parameters())
    in_block = sum(per_param[id(p)] for p in block.parameters()) if block is not None else 0
    return TpShare(sizes, in_block)


def shard_for_one_rank(planned: list[Planned], tp: int) -> None:
    """Give each planned layer's parameters the shapes one rank's local computation has (a
    colwise layer's outputs divided by tp, a rowwise Linear's inputs; a rowwise embedding's and a
    colwise_rep layer's outputs stay whole), so that a probe forward runs one rank's shapes."""
    for layer in planned:
        if layer.style == "colwise_rep" or (
            isinstance(layer.module, nn.Embedding) and layer.style == "rowwise"
        ):
            continue
        for name, param in list(layer.module.named_parameters(recurse=False)):
            dim = split_dim(layer, name)
            if dim is None:
                continue
            shape = list(param.shape)
            shape[dim] //= tp
            setattr(layer.module, name, nn.Parameter(param.new_zeros(shape), param.requires_grad))
