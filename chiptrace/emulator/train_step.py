"""One training step's timeline and spans (see train.py for the workload's shape)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from chiptrace.emulator import collectives
from chiptrace.emulator.layered import Layered
from chiptrace.emulator.network import Route
from chiptrace.emulator.op_cost import BYTES, op_ns, resolve_precision
from chiptrace.emulator.scheduler import assign
from chiptrace.emulator.spans import SpanTable

if TYPE_CHECKING:
    from chiptrace.emulator.train import TrainConfig, Training

PHASES = ("input", "forward", "backward", "allreduce", "optimizer")
# Memory traffic of a layer's forward non-matmul kernels, per token, in units of hidden *
# bytes: two norms (read + write: 2 each), two residual adds (3 each), bias + GeLU over
# the 4h MLP activation (8), dropouts and the attention output's reshapes (~6), as fused as
# PyTorch eager and Megatron leave them.
_ELEMENTWISE_IO = 24.0


def layer_work(cfg: TrainConfig, precision: str, ideal: bool) -> list[tuple[str, float, float]]:
    """One layer's forward work on one rank as (op class, flops, bytes); backward is twice
    it. Ideal: the matmuls only, at their nominal bytes (the model before efficiencies).
    Otherwise also the attention kernel (causal: QK^T and PV over the unmasked half,
    2 s h flops per token; Q, K, V, O read or written once, as a fused kernel does) and
    the memory-bound kernels around the matmuls."""
    tokens, h, w = cfg.batch * cfg.seq, cfg.hidden, BYTES[precision]
    p = cfg.params_per_layer
    gemm = ("gemm", 2 * p * tokens, p * w + 4 * tokens * h * w)
    if ideal:
        return [gemm]
    return [
        gemm,
        ("attention", 2.0 * tokens * cfg.seq * h, 4 * tokens * h * w),
        ("elementwise", 0.0, _ELEMENTWISE_IO * tokens * h * w),
    ]


def transfers(
    tb: SpanTable,
    routes: list[Route],
    starts: np.ndarray,
    ends: np.ndarray,
    trace: int,
    parent: int,
    name: str,
    nbytes: float,
    op: str = "memcpy",
) -> np.ndarray:
    """One span per hop of each transfer; returns the span id of each transfer's last hop
    (0 for one that stays on its chip: a CPU that is its own input host has no hop)."""
    hops = np.array([len(r.dirs) for r in routes], dtype=np.int64)
    out = np.zeros(len(routes), dtype=np.uint64)  # span ids are non-zero
    if not hops.any():
        return out
    dirs = np.concatenate([r.dirs for r in routes])
    row = np.repeat(np.arange(len(routes)), hops)
    ids = tb.add(
        trace, tb.name(name), starts[row], ends[row], parent, dir=dirs, op=op, nbytes=int(nbytes)
    )
    out[hops > 0] = ids[np.cumsum(hops)[hops > 0] - 1]
    return out


def run_step(tr: Training, s: int, t0: float) -> float:
    """Emit every span of step `s` starting at virtual time t0; returns the step's end."""
    tb = tr.ctx.table
    trace = tb.new_trace()
    root, *phase = tb.ids(1 + len(PHASES))
    ph = dict(zip(PHASES, phase, strict=True))
    bounds: dict[str, tuple[float, float]] = {}

    # Prefetched input runs during the previous step: it sits in that step's trace, under
    # its root (no child starts before its parent), linked to the step it feeds.
    in_trace = trace
    if tr.cfg.prefetch and tr.prev_trace is not None:
        in_trace = tr.prev_trace
    prefetched = in_trace != trace
    ready, h2d_ids = _input(tr, s, t0, in_trace, ph["input"], bounds)
    if tr.cfg.sharding == "fsdp" or tr.cfg.moe:
        ar_end, last_bucket = _layered(tr, t0, ready, (in_trace, h2d_ids), trace, ph, bounds)
    else:
        _, bwd_end = _compute(tr, t0, ready, (in_trace, h2d_ids), trace, ph, bounds)
        ar_end, last_bucket = _allreduce(tr, bwd_end, trace, ph["allreduce"], bounds)
    end = _optimizer(tr, ar_end, trace, ph["optimizer"], bounds, last_bucket)
    if prefetched:
        a, b = bounds.pop("input")
        tb.add(
            in_trace,
            tb.name("input"),
            a,
            b,
            tr.prev_root,
            span_ids=np.array([ph["input"]], np.uint64),
            links=[[(trace, int(root))]],
            attrs=[{"train.for_step": s}],
        )
    for name, (a, b) in bounds.items():
        tb.add(trace, tb.name(name), a, b, root, span_ids=np.array([ph[name]], np.uint64))
    # The root spans [previous step's end, this end]: step times tile the run.
    tb.add(
        trace,
        tb.name("train_step"),
        t0,
        end,
        0,
        span_ids=np.array([root], np.uint64),
        attrs=[{"train.step": s, "train.ranks": len(tr.gpus), "train.buckets": len(tr.buckets)}],
    )
    if tr.prev_trace is not None:
        tb.unpin(tr.prev_trace)
    tr.prev_trace, tr.prev_root = tb.pin(trace), int(root)  # the next step's input goes here
    return end


def _input(
    tr: Training, s: int, t0: float, trace: int, parent: int, bounds: dict
) -> tuple[np.ndarray, np.ndarray]:
    ctx, cfg, tb = tr.ctx, tr.cfg, tr.ctx.table
    release = tr.prev_start if cfg.prefetch and s > 0 else t0
    placement, dur = input_plan(tr, release)
    dpu = [placement[g] for g in tr.gpus]
    on_dpu = (
        tr.ingest.run(dpu, release, trace, parent) if tr.ingest else np.full(len(tr.gpus), release)
    )
    starts = np.zeros(len(tr.gpus))
    for i, g in enumerate(tr.gpus):
        d = placement[g]
        starts[i] = max(tr.dpu_free[d], float(on_dpu[i])) + ctx.delay.get(d, 0.0)
        tr.dpu_free[d] = starts[i] + dur[d]
    ends = starts + np.array([dur[d] for d in dpu])
    nbytes = cfg.input_mb * 1e6
    tb.add(
        trace,
        tb.name("preprocess"),
        starts,
        ends,
        parent,
        chip=np.array([ctx.chip(d) for d in dpu]),
        op="compute",
        nbytes=int(2 * nbytes),
        flops=int(nbytes * cfg.preprocess_flops_per_byte),
        precision="fp32",
    )
    routes = [ctx.network.route(d, g) for d, g in zip(dpu, tr.gpus, strict=True)]
    arrive = ctx.network.fluid(ends, routes, [nbytes] * len(routes))
    ids = transfers(tb, routes, ends, arrive, trace, parent, "h2d", nbytes)
    first = float(starts.min()) if tr.ingest is None else min(float(starts.min()), release)
    bounds["input"] = (first, float(arrive.max()))
    return arrive, ids


def _compute(
    tr: Training,
    t0: float,
    ready: np.ndarray,
    h2d: tuple[int, np.ndarray],
    trace: int,
    ph: dict,
    bounds: dict,
) -> tuple[np.ndarray, np.ndarray]:
    ctx, cfg, tb = tr.ctx, tr.cfg, tr.ctx.table
    L, n, prec = cfg.layers, len(tr.gpus), tr.precision
    fwd = layer_work(cfg, prec, tr.eff.ideal)
    bwd = [(cls, 2 * f, 2 * b) for cls, f, b in fwd]
    f_flops, f_bytes = sum(x[1] for x in fwd), sum(x[2] for x in fwd)
    chips = [ctx.topology.chips[g] for g in tr.gpus]
    fdur = np.array([op_ns(c, fwd, prec, tr.eff, ctx.slow.get(c.id, 1.0)) for c in chips])
    bdur = np.array([op_ns(c, bwd, prec, tr.eff, ctx.slow.get(c.id, 1.0)) for c in chips])
    start = np.maximum(t0 + np.array([ctx.delay.get(g, 0.0) for g in tr.gpus]), ready)
    fs, fe = cumulative(start, np.repeat(fdur[:, None], L, axis=1))
    bs, be = cumulative(fe[:, -1], np.repeat(bdur[:, None], L, axis=1))
    chip_idx = np.repeat(np.array([ctx.chip(g) for g in tr.gpus]), L)
    fnames = np.tile(np.array([tb.name(f"fwd.{i}") for i in range(L)]), n)
    bnames = np.tile(np.array([tb.name(f"bwd.{i}") for i in reversed(range(L))]), n)
    links: list = [None] * (n * L)
    in_trace, h2d_ids = h2d  # the copies that fed each rank, in the trace they ran in
    for r in range(n):
        links[r * L] = [(in_trace, int(h2d_ids[r]))] if h2d_ids[r] else None
    tb.add(
        trace,
        fnames,
        fs.ravel(),
        fe.ravel(),
        ph["forward"],
        chip=chip_idx,
        op="compute",
        nbytes=int(f_bytes),
        flops=int(f_flops),
        precision=prec,
        links=links,
    )
    tb.add(
        trace,
        bnames,
        bs.ravel(),
        be.ravel(),
        ph["backward"],
        chip=chip_idx,
        op="compute",
        nbytes=int(2 * f_bytes),
        flops=int(2 * f_flops),
        precision=prec,
    )
    bounds["forward"] = (float(fs.min()), float(fe.max()))
    bounds["backward"] = (float(bs.min()), float(be.max()))
    return fe, be  # be[:, j] is layer L-1-j


def _layered(
    tr: Training,
    t0: float,
    ready: np.ndarray,
    h2d: tuple[int, np.ndarray],
    trace: int,
    ph: dict,
    bounds: dict,
) -> tuple[float, int]:
    """FSDP or MoE (layered.py): forward and backward with their in-layer collectives,
    then the gradients' reduce-scatters (FSDP) or the attention blocks' all-reduce (MoE)."""
    run = Layered(tr, layer_work(tr.cfg, tr.precision, tr.eff.ideal), trace, ph)
    delay = np.array([tr.ctx.delay.get(g, 0.0) for g in tr.gpus])
    in_trace, h2d_ids = h2d
    links = [[(in_trace, int(x))] if x else None for x in h2d_ids]
    be = run.run(np.maximum(t0 + delay, ready), t0, links, bounds)
    if run.fsdp:
        return bounds["allreduce"][1], run.last
    return _allreduce(tr, be, trace, ph["allreduce"], bounds)


def _allreduce(
    tr: Training, bwd_end: np.ndarray, trace: int, parent: int, bounds: dict
) -> tuple[float, int]:
    cfg, tb, net = tr.cfg, tr.ctx.table, tr.ctx.network
    L = cfg.layers
    prev, first, bid = 0.0, None, np.zeros(1, np.uint64)
    bucket_name = tb.name("allreduce.bucket")
    done_at = bwd_end.max(axis=0)  # column j: layer L-1-j done on every rank
    for layer, nbytes in tr.buckets:
        ready = done_at[L - 1 - layer] if cfg.overlap else done_at.max()
        st = max(float(ready), prev)
        key = round(nbytes)
        if key not in tr.plans:
            tr.plans[key] = collectives.plan(
                net, cfg.allreduce, tr.gpus, nbytes, cfg.channels, tr.comm_eff
            )
        bid = tb.ids(1)
        end = collectives.emit(tb, tr.plans[key], st, trace, int(bid[0]))
        if tr.fabric:
            tr.fabric.forward_rounds(tr.plans[key].rounds, st, trace, int(bid[0]))
        tb.add(trace, bucket_name, st, end, parent, op="comm", nbytes=int(nbytes), span_ids=bid)
        first = st if first is None else first
        prev = end
    bounds["allreduce"] = (first if first is not None else prev, prev)
    return prev, int(bid[0])


def _optimizer(tr: Training, t: float, trace: int, parent: int, bounds: dict, after: int) -> float:
    """GPU Adam (linked to the last all-reduce bucket it waited on) or the CPU offload path."""
    ctx, cfg, tb = tr.ctx, tr.cfg, tr.ctx.table
    P = cfg.params / (len(tr.gpus) if cfg.sharding == "fsdp" else 1)  # the rank's shard
    if cfg.optimizer == "gpu":
        chips = [ctx.topology.chips[g] for g in tr.gpus]
        st = t + np.array([0.0 for _ in chips])
        dur = np.array(
            [
                op_ns(
                    c,
                    [("optimizer", 12 * P, 16 * P)],
                    "fp32" if "fp32" in c.peak_flops else tr.precision,
                    tr.eff,
                    ctx.slow.get(c.id, 1.0),
                )
                for c in chips
            ]
        )
        tb.add(
            trace,
            tb.name("adam"),
            st,
            st + dur,
            parent,
            chip=np.array([ctx.chip(g) for g in tr.gpus]),
            op="compute",
            nbytes=int(16 * P),
            flops=int(12 * P),
            precision="fp32",
            links=[[(trace, after)] if after else None] * len(chips),
        )
        bounds["optimizer"] = (t, float((st + dur).max()))
        return float((st + dur).max())
    return _cpu_optimizer(tr, t, trace, parent, bounds)


def _cpu_optimizer(tr: Training, t: float, trace: int, parent: int, bounds: dict) -> float:
    ctx, cfg, tb, net = tr.ctx, tr.cfg, tr.ctx.table, tr.ctx.network
    n, P = len(tr.gpus), cfg.params
    shard = P / n
    hosts = [tr.host[g] for g in tr.gpus]
    down = [net.route(g, h) for g, h in zip(tr.gpus, hosts, strict=True)]
    d_end = net.fluid([t] * n, down, [shard * tr.grad_bytes] * n)
    d_ids = transfers(
        tb, down, np.full(n, t), d_end, trace, parent, "d2h.grads", shard * tr.grad_bytes
    )
    free: dict[str, float] = {}
    starts, ends = np.zeros(n), np.zeros(n)
    for i, h in enumerate(hosts):  # a CPU updates the shards of its GPUs one after another
        c = ctx.topology.chips[h]
        starts[i] = max(d_end[i], free.get(h, 0.0)) + ctx.delay.get(h, 0.0)
        ends[i] = starts[i] + op_ns(
            c, [("optimizer", 12 * shard, 16 * shard)], "fp32", tr.eff, ctx.slow.get(h, 1.0)
        )
        free[h] = ends[i]
    tb.add(
        trace,
        tb.name("adam"),
        starts,
        ends,
        parent,
        chip=np.array([ctx.chip(h) for h in hosts]),
        op="compute",
        nbytes=int(16 * shard),
        flops=int(12 * shard),
        precision="fp32",
        links=[[(trace, int(x))] for x in d_ids],
    )
    up = [net.route(h, g) for g, h in zip(tr.gpus, hosts, strict=True)]
    pbytes = P * BYTES[tr.precision]
    u_end = net.fluid(ends, up, [pbytes] * n)
    transfers(tb, up, ends, u_end, trace, parent, "h2d.params", pbytes)
    bounds["optimizer"] = (t, float(u_end.max()))
    return float(u_end.max())


def input_plan(tr: Training, release: float) -> tuple[dict[str, str], dict[str, float]]:
    """Which DPU preprocesses each rank's input, and how long it takes there. `static`: the
    GPU's nearest DPU; `dynamic`: the DPU that would finish it first (earliest finish time)."""
    ctx, cfg = tr.ctx, tr.cfg
    nbytes = cfg.input_mb * 1e6
    work = [("elementwise", nbytes * cfg.preprocess_flops_per_byte, 2 * nbytes)]
    durations = {
        d: op_ns(
            ctx.topology.chips[d],
            work,
            resolve_precision(ctx.topology.chips[d], "fp32"),
            tr.eff,
            ctx.slow.get(d, 1.0),
        )
        for d in tr.dpus
    }
    free = {d: max(tr.dpu_free[d], release) + ctx.delay.get(d, 0.0) for d in tr.dpus}
    if ctx.schedule == "static":
        return dict(tr.home_dpu), durations
    placement = assign(tr.gpus, tr.dpus, durations, free, "dynamic")
    return placement, durations


def cumulative(start: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Back-to-back ops per row: (starts, ends) with each row beginning at start[row]."""
    ends = start[:, None] + np.cumsum(durations, axis=1)
    return ends - durations, ends
