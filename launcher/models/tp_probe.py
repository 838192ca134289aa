"""model.tp_plan on the meta device: the model's forward with one tensor-parallel rank's shapes
(launcher/models/tp_plan.py's shard_for_one_rank) must run and return whole logits, so that a tp
the heads do not split into, an attention that counts its heads from a fixed n_head, or a head
left split is refused before any rank starts, naming the key."""

from __future__ import annotations

from launcher.config.model import UserModelConfig
from launcher.errors import ConfigError
from launcher.models.build import build_model
from launcher.models.probe_forward import _on, _probe_logits, check_output
from launcher.models.tp_plan import resolve, shard_for_one_rank, split_sizes

HEADS_FIX = (
    ", or count heads with -1 in the model's forward, or give the layer that reads each colwise "
    "layer's output rowwise in model.tp_plan (docs/parallelism.md)"
)


def _one_rank_fails(cfg: UserModelConfig, tp: int, vocab: int, device: str) -> str | None:
    """Why the probe forward with one rank's shapes under tp fails (None: it runs, with whole
    logits). One rank computes 1/tp of each colwise layer's outputs, the rest as planned."""
    with _on(device):
        model = build_model(cfg)
        planned = resolve(model, cfg.tp_plan or {})
        if any(n % tp for layer in planned for n in split_sizes(layer).values()):
            return f"tp={tp} does not divide a size the plan splits"
        shard_for_one_rank(planned, tp)
        try:
            output = _probe_logits(model, cfg.seq_len, device)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            error = f"{type(exc).__name__}: {first}"
            return f"{cfg._target_}'s forward fails on one rank's shard ({error})"
    try:
        local = check_output(cfg, output)
    except ConfigError:
        local = -1
    if local == vocab:
        return None
    return (
        f"one rank's logits are not the model's {vocab} (a colwise head leaves them split over "
        "the ranks)"
    )


def check_one_rank(cfg: UserModelConfig, tp: int, vocab: int, device: str) -> None:
    """model.tp_plan: the model's forward with one rank's shapes runs and returns whole logits; a
    tp that does not divide the heads, a model that counts its heads from a fixed n_head, or a
    head left split, is refused here instead of failing on the ranks."""
    failed = _one_rank_fails(cfg, tp, vocab, device)
    if failed is None:
        return
    keys = ["model.tp_plan", "parallel.tp"]
    if failed.startswith("one rank's logits"):
        raise ConfigError(
            keys,
            f"{failed}.",
            "give the head colwise_rep (split, then gathered whole) in model.tp_plan, or leave "
            "it out of the plan.",
        )
    # The largest tp whose shapes run (tried on the meta device only: no memory, no time).
    tried = range(tp - 1, 1, -1) if device == "meta" else range(0)
    fits = next((t for t in tried if _one_rank_fails(cfg, t, vocab, device) is None), 1)
    raise ConfigError(
        keys,
        f"{failed}: under parallel.tp={tp} each rank computes 1/{tp} of a colwise layer's "
        "outputs, which must be whole heads: tp must divide the heads (and the key-value heads), "
        "and the attention must count them from the tensor: view(b, t, -1, head_dim) after q, k "
        "and v, reshape(b, t, -1) before the output projection; and a colwise layer's split "
        "output must be read by a rowwise layer (blocks.*.up colwise, blocks.*.down rowwise), "
        "a rowwise layer's input must come split from a colwise one.",
        f"set parallel.tp={fits}{'' if fits > 1 else HEADS_FIX}.",
    )
