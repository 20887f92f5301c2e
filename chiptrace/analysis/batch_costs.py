"""What a batch of requests costs on each serving device, learnt from the batches that ran.

A served workload (serving.py: requests linking to the batches that ran them) runs each
batch as ops on one device: a prefill over its prompt tokens, then decode chunks of a few
tokens each, with its tokens moved in before and out after. To re-form batches (batcher.py)
a batch that never ran must be priced, so each op's work is fit against what its batch
held, pooled over the devices of one type and precision (the same work costs the same
flops and bytes there):

- prefill: flops = a * prompt tokens, bytes = b0 + b1 * prompt tokens (weights once, the
  KV cache written per token);
- a decode chunk of k tokens: flops = a * requests * k, bytes = k * (b0 + b1 * context),
  context the tokens attended to at the chunk's middle (prompt + requests * tokens decoded).

An op's time is its roofline (max of flops over the device's peak at the op's precision
and bytes over its memory bandwidth) times the device's own measured ratio to it, its
median over the device's ops of that kind (a slow chip's ratio is larger), plus launch
overhead per token. Moving tokens in and out is fit per device against the tokens moved. Fit and priced
this way, the emulator's batches come back within a fraction of a percent.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chiptrace.topology import Topology


@dataclass(frozen=True)
class Request:
    """One served request: when it arrived, its sizes, the batch that served it."""

    arrival: int
    end: int
    prompt: int
    output: int
    batch: str


@dataclass
class Batch:
    """One batch that ran: its device, times and ops (name, start, end, flops, bytes, precision)."""

    span_id: str
    start: int
    end: int
    device: str = ""
    ops: list[tuple[str, int, int, float, float, str]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    @property
    def prompt(self) -> int:
        return sum(r.prompt for r in self.requests)

    @property
    def steps(self) -> int:
        return max((r.output for r in self.requests), default=0)


def load(con: Any, steps: Any, links: dict[int, str]) -> tuple[list[Request], list[Batch]]:
    """The requests (steps that link to a batch) and the batches with their compute ops."""
    ids = [steps.column("span_id")[k].as_py() for k in links]
    sizes = {
        sid: (int(p or 0), int(o or 0))
        for sid, p, o in con.execute(
            "SELECT lower(hex(span_id)), "
            "json_extract(attributes, '$.\"request.prompt_tokens\"')::BIGINT, "
            "json_extract(attributes, '$.\"request.output_tokens\"')::BIGINT "
            "FROM spans_raw WHERE lower(hex(span_id)) IN (SELECT unnest($1::VARCHAR[]))",
            [ids],
        ).fetchall()
    }
    starts, ends = steps.column("start_ns").to_pylist(), steps.column("end_ns").to_pylist()
    reqs = [
        Request(starts[k], ends[k], *sizes.get(sid, (0, 0)), links[k])
        for k, sid in zip(links, ids, strict=True)
    ]
    batches: dict[str, Batch] = {}
    for bid, bs, be, name, chip, s, e, f, b, p in con.execute(
        "WITH b AS (SELECT trace_id, span_id, start_ns, end_ns FROM spans_raw "
        "WHERE lower(hex(span_id)) IN (SELECT unnest($1::VARCHAR[]))) "
        "SELECT lower(hex(b.span_id)), b.start_ns, b.end_ns, CAST(s.name AS VARCHAR), "
        "CAST(s.chip_id AS VARCHAR), s.start_ns, s.end_ns, s.op_flops, s.op_bytes, "
        "CAST(s.op_precision AS VARCHAR) FROM b JOIN spans_raw s ON s.trace_id = b.trace_id "
        "WHERE s.chip_id IS NOT NULL AND s.link_id IS NULL AND s.op_kind = 'compute' "
        "ORDER BY 1, s.start_ns",
        [sorted(set(links.values()))],
    ).fetchall():
        bt = batches.setdefault(bid, Batch(bid, int(bs), int(be), str(chip)))
        bt.ops.append((name, int(s), int(e), float(f or 0), float(b or 0), p or ""))
    for r in reqs:
        if r.batch in batches:
            batches[r.batch].requests.append(r)
    return reqs, sorted(batches.values(), key=lambda b: b.start)


def chunks(steps: int, size: int) -> list[int]:
    """Tokens of each decode chunk of a batch decoding `steps` tokens, `size` at a time."""
    return [min(size, steps - size * j) for j in range(math.ceil(steps / size))]


@dataclass
class _Fit:
    """flops = fa * x_f; bytes = b0 + b1 * x_b (per unit the op scales by)."""

    fa: float = 0.0
    b0: float = 0.0
    b1: float = 0.0
    precision: str = ""


def _linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    if len(set(xs)) < 2:
        return (statistics.fmean(ys) if ys else 0.0), 0.0
    b1, b0 = np.polyfit(np.asarray(xs), np.asarray(ys), 1)
    return float(b0), float(b1)


class Costs:
    """Per device: prefill, decode and transfer times of any batch (ns)."""

    def __init__(self, topo: Topology, batches: list[Batch], chunk: int) -> None:
        self.topo, self.chunk = topo, chunk
        self.fits: dict[tuple[str, str], _Fit] = {}
        self.ratio: dict[tuple[str, str], float] = {}
        self.moves: dict[str, tuple[float, float, float, float]] = {}
        samples: dict[tuple[str, str], list[tuple[float, float, float, float]]] = defaultdict(list)
        moves: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
        precision: dict[tuple[str, str], str] = {}
        for b in batches:
            pre = [o for o in b.ops if o[0] == "prefill"]
            dec = [o for o in b.ops if o[0] == "decode"]
            ks = chunks(b.steps, chunk)
            if len(pre) != 1 or len(dec) != len(ks) or not b.requests:
                continue
            key = self._type(b.device)
            _, s, e, f, nb, p = pre[0]
            samples[(key, "prefill")].append((b.prompt, f, b.prompt, nb))
            precision[(key, "prefill")] = p
            n, done = len(b.requests), 0
            for k, (_, _, _, f, nb, p) in zip(ks, dec, strict=True):
                context = b.prompt + n * (done + k / 2)
                samples[(key, "decode")].append((n * k, f, context, nb / k))
                precision[(key, "decode")] = p
                done += k
            out = sum(r.output for r in b.requests)
            moves[b.device].append((b.prompt, s - b.start, out, b.end - dec[-1][2]))
        for op, rows in samples.items():
            fa = sum(r[1] for r in rows) / max(sum(r[0] for r in rows), 1.0)
            b0, b1 = _linear([r[2] for r in rows], [r[3] for r in rows])
            self.fits[op] = _Fit(fa, b0, b1, precision[op])
        for d, v in moves.items():  # latency + tokens over the route's bandwidth, each way
            in0, in1 = _linear([m[0] for m in v], [m[1] for m in v])
            out0, out1 = _linear([m[2] for m in v], [m[3] for m in v])
            self.moves[d] = (in0, in1, out0, out1)
        self._ratios(batches)

    def _type(self, device: str) -> str:
        chip = self.topo.chips.get(device)
        return chip.type if chip else device.split(":", 1)[0]

    def _roof(self, device: str, op: str, flops: float, nbytes: float) -> float:
        """Roofline seconds of the work on the device (a proxy where the topology lacks it)."""
        fit = self.fits.get((self._type(device), op))
        peak = self.topo.peak(device, fit.precision if fit else None) if flops else None
        chip = self.topo.chips.get(device)
        bw = chip.memory_bandwidth if chip else 0.0
        t = max(flops / peak if peak else 0.0, nbytes / bw if bw else 0.0)
        return t or nbytes or flops

    def _launch(self, device: str) -> float:
        chip = self.topo.chips.get(device)
        return chip.launch_overhead_ns if chip else 0.0

    def _ratios(self, batches: list[Batch]) -> None:
        got: dict[tuple[str, str], list[float]] = defaultdict(list)
        for b in batches:
            ks = iter(chunks(b.steps, self.chunk))
            for name, s, e, f, nb, _ in b.ops:
                k = next(ks, 1) if name == "decode" else 1
                roof = self._roof(b.device, name, f, nb)
                if roof > 0:
                    got[(b.device, name)].append((e - s - self._launch(b.device) * k) / roof)
        # To 5 figures: like devices then cost exactly alike, and a dynamic placement's
        # ties (the first of equally fast devices) fall as the run's did.
        self.ratio = {k: float(f"{statistics.median(v):.5g}") for k, v in got.items()}

    def priced(self, device: str) -> bool:
        """Whether the device ran batches to fit its costs on (one a dynamic placement
        never chose did not)."""
        return all(
            (device, op) in self.ratio and (self._type(device), op) in self.fits
            for op in ("prefill", "decode")
        )

    def compute(self, device: str, n: int, prompt: int, steps: int, speed: float = 1.0) -> float:
        """Prefill and decode time (ns) of a batch of `n` requests, `prompt` tokens in all,
        decoding `steps` tokens, on the device made `speed` times faster (its kernels: the
        launches are the host's)."""
        kind, launch = self._type(device), self._launch(device)
        pf, df = self.fits[(kind, "prefill")], self.fits[(kind, "decode")]
        t = self._op(device, "prefill", pf.fa * prompt, pf.b0 + pf.b1 * prompt)
        done = 0
        for k in chunks(steps, self.chunk):
            context = prompt + n * (done + k / 2)
            t += self._op(device, "decode", df.fa * n * k, k * (df.b0 + df.b1 * context))
            done += k
        return t / speed + launch * (1 + done)

    def _op(self, device: str, op: str, flops: float, nbytes: float) -> float:
        return self.ratio[(device, op)] * self._roof(device, op, flops, nbytes)

    def adopt(self, device: str, peers: list[str]) -> None:
        """Price a device that ran nothing as its peers (the median of their ratios)."""
        for op in ("prefill", "decode"):
            got = [self.ratio[(p, op)] for p in peers if (p, op) in self.ratio]
            if got:
                self.ratio[(device, op)] = statistics.median(got)
        moves = [self.moves[p] for p in peers if p in self.moves]
        if moves:
            self.moves[device] = moves[len(moves) // 2]

    def move(self, device: str, prompt: int, output: int) -> float:
        """Moving a batch's tokens in (`prompt`) and out (`output`, in all), ns."""
        a, b, c, e = self.moves.get(device, (0.0, 0.0, 0.0, 0.0))
        return a + b * prompt + c + e * output


def manifest_policy(manifests: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The serving workload's knobs as the run's manifest recorded them (an emulated run:
    `workload`, or a mixed run's `workload.infer`), with the run's schedule; None if none."""
    for m in manifests:
        w = m.get("workload")
        if isinstance(w, dict) and w.get("kind") == "mixed":
            w = w.get("infer")
        if not isinstance(w, dict) or w.get("kind") != "infer":
            continue
        emu = m.get("emulation")
        schedule = emu.get("schedule") if isinstance(emu, dict) else None
        return {**w, "schedule": schedule or "static"}
    return None
