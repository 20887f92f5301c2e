"""A served workload's batcher run again, so that a change re-forms its batches.

Replaying the batches as they ran (serving.py's graph) keeps each one's requests: a device
made faster would still serve the batches it was dealt. But a batcher under load fills a
batch while every device is busy, so a faster device frees sooner and takes its next batch
smaller and sooner, and every later batch changes. Here the batching policy the run's
manifest records (the emulator's, chiptrace/emulator/infer.py) runs again over the run's
own requests (arrival, prompt and output tokens), with each batch priced on its device by
batch_costs.py:

- a batch opens with the oldest queued request and closes when its prompts fill the token
  budget (at the arrival of the last that fits), or when that request has waited
  `max_wait_ms`, or, if later, when the first device is free (plus its delay), taking
  every request that arrived by then up to the budget;
- `static` deals batch i to the i-th device in turn; `dynamic` to the device on which it
  would finish first;
- it starts once it closed and its device is free, plus the device's delay.

A device's delay (a straggler's) is the least that any batch on it started after it could
have (its device free, its last request in, and its wait for more over unless it was full).
Unchanged, the replay must give back the run's mean request latency within FIT, else it
is not used (a mixed run's batches also wait for its training steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from chiptrace.analysis.batch_costs import Batch, Costs, Request, load, manifest_policy
from chiptrace.analysis.tables import _manifests
from chiptrace.topology import Topology

FIT = 0.03  # the unchanged replay's mean latency within this share of the measured one


@dataclass(frozen=True)
class Policy:
    """How the run formed and placed its batches."""

    budget: int
    max_wait_ns: float
    devices: tuple[str, ...]
    chunk: int
    schedule: str

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Policy | None:
        try:
            return cls(
                int(raw["token_budget"]),
                float(raw["max_wait_ms"]) * 1e6,
                tuple(str(d) for d in raw["devices"]),
                int(raw.get("decode_chunk") or 16),
                str(raw.get("schedule") or "static"),
            )
        except (KeyError, TypeError, ValueError):
            return None


class Batcher:
    """The run's requests, policy and batch costs; `latencies` replays them."""

    def __init__(
        self, policy: Policy, costs: Costs, requests: list[Request], batches: list[Batch]
    ) -> None:
        self.policy, self.costs = policy, costs
        reqs = sorted(requests, key=lambda r: r.arrival)
        self.arrival = np.array([r.arrival for r in reqs], dtype=np.float64)
        self.prompt = [r.prompt for r in reqs]
        self.output = [r.output for r in reqs]
        self.out_sum = np.concatenate([[0], np.cumsum(self.output)])
        self.measured = float(np.mean([r.end - r.arrival for r in reqs])) if reqs else 0.0
        self.delay = _delays(batches, policy, max(self.prompt, default=0))
        self.batches = len(batches)
        self.placeable = list(policy.devices)  # load: those with batches to price
        self.cut_off: list[str] = []  # load: like devices that served nothing
        self.order: dict[str, tuple[int, int]] = {}
        self.paths: dict[str, list[str]] = {}  # per cut-off device: links from the entry
        self._cache: dict[tuple[str, int, int, int, float], float] = {}

    @classmethod
    def load(cls, con: Any, steps: Any, links: dict[int, str], topo: Topology) -> Batcher | None:
        """The batcher of a served run, or None: no policy recorded, a device without
        fitted costs, or an unchanged replay that does not give back the run."""
        raw = manifest_policy(_manifests(con))
        policy = Policy.of(raw) if raw else None
        if policy is None or not policy.devices:
            return None
        requests, batches = load(con, steps, links)
        costs = Costs(topo, batches, policy.chunk)
        priced = [d for d in policy.devices if costs.priced(d)]
        # Dealt in turn, every device ran batches; placed by earliest finish, a device that
        # never ran one stays out of the replay (it was never the first to finish one).
        if (
            not requests
            or not priced
            or (policy.schedule == "static" and len(priced) < len(policy.devices))
        ):
            return None
        b = cls(policy, costs, requests, batches)
        b.placeable = priced
        b._cut_off(topo)
        base = float(np.mean(b.latencies()))
        if abs(base - b.measured) > FIT * b.measured:
            return None
        b.base = base
        return b

    base: float = 0.0

    def _cut_off(self, topo: Topology) -> None:
        """Chips of the serving types that the run's pool left out (a server leaves out a
        device it cannot reach), the links between each and where requests come in, and
        every device's place in the round robin: the pool's types in turn, each in the
        topology's order."""
        kinds = list(dict.fromkeys(d.split(":", 1)[0] for d in self.policy.devices))
        chips = list(topo.chips)
        for i, c in enumerate(chips):
            kind = topo.chips[c].type
            if kind in kinds:
                self.order[c] = (kinds.index(kind), i)
                if c not in self.policy.devices:
                    self.cut_off.append(c)
        if self.cut_off:
            self.paths = _paths(topo, self.cut_off)

    def restorable(self, links: frozenset[str], topo: Topology) -> frozenset[str]:
        """The cut-off devices whose way in crosses one of `links` (back: the link up)."""
        return frozenset(d for d in self.cut_off if set(self.paths.get(d, ())) & links)

    def compute(self, device: str, n: int, prompt: int, steps: int, speed: float = 1.0) -> float:
        key = (device, n, prompt, steps, speed)
        if key not in self._cache:
            self._cache[key] = self.costs.compute(device, n, prompt, steps, speed)
        return self._cache[key]

    def latencies(
        self,
        speed: Mapping[str, float] | None = None,
        undelay: frozenset[str] = frozenset(),
        restore: frozenset[str] = frozenset(),
    ) -> np.ndarray:
        """The latency (ns, in arrival order) of every request the run's number of batches
        serve, with devices `speed` times faster and the delays of `undelay` removed. (A
        run of so many batches is what was measured: where a change makes batches smaller,
        fewer requests are served, as a re-run would serve them.) `restore`: cut-off
        devices back in the pool, costing what their peers do."""
        p, arr, n_req = self.policy, self.arrival, len(self.arrival)
        devices = list(p.devices)
        placeable = list(self.placeable)
        if restore:
            for d in restore:
                self.costs.adopt(
                    d, [c for c in placeable if c.split(":", 1)[0] == d.split(":", 1)[0]]
                )
            devices = sorted({*devices, *restore}, key=lambda d: self.order.get(d, (0, 0)))
            placeable = sorted({*placeable, *restore}, key=lambda d: self.order.get(d, (0, 0)))
        k = {d: float((speed or {}).get(d, 1.0)) for d in devices}
        delay = {d: 0.0 if d in undelay else self.delay.get(d, 0.0) for d in devices}
        free = dict.fromkeys(devices, float(arr[0]) if n_req else 0.0)
        lat = np.zeros(n_req)
        q = i = 0
        while q < n_req and i < self.batches:
            limit = max(arr[q] + p.max_wait_ns, min(free[d] + delay[d] for d in devices))
            j, tokens, close = self._form(q, limit)
            n, steps = j - q, max(self.output[q:j])

            def cost(d: str, n: int = n, tokens: int = tokens, steps: int = steps) -> float:
                return self.compute(d, n, tokens, steps, k[d])

            if p.schedule == "dynamic":  # an idle device still counts for `limit` above
                dev = min(placeable, key=lambda d: (max(close, free[d]) - close + cost(d), d))
            else:
                dev = devices[i % len(devices)]
            start = max(close, free[dev]) + delay[dev]
            out = int(self.out_sum[j] - self.out_sum[q])
            free[dev] = start + cost(dev) + self.costs.move(dev, tokens, out)
            lat[q:j] = free[dev] - arr[q:j]
            q, i = j, i + 1
        return lat[:q]

    def _form(self, q: int, limit: float) -> tuple[int, int, float]:
        """The batch that opens with request q, the batcher's `limit` given: (the first
        request after it, its prompt tokens, when it closed)."""
        arr, j, tokens = self.arrival, q, 0
        while j < len(arr) and arr[j] <= limit:
            if j > q and tokens + self.prompt[j] > self.policy.budget:
                return j, tokens, float(arr[j - 1])  # the budget filled at the last arrival
            tokens += self.prompt[j]
            j += 1
        return j, tokens, limit

    def saving(
        self,
        speed: Mapping[str, float],
        undelay: frozenset[str],
        restore: frozenset[str] = frozenset(),
    ) -> float:
        """How much the mean latency falls (ns) with the change."""
        return self.base - float(np.mean(self.latencies(speed, undelay, restore)))

    def capacity(self) -> dict[str, float]:
        """Requests per second each device serves at most: batches that fill the token
        budget with requests of the run's mean prompt (their longest output the run's
        quantile n/(n+1)), back to back, with its delay."""
        prompt = float(np.mean(self.prompt)) if self.prompt else 1.0
        n = max(int(self.policy.budget // max(prompt, 1.0)), 1)
        outs = sorted(self.output)
        steps = outs[min(len(outs) - 1, math.floor(len(outs) * n / (n + 1)))] if outs else 1
        out = {}
        for d in self.placeable:
            full = round(n * prompt)
            t = self.compute(d, n, full, steps) + self.costs.move(
                d, full, round(n * float(np.mean(self.output)))
            )
            out[d] = n / ((t + self.delay.get(d, 0.0)) / 1e9)
        return out

    def service_rate(self, capacity: Mapping[str, float]) -> float:
        """The pool's: dealt in turn (`static`), every device gets the same share and the
        slowest sets the pace; `dynamic` adds the devices up."""
        if self.policy.schedule == "static":
            return len(capacity) * min(capacity.values(), default=0.0)
        return sum(capacity.values())

    def arrival_rate(self) -> float:
        """Requests per second over the run's arrivals."""
        span = float(self.arrival[-1] - self.arrival[0]) if len(self.arrival) > 1 else 0.0
        return (len(self.arrival) - 1) / span * 1e9 if span > 0 else 0.0


def _delays(batches: list[Batch], policy: Policy, max_prompt: int) -> dict[str, float]:
    """Per device: the least any batch on it started after it could have."""
    free: dict[str, float] = {}
    late: dict[str, float] = {}
    for b in batches:
        if not b.requests:
            continue
        arrivals = sorted(r.arrival for r in b.requests)
        close = float(arrivals[-1])
        if b.prompt + max_prompt <= policy.budget:  # room for more: it waited out its time
            close = max(close, arrivals[0] + policy.max_wait_ns)
        gap = b.start - max(close, free.get(b.device, -math.inf))
        late[b.device] = min(late.get(b.device, math.inf), gap)
        free[b.device] = b.end
    return {d: max(v, 0.0) for d, v in late.items()}


def _paths(topo: Topology, devices: list[str]) -> dict[str, list[str]]:
    """Per device: the links of its shortest way from where requests come in (the first
    NIC, else the first CPU, as the emulator takes them), devices forwarding nothing."""
    entry = next((c for t in ("nic", "cpu") for c in topo.of_type(t)), None)
    if entry is None:
        return {}
    near: dict[str, list[tuple[str, str]]] = {}
    for lk in topo.links:
        if lk.src and lk.dst:
            near.setdefault(lk.src, []).append((lk.dst, lk.id))
            near.setdefault(lk.dst, []).append((lk.src, lk.id))
    came: dict[str, tuple[str, str]] = {}
    frontier, seen = [entry], {entry}
    while frontier:
        nxt = []
        for c in frontier:
            spec = topo.chips.get(c)
            if c != entry and spec is not None and spec.type in ("gpu", "npu"):
                continue  # a device is an end, not a hop
            for far, link in near.get(c, []):
                if far not in seen:
                    seen.add(far)
                    came[far] = (c, link)
                    nxt.append(far)
        frontier = nxt
    out = {}
    for d in devices:
        links, c = [], d
        while c in came:
            c, link = came[c]
            links.append(link)
        out[d] = links
    return out
