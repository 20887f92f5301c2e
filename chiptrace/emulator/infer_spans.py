"""The spans of one inference batch and of the requests it serves (see infer.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from chiptrace.emulator.train_step import transfers

if TYPE_CHECKING:
    from chiptrace.emulator.infer import Inference

_TOKEN_BYTES = 4  # token ids on the wire


def emit_batch(
    inf: Inference, device: str, batch: list[tuple[float, int, int]], start: float
) -> float:
    """Emit a batch's ops and its requests' spans; returns the batch's end (virtual ns)."""
    ctx, tb, net = inf.ctx, inf.ctx.table, inf.ctx.network
    pre, dec, fig = inf.costs(device, batch)
    bt = tb.new_trace()
    (broot,) = tb.ids(1)
    chip = ctx.chip(device)
    t, in_ids = start, None
    if inf.nic:
        route = [net.route(inf.nic, device)]
        nbytes = sum(r[1] for r in batch) * _TOKEN_BYTES
        t_in = net.fluid([start], route, [nbytes])
        in_ids = transfers(
            tb, route, np.array([start]), t_in, bt, int(broot), "ingress", nbytes, op="io"
        )
        t = float(t_in[0])
    pre_s, pre_e = t, t + pre
    tb.add(
        bt,
        tb.name("prefill"),
        pre_s,
        pre_e,
        broot,
        chip=chip,
        op="compute",
        nbytes=int(fig["pre_b"]),
        flops=int(fig["pre_f"]),
        precision=fig["pp"],
        links=[[(bt, int(in_ids[0]))]] if in_ids is not None else None,
    )
    dec_e = pre_e + np.cumsum(dec)
    dec_s = dec_e - dec
    tb.add(
        bt,
        tb.name("decode"),
        dec_s,
        dec_e,
        broot,
        chip=chip,
        op="compute",
        nbytes=np.rint(fig["dec_b"]).astype(np.int64),
        flops=np.rint(fig["dec_f"]).astype(np.int64),
        precision=fig["dp"],
    )
    end = float(dec_e[-1])
    if inf.nic:
        route = [net.route(device, inf.nic)]
        nbytes = sum(r[2] for r in batch) * _TOKEN_BYTES
        t_out = net.fluid([end], route, [nbytes])
        transfers(tb, route, np.array([end]), t_out, bt, int(broot), "egress", nbytes, op="io")
        end = float(t_out[0])
    tb.add(
        bt,
        tb.name("batch"),
        start,
        end,
        0,
        span_ids=np.array([broot], np.uint64),
        attrs=[
            {
                "batch.requests": len(batch),
                "batch.prompt_tokens": sum(r[1] for r in batch),
                "batch.device": device,
                # Requests still waiting when it was formed: grows without bound when
                # arrivals outpace what the devices serve.
                "batch.queue_depth": len(inf.queue),
            }
        ],
    )
    _requests(inf, batch, bt, int(broot), start, pre_s, pre_e, float(dec_e[-1]), end, device)
    return end


def _requests(
    inf: Inference,
    batch: list,
    bt: int,
    broot: int,
    start: float,
    pre_s: float,
    pre_e: float,
    dec_e: float,
    end: float,
    device: str,
) -> None:
    tb = inf.ctx.table
    n = len(batch)
    traces = np.array([tb.new_trace() for _ in range(n)])
    arrival = np.array([r[0] for r in batch])
    roots = tb.ids(n)
    names = np.array([tb.name(x) for x in ("queue", "prefill", "decode")])
    starts = np.stack([arrival, np.full(n, pre_s), np.full(n, pre_e)], axis=1)
    ends = np.stack([np.full(n, start), np.full(n, pre_e), np.full(n, dec_e)], axis=1)
    tb.add(
        np.repeat(traces, 3), np.tile(names, n), starts.ravel(), ends.ravel(), np.repeat(roots, 3)
    )
    tb.add(
        traces,
        tb.name("request"),
        arrival,
        end,
        0,
        span_ids=roots,
        links=[[(bt, broot)]] * n,
        attrs=[
            {
                "request.prompt_tokens": r[1],
                "request.output_tokens": r[2],
                "request.queue_ns": int(round(start - r[0])),  # arrival to its batch's start
                "request.device": device,
            }
            for r in batch
        ],
    )
