"""Training steps with collectives inside the layers: FSDP (ZeRO-3) and expert parallelism.

`sharding=fsdp`: each rank holds 1/n of every layer's parameters, gradients and optimizer
state. Before a layer's forward, and again before its backward, an all-gather assembles its
parameters; after its backward a reduce-scatter leaves each rank its shard of the gradients
(so there is no all-reduce). Collectives run on one communication stream, the next layer's
all-gather issued when a layer starts, as FSDP prefetches: a layer waits on its all-gather
only when communication is the slower of the two.

`moe=true`: each layer's MLP is a mixture of experts, one expert per GPU, top-1 routing.
Forward sends every token to its expert's GPU and back (two all-to-alls of the layer's
activations), backward does the same with the gradients, and the compute is split around
them: `fwd.N` is the attention block, `fwd.N.experts` the expert MLP (backward likewise).
Expert weights are not replicated, so only the attention block's gradients are all-reduced.

Spans: `fsdp.allgather` under forward/backward and `fsdp.reducescatter` under the gradient
phase (`allreduce`), `moe.dispatch` / `moe.combine` under forward/backward, each the parent
of its flows (`allgather.ring`, `reducescatter.ring`, `alltoall`: one span per hop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from chiptrace.emulator import collectives
from chiptrace.emulator.op_cost import BYTES, op_ns

if TYPE_CHECKING:
    from chiptrace.emulator.train import Training

Work = list[tuple[str, float, float]]
ATTN_SHARE = 1 / 3  # QKV and output projections: 4 h^2 of a layer's 12 h^2 parameters
_PLANS = {
    "fsdp.allgather": collectives.allgather,
    "fsdp.reducescatter": collectives.reducescatter,
    "moe.dispatch": collectives.alltoall,
    "moe.combine": collectives.alltoall,
}


def split_work(fwd: Work, moe: bool) -> tuple[Work, Work]:
    """A layer's forward work as (attention block, expert MLP); dense: (all of it, none)."""
    if not moe:
        return fwd, []
    share = {"gemm": ATTN_SHARE, "attention": 1.0}
    attn = [(c, f * share.get(c, 0.5), b * share.get(c, 0.5)) for c, f, b in fwd]
    mlp = [(c, f - a[1], b - a[2]) for (c, f, b), a in zip(fwd, attn, strict=True) if a[1] < f]
    return attn, mlp


class Layered:
    """One step's forward and backward, layer by layer, with the in-layer collectives."""

    def __init__(self, tr: Training, fwd: Work, trace: int, ph: dict[str, int]) -> None:
        self.tr, self.trace, self.ph = tr, trace, ph
        self.fsdp, self.moe = tr.cfg.sharding == "fsdp", tr.cfg.moe
        self.parts = split_work(fwd, self.moe)
        self.param_bytes = tr.cfg.params_per_layer * BYTES[tr.precision]
        self.grad_bytes = tr.cfg.params_per_layer * tr.grad_bytes
        self.act_bytes = tr.cfg.batch * tr.cfg.seq * tr.cfg.hidden * BYTES[tr.precision]
        self.comm = 0.0  # when the communication stream is next free
        self.last = 0  # span id of the last gradient collective

    def collective(self, kind: str, nbytes: float, ready: float, parent: str) -> float:
        """Run a collective on the communication stream once `ready`; returns its end."""
        tr, tb = self.tr, self.tr.ctx.table
        key = (kind, round(nbytes))
        if key not in tr.plans:
            tr.plans[key] = _PLANS[kind](
                tr.ctx.network, tr.gpus, nbytes, tr.cfg.channels, tr.comm_eff
            )
        start = max(self.comm, ready)
        bid = tb.ids(1)
        end = collectives.emit(tb, tr.plans[key], start, self.trace, int(bid[0]))
        phase = self.ph[parent]
        tb.add(
            self.trace,
            tb.name(kind),
            start,
            end,
            phase,
            op="comm",
            nbytes=int(nbytes),
            span_ids=bid,
        )
        self.comm, self.last = end, int(bid[0])
        return end

    def _compute(
        self, name: str, work: Work, scale: float, start: np.ndarray, links: list | None = None
    ) -> np.ndarray:
        """One compute span per rank for `work` (times `scale`) from `start`; their ends."""
        tr, ctx = self.tr, self.tr.ctx
        scaled = [(c, f * scale, b * scale) for c, f, b in work]
        dur = np.array(
            [
                op_ns(ctx.topology.chips[g], scaled, tr.precision, tr.eff, ctx.slow.get(g, 1.0))
                for g in tr.gpus
            ]
        )
        tb = ctx.table
        phase = "backward" if name.startswith("bwd") else "forward"
        tb.add(
            self.trace,
            tb.name(name),
            start,
            start + dur,
            self.ph[phase],
            chip=np.array([ctx.chip(g) for g in tr.gpus]),
            op="compute",
            nbytes=int(sum(x[2] for x in scaled)),
            flops=int(sum(x[1] for x in scaled)),
            precision=tr.precision,
            links=links,
        )
        return start + dur

    def layer(self, i: int, start: np.ndarray, back: bool, links: list | None = None) -> np.ndarray:
        """Layer i's compute from `start` (per rank), around its MoE all-to-alls; returns
        when each rank is done with it."""
        attn, mlp = self.parts
        tag, scale = ("bwd", 2.0) if back else ("fwd", 1.0)
        if not self.moe:
            return self._compute(f"{tag}.{i}", attn, scale, start, links)
        steps = [(f"{tag}.{i}.experts", mlp), (f"{tag}.{i}", attn)]
        if not back:
            steps.reverse()
        phase = "backward" if back else "forward"
        end = self._compute(*steps[0], scale, start, links)
        go = self.collective("moe.dispatch", self.act_bytes, float(end.max()), phase)
        end = self._compute(*steps[1], scale, np.full(len(start), go))
        back_at = self.collective("moe.combine", self.act_bytes, float(end.max()), phase)
        return np.full(len(start), back_at)

    def run(self, start: np.ndarray, t0: float, links: list, bounds: dict) -> np.ndarray:
        """Forward then backward from `start` (per rank); returns the backward ends per rank
        and layer, column j = layer L-1-j (as train_step's all-reduce expects)."""
        L, n = self.tr.cfg.layers, len(self.tr.gpus)
        self.comm = t0
        cur, first = start, start
        gathered = self._gather(0, t0, "forward")
        for i in range(L):
            cur = np.maximum(cur, gathered)
            if i == 0:
                first = cur
            gathered = self._gather(i + 1, float(cur.max()), "forward") if i + 1 < L else 0.0
            cur = self.layer(i, cur, back=False, links=links if i == 0 else None)
        bounds["forward"] = (float(first.min()), float(cur.max()))
        be = np.zeros((n, L))
        bwd_start = cur
        gathered = self._gather(L - 1, float(cur.max()), "backward")
        grads = []
        for j, i in enumerate(reversed(range(L))):
            cur = np.maximum(cur, gathered)
            gathered = self._gather(i - 1, float(cur.max()), "backward") if i > 0 else 0.0
            cur = be[:, j] = self.layer(i, cur, back=True)
            if self.fsdp:
                ready = float(cur.max())
                grads.append(
                    (
                        max(self.comm, ready),
                        self.collective("fsdp.reducescatter", self.grad_bytes, ready, "allreduce"),
                    )
                )
        bounds["backward"] = (float(bwd_start.min()), float(be.max()))
        if grads:
            bounds["allreduce"] = (grads[0][0], grads[-1][1])
        return be

    def _gather(self, i: int, ready: float, phase: str) -> float:
        """Layer i's parameters all-gathered (FSDP) once `ready`; 0 without sharding."""
        if not self.fsdp:
            return 0.0
        return self.collective("fsdp.allgather", self.param_bytes, ready, phase)
