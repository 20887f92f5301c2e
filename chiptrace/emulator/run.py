"""`emulate(...)`: run a workload on a rack and write its spans to a trace directory.

The run streams: each step's (or batch's) spans go to a SpanTable, which hands the recorder
a batch every chunk; the recorder's writer thread writes Parquet parts (and feeds any extra
sinks, such as a live viewer) while the next steps are computed. Memory stays at a chunk or
two whatever the run's length.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chiptrace.config import Config
from chiptrace.emulator.context import Context
from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.faults import Fault, apply_faults, link_state, parse_fault
from chiptrace.emulator.network import Network
from chiptrace.emulator.scheduler import SCHEDULES
from chiptrace.emulator.spans import SpanTable
from chiptrace.emulator.topology_files import Topology, load_topology
from chiptrace.recorder import Recorder, SpanSink, StoreSink
from chiptrace.schema import PRECISIONS, dumps
from chiptrace.store import PartWriter

# Virtual t = 0 of a run that is not paced to wall time: a fixed instant, so the same seed
# gives the same span table, times included (2026-01-01T00:00:00Z).
FIXED_EPOCH_NS = 1_767_225_600_000_000_000
SERVICE = "chiptrace-emulator"


@dataclass
class EmulationResult:
    """What a run did: where its spans are and the headline figures."""

    out: Path
    spans: int
    steps: int
    virtual_ns: float
    wall_s: float
    workload: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    stored: int = 0  # spans written to the store (`spans` is what the run made)
    dropped: int = 0
    error: str | None = None  # why the store failed, if it did (a full disk)
    lost: dict[str, list[str]] = field(default_factory=dict)  # down link -> chips cut off

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.wall_s if self.wall_s > 0 else 0.0


def _workloads() -> dict[str, tuple[type, type]]:
    from chiptrace.emulator.infer import InferConfig, Inference
    from chiptrace.emulator.mixed import Mixed, MixedConfig
    from chiptrace.emulator.replay import Replay, ReplayConfig
    from chiptrace.emulator.train import TrainConfig, Training

    return {
        "train": (TrainConfig, Training),
        "infer": (InferConfig, Inference),
        "mixed": (MixedConfig, Mixed),
        "replay": (ReplayConfig, Replay),
    }


def _coerce(name: str, raw: Any, default: Any) -> Any:
    if not isinstance(raw, str) or isinstance(default, str):
        return raw
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return type(default)(float(raw)) if isinstance(default, int) else type(default)(raw)
    except ValueError:
        raise WorkloadError(
            f"workload {name} = {raw!r}: expected a {type(default).__name__}"
        ) from None


def make_config(kind: str, options: Mapping[str, Any] | None = None) -> Any:
    """The knobs dataclass of workload `kind` with `options` (strings coerced) applied.

    Raises:
        WorkloadError: an unknown workload or knob, or a value of the wrong kind.
    """
    registry = _workloads()
    if kind not in registry:
        raise WorkloadError(f"unknown workload {kind!r}; expected one of {', '.join(registry)}")
    cls = registry[kind][0]
    cfg = cls()
    fields = {f.name for f in dataclasses.fields(cls)}
    for key, raw in (options or {}).items():
        if key not in fields:
            raise WorkloadError(
                f"unknown {kind} workload knob {key!r}; expected one of {', '.join(sorted(fields))}"
            )
        setattr(cfg, key, _coerce(key, raw, getattr(cfg, key)))
    return cfg


class _Progress:
    """A one-line progress bar on stderr, redrawn at most 5 times a second."""

    def __init__(self, total: int | None, enabled: bool) -> None:
        self.total, self.enabled, self.last = total, enabled, 0.0

    def update(self, done: int, spans: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 0.2):
            return
        self.last = now
        frac = done / self.total if self.total else 0.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r[{bar:<30}] {done}/{self.total or '?'} steps, {spans:,} spans")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def emulate(
    topology: str | os.PathLike[str] | Topology = "rack6",
    workload: str = "train",
    steps: int | None = 20,
    seed: int = 0,
    out: str | os.PathLike[str] | None = None,
    faults: Sequence[str] = (),
    precision: str = "bf16",
    schedule: str = "static",
    realtime: bool = False,
    speed: float = 1.0,
    sinks: Iterable[SpanSink] = (),
    options: Mapping[str, Any] | None = None,
    duration_s: float | None = None,
    progress: bool | None = None,
    chunk_spans: int = 262_144,
    id_seed: int | None = None,
) -> EmulationResult:
    """Run `workload` on `topology` and write its spans under `out`.

    Args:
        topology: a preset name (`rack6`, `nvl72`, `pcie8`, `a100x8`, `h100x8`), a TOML path,
            or a Topology.
        workload: `train`, `infer`, `mixed` (training on GPUs, serving on NPUs, see mixed.py)
            or `replay` (a real trace replayed, options={"calibrate": DIR}, see replay.py).
        steps: training steps or inference batches (None: until `duration_s` of virtual time).
        seed: the same seed and inputs give the same span table, ids and times included.
        out: trace directory (default `chiptrace-traces/emulate-<time>`).
        faults: `KIND:TARGET[:VALUE]` strings (see chiptrace.emulator.faults).
        precision: compute precision (training; inference's default for both phases).
        schedule: `static` or `dynamic` placement of heterogeneous work.
        realtime: pace the run to wall time (virtual time maps to wall time from the start).
        speed: with realtime, virtual seconds per wall second.
        sinks: extra span sinks (a live viewer) fed alongside the store.
        options: workload knobs (see TrainConfig / InferConfig), values may be strings.
        duration_s: stop once this much virtual time has passed.
        progress: draw a progress bar (default: when stderr is a terminal and not realtime).
        chunk_spans: spans handed to the recorder at a time (bounds memory).
        id_seed: seed of the span and trace ids when it must differ from `seed` (a run
            appended to a trace dir that already holds this seed's ids); times stay `seed`'s.

    Raises:
        ChiptraceError: bad topology, workload, fault, precision or schedule.
    """
    _check_args(precision, schedule, steps, duration_s, speed)
    topo = topology if isinstance(topology, Topology) else load_topology(os.fspath(topology))
    parsed: list[Fault] = [parse_fault(f, topo) for f in faults]
    effects = apply_faults(topo, parsed)
    cfg = make_config(workload, options)
    out_dir = Path(out or f"chiptrace-traces/emulate-{time.strftime('%Y%m%d-%H%M%S')}")
    epoch = time.time_ns() if realtime else FIXED_EPOCH_NS
    net = Network(
        effects.topology, effects.bandwidth, [f.target for f in parsed if f.kind == "down"]
    )
    ctx = Context(
        effects.topology,
        net,
        None,  # type: ignore[arg-type]  # the span table: set once the workload validates
        precision,
        schedule,
        effects.slow,
        effects.delay_ns,
    )
    try:  # validates (fit in memory, routes) before any file
        wl = _workloads()[workload][1](ctx, cfg)
    except WorkloadError as e:
        if not effects.lost:
            raise
        gone = sorted({c for chips in effects.lost.values() for c in chips})
        raise WorkloadError(f"{e}; the downed links cut off {', '.join(gone)}") from None
    manifest = {
        "source": "emulator",
        "service": SERVICE,
        "run_id": out_dir.name,
        "topology": topo.to_manifest(),
        "faults": [f.to_manifest() for f in parsed],
        "link_state": link_state(parsed, effects.lost),
        "workload": wl.describe(),
        "emulation": {
            "seed": seed,
            **({"id_seed": id_seed} if id_seed is not None else {}),
            "steps": steps,
            "precision": precision,
            "schedule": schedule,
            "realtime": realtime,
            "speed": speed,
            "epoch_ns": epoch,
        },
    }
    writer = PartWriter(out_dir, manifest=manifest)
    config = Config(
        dir=out_dir,
        service=SERVICE,
        flush_spans=chunk_spans,
        max_buffered=2 * chunk_spans,
        flush_interval_s=0.25 if realtime else 2.0,
        host=f"emulated-{topo.name}",
    )
    # A live (realtime) run keeps its manifest's counts current at every flush; a batch run
    # writes it once at the end: nvl72's topology makes it ~300 KB, and rewriting that at
    # every flush cost about a tenth of the run.
    recorder = Recorder(config, [StoreSink(writer), *sinks], writer=writer if realtime else None)
    constants = {
        "service": SERVICE,
        "host": config.host,
        "pid": 0,
        "scope": "chiptrace.emulator",
        "resource": dumps(
            {"service.name": SERVICE, "chiptrace.topology": topo.name, "chiptrace.seed": seed}
        ),
    }
    ctx.table = SpanTable(
        effects.topology,
        net,
        np.random.default_rng(seed if id_seed is None else id_seed),
        epoch,
        lambda b: recorder.write_batch(b, block=True),
        constants,
        chunk_spans,
    )
    bar = _Progress(
        steps, progress if progress is not None else (sys.stderr.isatty() and not realtime)
    )
    wall0 = time.monotonic()
    try:
        done, virtual = _drive(wl, ctx.table, steps, duration_s, speed if realtime else None, bar)
    finally:
        recorder.shutdown()
    bar.update(done, ctx.table.total, final=True)
    wall = time.monotonic() - wall0
    emulation = {
        **manifest["emulation"],
        "steps": done,
        "virtual_ns": virtual,
        "spans": ctx.table.total,
    }
    error = recorder.store_error
    try:
        writer.write_manifest(emulation=emulation, spans_dropped=recorder.dropped)
    except OSError as e:
        error = error or str(e.strerror or e)
    return EmulationResult(
        out_dir,
        ctx.table.total,
        done,
        virtual,
        wall,
        manifest["workload"],
        manifest["faults"],
        stored=writer.spans_written,
        dropped=recorder.dropped,
        error=error,
        lost=effects.lost,
    )


def _check_args(
    precision: str, schedule: str, steps: int | None, duration_s: float | None, speed: float
) -> None:
    if precision not in PRECISIONS:
        raise WorkloadError(
            f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}"
        )
    if schedule not in SCHEDULES:
        raise WorkloadError(
            f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}"
        )
    if steps is None and duration_s is None:
        raise WorkloadError("give steps or duration_s")
    if steps is not None and steps < 1:
        raise WorkloadError(f"steps = {steps!r}: expected an integer >= 1")
    if not speed > 0:
        raise WorkloadError(f"speed = {speed!r}: expected a number > 0")


def _drive(
    wl: Any,
    table: SpanTable,
    steps: int | None,
    duration_s: float | None,
    speed: float | None,
    bar: _Progress,
) -> tuple[int, float]:
    """Run steps until `steps` or `duration_s`; with a `speed`, pace them to wall time:
    a step's spans are handed over once the wall clock reaches the step's end, so a live
    view never shows work from its future. Returns (steps done, virtual end)."""
    wall0 = time.monotonic()
    done, virtual = 0, 0.0
    while (steps is None or done < steps) and (duration_s is None or virtual < duration_s * 1e9):
        table.begin_step()
        virtual = max(virtual, wl.step(done))
        done += 1
        if speed is not None:
            time.sleep(max(0.0, wall0 + virtual / 1e9 / speed - time.monotonic()))
            table.flush()
        else:
            table.maybe_flush()
        bar.update(done, table.total + table.pending)
    table.flush()
    return done, virtual
