"""Calibrate from a real trace: a step's device work per rank and stream, by op class, with
the efficiencies the trace lets us fit. `workload=replay` (replay.py) runs it on any rack.

Input: a trace dir with profiler steps (`chiptrace import` of PyTorch profiler files: roots
named `ProfilerStep#N`, one trace per step shared by the ranks, device spans on `gpu:` or
`npu:` chips). Each device span becomes an op: its stream (`thread.id`), its start within
the step, its duration, and an op class from its kernel name (`gemm`, `attention`,
`elementwise`, `optimizer`; NCCL kernels are `comm` with their collective and bytes;
host-device copies are `copy` transfers).

What is fitted, and from what:
- comm: the fraction of the source machine's links the job's collectives reach: the
  collectives' time on the source rack at full link speed (collectives.py) over their
  measured time. NCCL kernel times include waiting for the other ranks, so this is the
  job's effective figure, not NCCL's best.
- compute classes: FLOPs over (time x peak) where the trace gives FLOPs (`op_flops`);
  otherwise the source chip's preset figure (cited in its preset file) is assumed. Either
  way the work of an op is its time at the source's effective rate, so replaying on the
  source machine gives the trace's own times back.
"""

from __future__ import annotations

import bisect
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.topology_files import ChipSpec, Topology, load_topology

CLASSES = ("gemm", "attention", "elementwise", "optimizer", "comm", "copy")
# First match wins; everything else is elementwise (memory-bound kernels, reductions).
_RULES = (
    ("comm", r"nccl|rccl"),
    ("attention", r"flash|fmha|attention|sdpa|_attn"),
    ("optimizer", r"adam|adagrad|lamb\b|sgd|optimizer|multi_tensor_apply"),
    ("gemm", r"gemm|cutlass|xmma|cublas|matmul|wgrad|dgrad|fprop|_mma|scudnn|conv"),
)
_PRECISION = (  # from the GEMM kernels' names, weighted by their time
    ("fp8", r"e4m3|e5m2|fp8"),
    ("bf16", r"bf16|bfloat16"),
    ("fp16", r"f16|h1688|h16816|half|hgemm"),
    ("fp32", r"tf32|s1688|s16816|sgemm|float|f32"),
)
# A GPU model named in a trace's resource -> the preset of its machine (first match).
MACHINES = (
    (r"GB200", "nvl72"),
    (r"B200", "rack6"),
    (r"H100", "h100x8"),
    (r"A100.*PCIe", "pcie8"),
    (r"A100", "a100x8"),
)
WHOLE = "*"  # the step id of a trace without profiler steps: all of it is one step


def op_class(kernel: str, op_kind: str, has_link: bool) -> str:
    """The op class of a device span from its name and kind."""
    if op_kind == "comm":
        return "comm"
    if op_kind == "memcpy" and has_link:
        return "copy"
    low = kernel.lower()
    for cls, pattern in _RULES:
        if re.search(pattern, low):
            return cls
    return "elementwise"


@dataclass
class StepOps:
    """One rank's device ops in one step, in start order (times in ns from the step start)."""

    stream: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    cls: list[str]
    name: list[str]
    kind: list[str]
    nbytes: np.ndarray
    collective: list[str]
    group: np.ndarray
    members: list[tuple[int, ...]]  # the group's global ranks where the trace names them


@dataclass
class Profile:
    """What calibration learned: the source machine, its steps and their ops, the fits."""

    source: Topology
    gpu: ChipSpec
    precision: str
    ranks: list[str]
    steps: list[tuple[str, float]]  # (name, duration ns)
    ops: list[dict[str, StepOps]]  # per step: rank chip id -> its ops
    world: int = 1  # ranks in the job (the profiler's distributedInfo), the trace's at least
    fitted: dict[str, float] = field(default_factory=dict)  # class -> efficiency
    basis: dict[str, str] = field(default_factory=dict)  # class -> "fitted" | "preset"

    def class_ms(self) -> dict[str, float]:
        """Device time per class, ms per step per rank (median step's mix)."""
        out: dict[str, float] = {}
        for step in self.ops:
            for ops in step.values():
                for c, d in zip(ops.cls, ops.dur, strict=True):
                    out[c] = out.get(c, 0.0) + float(d)
        norm = max(1, len(self.ops) * len(self.ranks)) * 1e6
        return {c: round(v / norm, 3) for c, v in sorted(out.items())}


def load(trace_dir: str | Path, source: str = "") -> Profile:
    """Read a trace dir's profiler steps and device ops.

    Raises:
        WorkloadError: no such dir, no profiler steps or no device work in them, or a
            GPU model this module cannot place on a preset (pass `source`).
    """
    from chiptrace.query import connect

    path = Path(trace_dir)
    if not path.is_dir():
        raise WorkloadError(f"calibrate {trace_dir}: not a trace directory")
    con = connect(path)
    steps = con.sql(
        "SELECT trace_id, name, min(start_ns), max(end_ns) FROM spans "
        "WHERE parent_span_id IS NULL AND regexp_matches(name, '^ProfilerStep#[0-9]+$') "
        "GROUP BY 1, 2 ORDER BY 3"
    ).fetchall()
    # A root's trace is its step; a trace without profiler steps (torch.profiler run with
    # no schedule) is one step from its first span to its last.
    starts = "SELECT trace_id, min(start_ns) AS start_ns FROM spans WHERE parent_span_id IS NULL GROUP BY 1"
    if not steps:
        steps = con.sql(
            f"SELECT '{WHOLE}', 'trace', min(start_ns), max(end_ns) FROM spans"
        ).fetchall()
        starts = (
            "SELECT DISTINCT trace_id, (SELECT min(start_ns) FROM spans) AS start_ns FROM spans"
        )
    if steps[0][2] is None:
        raise WorkloadError(f"calibrate {trace_dir}: the trace holds no spans")
    rows = con.sql(
        f"""SELECT s.trace_id, d.chip_id, d.name, d.op_kind, d.link_id IS NOT NULL,
                  d.start_ns, d.duration_ns, coalesce(d.op_bytes, 0),
                  coalesce(d.op_flops, 0),
                  coalesce(json_extract_string(d.attributes, '$."thread.id"'), '0'),
                  coalesce(json_extract_string(d.attributes, '$."Collective name"'), ''),
                  coalesce(TRY_CAST(json_extract(d.attributes, '$."Group size"') AS INTEGER), 0),
                  d.resource,
                  coalesce(json_extract_string(d.attributes, '$."Process Group Ranks"'), '')
           FROM spans d JOIN ({starts}) s USING (trace_id)
           WHERE d.chip_type IN ('gpu', 'npu') AND d.duration_ns >= 0
           ORDER BY d.chip_id, d.start_ns"""
    ).fetchall()
    if not rows:
        what = "the trace holds" if steps[0][0] == WHOLE else "its profiler steps hold"
        raise WorkloadError(f"calibrate {trace_dir}: {what} no GPU or NPU work to replay")
    topo = _source(trace_dir, source, rows)
    gpu = next(c for c in topo.chips.values() if c.type == "gpu")
    prof = _build(topo, gpu, steps, rows)
    prof.world = max([len(prof.ranks), *_world_sizes(rows)])
    return prof


def _world_sizes(rows: list) -> list[int]:
    """The job's world size as each rank's resource states it (`distributed.world_size`)."""
    out: list[int] = []
    for r in {r[12] for r in rows if r[12]}:
        size = json.loads(r).get("distributed.world_size")
        if isinstance(size, int) and size > 0:
            out.append(size)
    return out


def _source(trace_dir: str | Path, source: str, rows: list) -> Topology:
    if source:
        return load_topology(source)
    names: set[str] = set()
    for r in {r[12] for r in rows if r[12]}:
        names.update(json.loads(r).get("device.names") or [])
    preset = machine_of(names)
    if preset:
        return load_topology(preset)
    what = ", ".join(sorted(names)) or "no GPU model"
    presets = ", ".join(dict.fromkeys(p for _, p in reversed(MACHINES)))
    raise WorkloadError(
        f"calibrate {trace_dir}: the trace names {what}, which no preset describes; pass "
        f"the machine it ran on with --set source=PRESET ({presets}) or a topology TOML"
    )


def machine_of(names: set[str] | list[str]) -> str | None:
    """The preset of the machine whose GPUs a trace names (`device.names`), if any."""
    for pattern, preset in MACHINES:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            return preset
    return None


def _build(topo: Topology, gpu: ChipSpec, steps: list, rows: list) -> Profile:
    ids = {s[0] for s in steps}
    # A kernel is in the step whose time it starts in, not the step that launched it: a
    # GPU that runs behind its host runs step N's last kernels while the host is in step
    # N+1, interleaved on their streams with N+1's first, and the replay follows each
    # stream in time order (by launching step it pushed N+1's early kernels after N's last).
    starts = [float(s[2]) for s in steps]
    per: list[dict[str, list]] = [{} for _ in steps]
    flops: dict[str, list[float]] = {}
    for tid, chip, name, kind, link, start, dur, nb, fl, stream, coll, group, _, pg in rows:
        if tid not in ids and WHOLE not in ids:
            continue
        step = max(bisect.bisect_right(starts, start) - 1, 0)
        cls = op_class(name, kind, link)
        per[step].setdefault(chip, []).append(
            (
                _stream(stream),
                start - starts[step],
                dur,
                cls,
                name,
                kind,
                nb,
                coll,
                group,
                _members(pg),
            )
        )
        if fl > 0:
            flops.setdefault(cls, [0.0, 0.0])
            flops[cls][0] += fl
            flops[cls][1] += dur
    ranks = sorted({c for step in per for c in step}, key=_rank_order)
    ops = [{c: _ops(v) for c, v in step.items()} for step in per]
    prof = Profile(
        topo,
        gpu,
        _precision(ops, gpu),
        ranks,
        [(s[1], float(s[3] - s[2])) for s in steps],
        ops,
    )
    for cls, (fl, ns) in flops.items():
        if cls in ("gemm", "attention") and ns > 0:
            prof.fitted[cls] = min(1.0, fl / (ns / 1e9) / gpu.peak_flops[prof.precision])
            prof.basis[cls] = "fitted"
    return prof


def _ops(items: list) -> StepOps:
    items.sort(key=lambda x: x[1])
    col = list(zip(*items, strict=True))
    return StepOps(
        np.array(col[0], np.int64),
        np.array(col[1], np.float64),
        np.array(col[2], np.float64),
        list(col[3]),
        list(col[4]),
        list(col[5]),
        np.array(col[6], np.float64),
        list(col[7]),
        np.array(col[8], np.int64),
        list(col[9]),
    )


def _stream(text: str) -> int:
    """A kernel's stream from its `thread.id`: `7`, or `stream 7` as PyTorch 1.8-1.9
    profilers write it; a name without a number keeps a stable number of its own."""
    m = re.search(r"\d+", text)
    return int(m.group()) if m else zlib.crc32(text.encode())


def _members(text: str) -> tuple[int, ...]:
    """A kernel's `Process Group Ranks` ("[0, 1]"): the group's global ranks; () where the
    trace does not say (or elides them, as the profiler does for big groups: "[0, ..., 127]")."""
    try:
        ranks = json.loads(text) if text else []
    except ValueError:
        return ()
    ok = isinstance(ranks, list) and all(isinstance(r, int) for r in ranks)
    return tuple(ranks) if ok else ()


def _precision(ops: list[dict[str, StepOps]], gpu: ChipSpec) -> str:
    weight: dict[str, float] = {}
    for step in ops:
        for o in step.values():
            for cls, name, d in zip(o.cls, o.name, o.dur, strict=True):
                if cls != "gemm":
                    continue
                low = name.lower()
                p = next((p for p, pat in _PRECISION if re.search(pat, low)), "bf16")
                weight[p] = weight.get(p, 0.0) + float(d)
    best = max(weight, key=weight.__getitem__) if weight else "bf16"
    return best if best in gpu.peak_flops else "bf16"


def _rank_order(chip: str) -> tuple[int, str]:
    m = re.match(r"rank(\d+)/", chip)
    return (int(m.group(1)) if m else 0, chip)
