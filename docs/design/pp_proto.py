"""Standalone prototype for issue 45 (pipeline parallelism, token-exact loss), torch 2.13 CPU/gloo.

Run:  torchrun --standalone --nproc_per_node 2 pp_proto.py            (pp=2)
      PP_DP=2 torchrun --standalone --nproc_per_node 4 pp_proto.py    (pp=2 x dp=2, FSDP2 per stage)
Env:  PP_DTYPE=fp64|fp32, PP_SCHEDULES=gpipe,1f1b,interleaved_1f1b[,interleaved_zb,zbv,dualpipev]
      PP_CONTROLS=1 (negative controls), PP_MEMORY=1 (saved-activation meter), PP_EVAL=1 (eval()
      between steps 2 and 3), PP_STATIC=1 (input_args/output_args: no shape inference),
      PP_RESHARD=0 (FSDP reshard_after_forward=False), PP_FSDP_AVG=1 (FSDP's own mean over dp,
      grad_divisor=dp), PP_FSDP_BLOCKS=0 (FSDP on the stage root only)

Checks, per schedule, against one process running the whole global batch at once:
per-step loss and whole-model grad norm (3 AdamW steps, clipping at 1.0), final parameters by
name, the number of loss_fn calls per step and len(losses). Negative controls: per-micro-batch
mean, and scale_grads=True. Memory: live saved-for-backward activation bytes per stage.
"""

from __future__ import annotations

import copy
import os
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor

VOCAB, D, SEQ, N_LAYER, N_HEAD = 64, 32, 16, 4, 4
GA, MICRO, STEPS, MAX_NORM, LR = 4, 2, 3, 1.0, 1e-2
DTYPE = torch.float64 if os.environ.get("PP_DTYPE", "fp64") == "fp64" else torch.float32
EVAL_AFTER = 1 if os.environ.get("PP_EVAL", "1") == "1" else -1  # eval() between steps 1 and 2
FSDP_AVG = os.environ.get("PP_FSDP_AVG") == "1"  # FSDP2 default divide (mean over dp)
STATIC = os.environ.get("PP_STATIC") == "1"  # give input_args/output_args: no shape inference
TOL = 1e-6 if torch.float64 == DTYPE else 1e-5


# ----------------------------------------------------------------------------- the model
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (z.view(b, t, N_HEAD, D // N_HEAD).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Each optional part may be None: a pipeline stage is this class with parts removed."""

    def __init__(self) -> None:
        super().__init__()
        self.tok: nn.Module | None = nn.Embedding(VOCAB, D)
        self.pos: nn.Module | None = nn.Embedding(SEQ, D)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(N_LAYER)})
        self.norm: nn.Module | None = nn.LayerNorm(D)
        self.head: nn.Module | None = nn.Linear(D, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.layers.values():
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x


def make_model() -> GPT:
    torch.manual_seed(0)
    return GPT()


def stage_module(whole: GPT, stage: int, n_stages: int) -> GPT:
    """torchtitan's way: a deep copy of the whole model with the other stages' parts removed, so
    every kept parameter keeps its fully qualified name (layers.2.qkv.weight, ...)."""
    mod = copy.deepcopy(whole)
    per = N_LAYER // n_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for name in list(mod.layers.keys()):
        if name not in keep:
            del mod.layers[name]
    if stage != 0:
        mod.tok = mod.pos = None
    if stage != n_stages - 1:
        mod.norm = mod.head = None
    return mod


# ----------------------------------------------------------------------------- the data
def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """dp * GA * MICRO sequences; mostly padding, unevenly per micro-batch, so that a wrong
    denominator (per-micro-batch mean, or divided by GA) gives a visibly different gradient."""
    g = torch.Generator().manual_seed(1000 + step)
    rows = DP * GA * MICRO
    ids = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
    tgt = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
    lengths = torch.tensor([16, 12, 1, 0, 2, 1, 3, 1, 9, 1, 0, 2, 5, 1, 1, 2])  # valid prefix
    lengths = lengths[torch.randint(0, 16, (rows,), generator=g)]
    pos = torch.arange(SEQ)[None, :]
    tgt[pos >= lengths[:rows, None]] = -100
    return ids, tgt


# ----------------------------------------------------------------------------- reference
def reference() -> dict:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    out = {"loss": [], "norm": [], "tokens": []}
    for step in range(STEPS):
        ids, tgt = global_batch(step)
        count = (tgt != -100).sum()
        logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), reduction="sum")
        loss = loss / count
        opt.zero_grad()
        loss.backward()
        if step == 0:
            out["grads0"] = {k: v.grad.detach().clone() for k, v in model.named_parameters()}
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        out["loss"].append(loss.item())
        out["norm"].append(norm.item())
        out["tokens"].append(int(count))
        if step == EVAL_AFTER:
            ids, tgt = global_batch(100)
            with torch.no_grad():
                total = F.cross_entropy(
                    model(ids).reshape(-1, VOCAB), tgt.reshape(-1), reduction="sum"
                )
            out["eval"] = (total / (tgt != -100).sum()).item()
    out["params"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out


# ----------------------------------------------------------------------------- memory meter
class SavedMeter:
    """Live saved-for-backward activation bytes of one stage module (parameters excluded),
    measured with saved_tensors_hooks entered/left by forward pre/post hooks (names untouched).
    A saved tensor is counted once per storage and released when autograd frees its node."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.live: dict[int, list[int]] = {}  # storage ptr -> [refs, bytes]
        self.bytes = self.peak = 0
        self.per_forward: list[int] = []
        self._ctx: list = []
        module.register_forward_pre_hook(self._enter)
        module.register_forward_hook(self._leave)

    def reset(self) -> None:
        self.peak = self.bytes
        self.per_forward = []

    def _param_ptrs(self) -> set[int]:
        ptrs = set()
        for p in self.module.parameters():
            t = p.to_local() if isinstance(p, DTensor) else p
            ptrs.add(t.untyped_storage().data_ptr())
        return ptrs

    def _enter(self, mod, args):
        params = self._param_ptrs()
        start = self.bytes

        def pack(t: torch.Tensor):
            ptr = t.untyped_storage().data_ptr()
            if ptr in params or isinstance(t, nn.Parameter):
                return t
            entry = self.live.setdefault(ptr, [0, t.untyped_storage().nbytes()])
            if entry[0] == 0:
                self.bytes += entry[1]
                self.peak = max(self.peak, self.bytes)
            entry[0] += 1
            # detach: a handle holding `t` itself (with its grad_fn) makes a cycle through the
            # C++ graph that gc cannot see; a graph never backpropagated (the first stage's
            # metadata-inference forward) would then stay alive for the whole run
            handle = _Handle(t.detach())
            weakref.finalize(handle, self._release, ptr)
            return handle

        def unpack(h):
            return h.t if isinstance(h, _Handle) else h

        ctx = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        ctx.__enter__()
        self._ctx.append((ctx, start))

    def _leave(self, mod, args, out):
        ctx, start = self._ctx.pop()
        ctx.__exit__(None, None, None)
        self.per_forward.append(self.bytes - start)

    def _release(self, ptr: int) -> None:
        entry = self.live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self.live[ptr]


class _Handle:
    __slots__ = ("__weakref__", "t")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


# ----------------------------------------------------------------------------- pipeline run
SINGLE = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MULTI = {
    "interleaved_1f1b": (ScheduleInterleaved1F1B, "loop"),
    "interleaved_zb": (ScheduleInterleavedZeroBubble, "loop"),
    "zbv": (ScheduleZBVZeroBubble, "v"),
    "dualpipev": (ScheduleDualPipeV, "v"),
}


def local_stage_ids(schedule: str, pp_rank: int) -> tuple[list[int], int]:
    if schedule in SINGLE:
        return [pp_rank], PP
    if MULTI[schedule][1] == "loop":  # rank r holds r, r + pp, ...
        return [pp_rank, pp_rank + PP], 2 * PP
    return [pp_rank, 2 * PP - 1 - pp_rank], 2 * PP  # V: rank 0 holds the first and last


def run_pipeline(schedule: str, mode: str = "exact", scale_grads: bool = False, meter=False):
    pp_rank, dp_rank = MESH["pp"].get_local_rank(), MESH["dp"].get_local_rank()
    whole = make_model()
    ids_stages, n_stages = local_stage_ids(schedule, pp_rank)
    modules, stages, meters = [], [], []
    for s in ids_stages:
        mod = stage_module(whole, s, n_stages)
        if DP > 1:  # FSDP2 over dp on each block and on the stage root (the stage's submod)
            keep = os.environ.get("PP_RESHARD", "1") == "1"  # torchtitan's pp default: False
            blocks = (
                list(mod.layers.values()) if os.environ.get("PP_FSDP_BLOCKS", "1") == "1" else []
            )
            for block in blocks:
                fully_shard(block, mesh=MESH["dp"], reshard_after_forward=keep)
            fully_shard(mod, mesh=MESH["dp"], reshard_after_forward=keep)
            if not FSDP_AVG:  # launcher/engines/fsdp.py: sum over dp, grad_divisor 1
                for unit in [*blocks, mod]:
                    unit.set_gradient_divide_factor(1.0)
                    unit.set_force_sum_reduction_for_comms(True)
        if meter:
            meters.append(SavedMeter(mod))
        modules.append(mod)
        static = {}
        if STATIC:  # one micro-batch's shapes; outputs' grads are derived (plain tensors)
            first, last = s == 0, s == n_stages - 1
            # activations that carry a gradient must say so (requires_grad=True): a grad
            # meta is derived only for those (_utils.py:331-352); else stage backward fails
            act = torch.zeros(MICRO, SEQ, D, requires_grad=True)
            static = dict(
                input_args=torch.zeros(MICRO, SEQ, dtype=torch.long) if first else act,
                output_args=torch.zeros(MICRO, SEQ, VOCAB, requires_grad=True) if last else act,
            )
        stages.append(
            PipelineStage(mod, s, n_stages, torch.device("cpu"), group=PP_GROUP, **static)
        )
    # FSDP2 with divide factor 1 and SUM reductions (launcher/engines/fsdp.py): grad_divisor 1;
    # FSDP2's default (average over dp): grad_divisor = dp
    grad_divisor = float(DP) if FSDP_AVG and DP > 1 else 1.0
    calls = [0]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        total = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), reduction="sum")
        if mode == "exact":
            return total * scale
        # negative control: each micro-batch's own token mean / grad_accum (then / dp)
        return total / (target != -100).sum().clamp(min=1) / GA * grad_divisor / DP

    cls_kw = dict(n_microbatches=GA, loss_fn=loss_fn, scale_grads=scale_grads)
    if schedule in SINGLE:
        sched = SINGLE[schedule](stages[0], **cls_kw)
    else:
        sched = MULTI[schedule][0](stages, **cls_kw)
    has_first = any(st.is_first for st in stages)
    has_last = any(st.is_last for st in stages)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.1)
    out = {"loss": [], "norm": [], "tokens": [], "calls": [], "n_losses": [], "mem": None}
    rows = GA * MICRO
    for step in range(STEPS):
        ids, tgt = global_batch(step)
        ids, tgt = (
            ids[dp_rank * rows : (dp_rank + 1) * rows],
            tgt[dp_rank * rows : (dp_rank + 1) * rows],
        )
        # the count first: this dp rank's micro-batches summed, all-reduced over dp (a pp group
        # counts once: every pp rank holds the same targets here, only the last stage uses it)
        count = (tgt != -100).sum().to(DTYPE)
        dist.all_reduce(count, group=DP_GROUP)
        scale = grad_divisor / count.clamp(min=1)
        opt.zero_grad()
        for m in meters:
            m.reset()
        calls[0] = 0
        losses: list[torch.Tensor] = []
        sched.step(
            *((ids,) if has_first else ()),
            target=tgt if has_last else None,
            losses=losses if has_last else None,
            loss_kwargs={"scale": scale},
            return_outputs=False,  # do not keep every micro-batch's logits for a merge
        )
        # whole-model grad norm: squared local norms (FSDP shards, stages) summed over the world
        sq = torch.zeros((), dtype=torch.float64)
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                sq += g.double().pow(2).sum()
        dist.all_reduce(sq)  # disjoint pieces on every rank: world = pp x dp shards
        if step == 0:
            grads0 = {
                k: (v.grad.full_tensor() if isinstance(v.grad, DTensor) else v.grad)
                .detach()
                .clone()
                for m in modules
                for k, v in m.named_parameters()
                if v.grad is not None
            }
        norm = sq.sqrt()
        coef = torch.clamp(MAX_NORM / (norm + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).mul_(coef.to(DTYPE))
        opt.step()
        # logged loss: last-stage ranks hold their dp share x grad_divisor; one all-reduce
        mine = (
            torch.stack([x.detach() for x in losses]).sum().double() / grad_divisor
            if has_last
            else torch.zeros((), dtype=torch.float64)
        )
        dist.all_reduce(mine)
        out["loss"].append(mine.item())
        out["norm"].append(norm.item())
        out["tokens"].append(int(count))
        out["calls"].append(calls[0])
        out["n_losses"].append(len(losses))
        if step == EVAL_AFTER:
            ids, tgt = global_batch(100)
            ids, tgt = (
                ids[dp_rank * rows : (dp_rank + 1) * rows],
                tgt[dp_rank * rows : (dp_rank + 1) * rows],
            )
            ecount = (tgt != -100).sum().to(DTYPE)
            dist.all_reduce(ecount, group=DP_GROUP)
            before, elosses = calls[0], []
            with torch.no_grad():  # eval(): has_backward False for this call; loss_fn still runs
                sched.eval(
                    *((ids,) if has_first else ()),
                    target=tgt if has_last else None,
                    losses=elosses if has_last else None,
                    loss_kwargs={"scale": grad_divisor / ecount.clamp(min=1)},
                    return_outputs=False,
                )
            mine = (
                torch.stack(elosses).sum().double() / grad_divisor
                if has_last
                else torch.zeros((), dtype=torch.float64)
            )
            dist.all_reduce(mine)
            out["eval"] = mine.item()
            out["eval_calls"] = calls[0] - before
        if meter and step == STEPS - 1:
            out["mem"] = {
                st.stage_index: (m.peak, m.per_forward, round(m.peak / max(m.per_forward[0], 1), 3))
                for st, m in zip(stages, meters, strict=False)
            }
    # final parameters by name (full tensors), gathered to rank 0
    named = {}
    for m in modules:
        for k, v in m.state_dict().items():
            named[k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
    gathered = [None] * dist.get_world_size() if RANK == 0 else None
    dist.gather_object((named, grads0), gathered, dst=0)
    # per-rank facts (calls/n_losses/mem) to rank 0
    facts = [None] * dist.get_world_size() if RANK == 0 else None
    dist.gather_object(
        {
            "calls": out["calls"],
            "n_losses": out["n_losses"],
            "eval_calls": out.get("eval_calls"),
            "mem": out["mem"],
            "stages": ids_stages,
        },
        facts,
        dst=0,
    )
    if RANK == 0:
        merged, mgrads = {}, {}
        for d, g in gathered:
            merged.update(d)
            mgrads.update(g)
        out["params"], out["grads0"] = merged, mgrads
        out["facts"] = facts
    return out


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def compare(name: str, got: dict, ref: dict, expect_equal: bool = True) -> bool:
    lrel = max(rel(a, b) for a, b in zip(got["loss"], ref["loss"], strict=False))
    nrel = max(rel(a, b) for a, b in zip(got["norm"], ref["norm"], strict=False))
    keys_ok = set(got["params"]) == set(ref["params"])
    pdiff = (
        max((got["params"][k] - ref["params"][k]).abs().max().item() for k in ref["params"])
        if keys_ok
        else float("nan")
    )
    erel = rel(got["eval"], ref["eval"]) if "eval" in ref else 0.0
    ok = (
        lrel < TOL
        and nrel < TOL
        and erel < TOL
        and keys_ok
        and pdiff < 1e3 * TOL
        and got["tokens"] == ref["tokens"]
    )
    verdict = (
        ("PASS" if ok else "FAIL")
        if expect_equal
        else ("differs (good)" if not ok else "EQUAL?! (bad control)")
    )
    print(
        f"[{name}] loss max rel {lrel:.2e}  grad_norm max rel {nrel:.2e}  "
        f"param keys match={keys_ok} "
        f"max |dparam| {pdiff:.2e}  eval rel {erel:.1e}  tokens {got['tokens']}  -> {verdict}"
    )
    if expect_equal and not ok and keys_ok:
        ratio = {
            k: round((got["grads0"][k].norm() / ref["grads0"][k].norm()).item(), 4)
            for k in ref["grads0"]
            if k in got["grads0"]
        }
        wrong = {k: r for k, r in ratio.items() if abs(r - 1) > 1e-6}
        print(
            "    step-1 gradient norm ratio pipeline/reference, wrong ones "
            f"({len(wrong)}/{len(ratio)}): {wrong}"
        )
        print(
            "    step-1 parameters with no gradient at all: "
            f"{sorted(set(ref['grads0']) - set(got['grads0']))}"
        )
    print(f"    loss  {[f'{x:.10f}' for x in got['loss']]}")
    print(f"    norm  {[f'{x:.10f}' for x in got['norm']]}")
    for r, f in enumerate(got["facts"]):
        extra = f"  saved-activation peak/per-mb per stage {f['mem']}" if f["mem"] else ""
        print(
            f"    rank {r} stages {f['stages']}: loss_fn calls per step {f['calls']}, "
            f"len(losses) {f['n_losses']}, eval calls {f['eval_calls']}{extra}"
        )
    return ok == expect_equal


def main() -> None:
    global MESH, PP_GROUP, DP_GROUP, PP, DP, RANK
    dist.init_process_group("gloo")
    torch.set_default_dtype(DTYPE)
    torch.set_num_threads(1)
    RANK = dist.get_rank()
    DP = int(os.environ.get("PP_DP", "1"))
    PP = dist.get_world_size() // DP
    # pp outermost (it may cross nodes), then dp: rank = pp_idx * dp + dp_idx
    MESH = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    PP_GROUP, DP_GROUP = MESH["pp"].get_group(), MESH["dp"].get_group()
    ref = reference() if RANK == 0 else None
    if RANK == 0:
        print(
            f"torch {torch.__version__}  world {dist.get_world_size()} = pp {PP} x dp {DP}  "
            f"dtype {DTYPE}  "
            f"grad_accum {GA} micro {MICRO} tol {TOL}"
        )
        print(
            f"[reference] eval after step {EVAL_AFTER}: {ref.get('eval', float('nan')):.10f}  "
            f"static={STATIC} "
            f"reshard_after_forward={os.environ.get('PP_RESHARD', '1') == '1'}"
        )
        print(
            f"[reference] loss {[f'{x:.10f}' for x in ref['loss']]}\n"
            f"            norm {[f'{x:.10f}' for x in ref['norm']]}  tokens {ref['tokens']}"
        )
    names = os.environ.get("PP_SCHEDULES", "gpipe,1f1b,interleaved_1f1b").split(",")
    all_ok = True
    for name in names:
        try:
            got = run_pipeline(name, meter=os.environ.get("PP_MEMORY") == "1")
            if RANK == 0:
                all_ok &= compare(name, got, ref)
        except Exception as e:
            all_ok = False
            print(f"[{name}] rank {RANK} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            raise
    if os.environ.get("PP_CONTROLS", "1") == "1":
        got = run_pipeline("1f1b", mode="mb_mean")
        if RANK == 0:
            all_ok &= compare("control 1f1b per-micro-batch mean", got, ref, expect_equal=False)
        got = run_pipeline("1f1b", scale_grads=True)
        if RANK == 0:
            all_ok &= compare("control 1f1b scale_grads=True", got, ref, expect_equal=False)
    if RANK == 0:
        print("ALL OK" if all_ok else "SOME CHECK FAILED")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
