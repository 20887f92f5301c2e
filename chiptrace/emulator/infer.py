"""Inference serving: a request stream, dynamic batching by token budget, GPUs and NPUs.

Requests arrive as a Poisson stream (seeded) with random prompt and output lengths. The
batcher closes a batch when its prompts reach the token budget or its oldest request has
waited `max_wait_ms`, and while every device is busy, keeps filling it from the queue up to
the budget. The schedule policy places each batch on a device: `static` deals
them round robin, `dynamic` picks the device that would finish it first. A batch copies its
prompts in from a NIC, runs prefill (compute-bound, `prefill_precision`) and decode
(memory-bound, `decode_precision`, one span per `decode_chunk` tokens), and copies the
output back out. Each request is a trace: `request` root, `queue`, `prefill` and `decode`
phases, with an OTel link to the batch that served it; each batch is a trace of its ops.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from chiptrace.emulator.context import Context
from chiptrace.emulator.efficiency import Efficiency, check_mode
from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.infer_spans import emit_batch
from chiptrace.emulator.op_cost import BYTES, resolve_precision, roofline_ns
from chiptrace.emulator.scheduler import assign
from chiptrace.emulator.topology_files import Topology
from chiptrace.schema import PRECISIONS


@dataclass
class InferConfig:
    """Knobs of the inference workload (settable with `--set key=value`)."""

    layers: int = 32
    hidden: int = 4096
    rate: float = 2000.0  # requests per second
    prompt_tokens: int = 512  # mean; uniform in [mean/2, 3*mean/2]
    output_tokens: int = 128
    token_budget: int = 16384  # prompt tokens per batch
    max_wait_ms: float = 5.0
    decode_chunk: int = 16  # decode iterations per span
    devices: str = "gpu+npu"  # gpu | npu | gpu+npu
    prefill_precision: str = ""  # default: the run's --precision, fp8 if that is bf16
    decode_precision: str = ""  # default: the run's --precision, nvfp4 if that is bf16
    efficiency: str = "preset"  # preset | ideal | a fraction (efficiency.py)

    @property
    def params(self) -> float:
        return 12.0 * self.hidden**2 * self.layers

    def check(self) -> None:
        for k in (
            "layers",
            "hidden",
            "prompt_tokens",
            "output_tokens",
            "token_budget",
            "decode_chunk",
        ):
            if getattr(self, k) < 1:
                raise WorkloadError(
                    f"workload {k} = {getattr(self, k)!r}: expected an integer >= 1"
                )
        if not self.rate > 0 or self.max_wait_ms < 0:
            raise WorkloadError(
                f"workload rate = {self.rate!r} / max_wait_ms = {self.max_wait_ms!r}: expected > 0 / >= 0"
            )
        check_mode(self.efficiency)
        if self.devices not in ("gpu", "npu", "gpu+npu"):
            raise WorkloadError(
                f"workload devices = {self.devices!r}: expected gpu, npu or gpu+npu"
            )
        for k in ("prefill_precision", "decode_precision"):
            if getattr(self, k) and getattr(self, k) not in PRECISIONS:
                raise WorkloadError(
                    f"workload {k} = {getattr(self, k)!r}: expected one of {', '.join(PRECISIONS)}"
                )


class Inference:
    """The serving workload bound to a run context; `step(i)` forms and runs batch i."""

    def __init__(self, ctx: Context, cfg: InferConfig) -> None:
        cfg.check()
        self.ctx, self.cfg = ctx, cfg
        topo = ctx.topology
        self.devices = [c for t in cfg.devices.split("+") for c in topo.of_type(t)]
        if not self.devices:
            raise WorkloadError(
                f"workload devices = {cfg.devices!r}: topology {topo.name} has none"
            )
        default = ctx.precision
        self.prefill = cfg.prefill_precision or ("fp8" if default == "bf16" else default)
        self.decode = cfg.decode_precision or ("nvfp4" if default == "bf16" else default)
        ends = topo.of_type("nic") or topo.of_type("cpu")  # where requests come in
        self.nic = ends[0] if ends else None
        for d in self.devices:
            chip = topo.chips[d]
            weights = cfg.params * max(
                BYTES[resolve_precision(chip, self.prefill)],
                BYTES[resolve_precision(chip, self.decode)],
            )
            kv = (
                cfg.token_budget
                * 2
                * (cfg.prompt_tokens + cfg.output_tokens)
                / cfg.prompt_tokens
                * cfg.layers
                * cfg.hidden
                * 2
            )
            if weights + kv > chip.memory_bytes:
                raise WorkloadError(
                    f"workload does not fit: {weights / 1e9:.1f} GB of weights + {kv / 1e9:.1f} GB of KV cache "
                    f"on {d} ({chip.model}, {chip.memory_bytes / 1e9:.0f} GB); lower layers, hidden or token_budget"
                )
        self.eff = Efficiency(cfg.efficiency)
        self.free = dict.fromkeys(self.devices, 0.0)
        self.queue: collections.deque[tuple[float, int, int]] = collections.deque()
        self.next_arrival = 0.0
        self._rng: np.random.Generator | None = None

    def describe(self) -> dict[str, object]:
        return {
            "kind": "infer",
            **asdict(self.cfg),
            "params": self.cfg.params,
            "prefill_precision": self.prefill,
            "decode_precision": self.decode,
            "devices": self.devices,
            # What the devices (with the run's faults) serve at most: a rate above it is an
            # overloaded queue, one well below it steady. The report measures its own.
            "service_rate_per_s": round(self.capacity(), 1),
        }

    def capacity(self) -> float:
        """Requests per second the devices serve at most: batches that fill the token
        budget with requests of the mean sizes (the longest output of such a batch is the
        expected maximum of its uniform draws), back to back. Round robin (`static`) deals
        every device the same share, so the slowest sets the pace; `dynamic` adds them up.
        A steady request rate sits below this, an overloaded one above."""
        cfg = self.cfg
        n = max(cfg.token_budget // cfg.prompt_tokens, 1)
        lo = max(cfg.output_tokens // 2, 1)
        hi = cfg.output_tokens * 3 // 2
        longest = round(lo + (hi - lo) * n / (n + 1))
        batch = [(0.0, cfg.prompt_tokens, cfg.output_tokens)] * (n - 1) + [
            (0.0, cfg.prompt_tokens, longest)
        ]
        rates = [n / (_total(self.costs(d, batch)) / 1e9) for d in self.devices]
        if self.ctx.schedule == "static":
            return len(rates) * min(rates)
        return sum(rates)

    def arrivals_rng(self) -> np.random.Generator:
        """The request stream's own generator, a child of the run's seed: drawn from the
        span table's generator (ids), the stream would change wherever a fault changes
        when batches form, and a re-run without the fault would serve other requests."""
        if self._rng is None:
            seq = self.ctx.table.rng.bit_generator.seed_seq
            if isinstance(seq, np.random.SeedSequence):
                self._rng = np.random.default_rng(seq.spawn(1)[0])
            else:
                self._rng = np.random.default_rng(int(self.ctx.table.rng.integers(2**63)))
        return self._rng

    def _arrivals_until(self, t: float) -> None:
        cfg, rng = self.cfg, self.arrivals_rng()
        while self.next_arrival <= t:
            p = int(rng.integers(max(cfg.prompt_tokens // 2, 1), cfg.prompt_tokens * 3 // 2 + 1))
            o = int(rng.integers(max(cfg.output_tokens // 2, 1), cfg.output_tokens * 3 // 2 + 1))
            self.queue.append((self.next_arrival, p, o))
            self.next_arrival += float(rng.exponential(1e9 / cfg.rate))

    def form_batch(self) -> tuple[float, list[tuple[float, int, int]]]:
        """Requests of the next batch and the time it closes. A batch opens with the oldest
        queued request and closes when its prompts fill the token budget or that request
        has waited `max_wait_ms`; while every device is still busy it keeps taking queued
        requests up to the budget, as a serving batcher draining its queue does: under
        load, batches fill the budget. (Free of the device it will run on would let the
        batch for a device that frees late drain the queue ahead of the others.)"""
        self._arrivals_until(self.queue[0][0] if self.queue else self.next_arrival)
        deadline = self.queue[0][0] + self.cfg.max_wait_ms * 1e6
        limit = max(deadline, self.ready())
        self._arrivals_until(limit)
        batch: list[tuple[float, int, int]] = []
        tokens = 0
        while self.queue and self.queue[0][0] <= limit:
            if batch and tokens + self.queue[0][1] > self.cfg.token_budget:
                return batch[-1][0], batch  # the budget filled when the last one arrived
            req = self.queue.popleft()
            batch.append(req)
            tokens += req[1]
        return limit, batch

    def ready(self) -> float:
        """When the first device is free to take a batch."""
        return min(self.free[d] + self.ctx.delay.get(d, 0.0) for d in self.devices)

    def costs(
        self, device: str, batch: list[tuple[float, int, int]]
    ) -> tuple[float, np.ndarray, dict]:
        """(prefill ns, decode chunk ns array, figures) of a batch on a device."""
        cfg, chip = self.cfg, self.ctx.topology.chips[device]
        slow = self.ctx.slow.get(device, 1.0)
        pp, dp = resolve_precision(chip, self.prefill), resolve_precision(chip, self.decode)
        prompt = sum(r[1] for r in batch)
        steps = max(r[2] for r in batch)
        kv_token = 2 * cfg.layers * cfg.hidden * BYTES[dp]
        pre_f, pre_b = 2 * cfg.params * prompt, cfg.params * BYTES[pp] + prompt * kv_token
        pre = float(
            roofline_ns(chip, pre_f, pre_b, pp, slow, self.eff.of(chip.efficiency, "gemm", pp))
        )
        n_chunks = -(-steps // cfg.decode_chunk)
        k = np.minimum(cfg.decode_chunk, steps - cfg.decode_chunk * np.arange(n_chunks))
        context = prompt + len(batch) * (cfg.decode_chunk * np.arange(n_chunks) + k / 2)
        dec_f = 2 * cfg.params * len(batch) * k
        dec_b = k * (cfg.params * BYTES[dp] + context * kv_token)
        d_eff = self.eff.of(chip.efficiency, "gemm", dp)
        dec = roofline_ns(chip, dec_f, dec_b, dp, slow, d_eff) + chip.launch_overhead_ns * (k - 1)
        return (
            pre,
            dec,
            {"pp": pp, "dp": dp, "pre_f": pre_f, "pre_b": pre_b, "dec_f": dec_f, "dec_b": dec_b},
        )

    def step(self, i: int) -> float:
        """Form, place and emit batch i; returns when it finishes (virtual ns)."""
        close, batch = self.form_batch()
        return self.run_batch(i, close, batch)

    def place(self, i: int, close: float, batch: list[tuple[float, int, int]]) -> tuple[str, float]:
        """(device, start) of batch i, closed at `close`, under the run's schedule policy."""
        if self.ctx.schedule == "dynamic":  # earliest finish time, given each device's queue
            est = {
                d: max(close, self.free[d]) - close + _total(self.costs(d, batch))
                for d in self.devices
            }
            device = assign(
                [f"b{i}"], self.devices, est, dict.fromkeys(self.devices, 0.0), "dynamic"
            )[f"b{i}"]
        else:
            device = self.devices[i % len(self.devices)]
        return device, max(close, self.free[device]) + self.ctx.delay.get(device, 0.0)

    def run_batch(self, i: int, close: float, batch: list[tuple[float, int, int]]) -> float:
        """Place and emit a formed batch i; returns when it finishes (virtual ns)."""
        device, start = self.place(i, close, batch)
        end = emit_batch(self, device, batch, start)
        self.free[device] = end
        return end


def _total(costs: tuple[float, np.ndarray, dict]) -> float:
    return costs[0] + float(costs[1].sum())


def serving_capacity(
    topology: str | Topology,
    options: Mapping[str, Any] | None = None,
    schedule: str = "static",
    precision: str = "bf16",
) -> float:
    """Requests per second an inference workload (`options`: InferConfig's knobs) can
    serve on a fault-free `topology` (Inference.capacity): a steady rate sits below it."""
    from chiptrace.emulator.network import Network
    from chiptrace.emulator.topology_files import load_topology

    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    ctx = Context(topo, Network(topo), None, precision, schedule, {}, {})  # type: ignore[arg-type]
    return Inference(ctx, InferConfig(**(options or {}))).capacity()
