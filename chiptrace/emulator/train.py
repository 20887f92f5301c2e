"""Data-parallel training on the emulated rack, one step at a time, in NumPy.

A step, per GPU rank: DPUs preprocess the rank's input (prefetched one step ahead), a
host-to-device copy moves it to the GPU (PCIe or C2C, whatever the route is), forward and
backward run layer by layer, gradients are all-reduced in buckets (ring or tree; overlapped
with backward or not), and the optimizer updates on the GPUs or on the CPUs (gradients down,
parameters back up). The regular parts (layers, collective rounds) are vectorized; the
irregular traffic (input copies, offload copies) goes through the fluid fair-share model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from chiptrace.emulator import collectives
from chiptrace.emulator.context import Context
from chiptrace.emulator.efficiency import Efficiency, check_mode
from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.fabric import Fabric
from chiptrace.emulator.ingest import Ingest
from chiptrace.emulator.layered import ATTN_SHARE
from chiptrace.emulator.op_cost import BYTES, resolve_precision
from chiptrace.emulator.scheduler import balanced
from chiptrace.emulator.train_step import run_step

_ADAM_BYTES = 12.0  # fp32 master weights + two moments per parameter
_ACT_FACTOR = 16.0  # activations kept per token, per layer, in units of hidden * bytes


@dataclass
class TrainConfig:
    """Knobs of the training workload (all settable with `--set key=value`)."""

    layers: int = 16
    hidden: int = 4096
    batch: int = 4  # sequences per GPU per step
    seq: int = 2048
    bucket_mb: float = (
        1600.0  # gradient bucket size; small buckets make the all-reduce latency-bound
    )
    overlap: bool = True  # all-reduce buckets while backward still runs
    allreduce: str = "ring"  # ring | tree | auto (the faster for each bucket size, as NCCL)
    channels: int = 0  # collective channels; 0 = one per parallel switch plane
    optimizer: str = "gpu"  # gpu | cpu (ZeRO-offload style: gradients down, parameters up)
    input_mb: float = 64.0  # raw input per GPU per step, preprocessed on a DPU
    preprocess_flops_per_byte: float = 50.0  # DPU work per input byte (decode, augment, tokenize)
    prefetch: bool = True  # preprocess step s+1 while step s computes
    host_load_flops_per_byte: float = (
        0.0  # > 0: input comes in via NIC and a CPU load stage (ingest.py)
    )
    switch_ops: bool = (
        False  # `forward` op spans on the switches the all-reduce crosses (fabric.py)
    )
    efficiency: str = "preset"  # preset | ideal | a fraction (efficiency.py)
    sharding: str = "ddp"  # ddp (replicated, all-reduce) | fsdp (ZeRO-3, layered.py)
    moe: bool = False  # expert-parallel MLPs, one expert per GPU (layered.py)

    @property
    def params_per_layer(self) -> float:
        return 12.0 * self.hidden**2

    @property
    def params(self) -> float:
        return self.params_per_layer * self.layers

    def check(self) -> None:
        """Raises WorkloadError for out-of-range knobs."""
        for k in ("layers", "hidden", "batch", "seq"):
            if getattr(self, k) < 1:
                raise WorkloadError(
                    f"workload {k} = {getattr(self, k)!r}: expected an integer >= 1"
                )
        for k in ("bucket_mb", "input_mb", "preprocess_flops_per_byte"):
            if not getattr(self, k) > 0:
                raise WorkloadError(f"workload {k} = {getattr(self, k)!r}: expected a number > 0")
        if not self.host_load_flops_per_byte >= 0:
            raise WorkloadError(
                f"workload host_load_flops_per_byte = {self.host_load_flops_per_byte!r}: expected a number >= 0"
            )
        if self.allreduce not in collectives.ALGORITHMS:
            raise WorkloadError(
                f"workload allreduce = {self.allreduce!r}: expected ring, tree or auto"
            )
        check_mode(self.efficiency)
        if self.sharding not in ("ddp", "fsdp"):
            raise WorkloadError(f"workload sharding = {self.sharding!r}: expected ddp or fsdp")
        if self.sharding == "fsdp" and self.optimizer != "gpu":
            raise WorkloadError("workload sharding = 'fsdp' needs optimizer = 'gpu'")
        if self.optimizer not in ("gpu", "cpu"):
            raise WorkloadError(f"workload optimizer = {self.optimizer!r}: expected gpu or cpu")


def memory_bytes(cfg: TrainConfig, precision: str, gpus: int) -> float:
    """Per-GPU footprint: weights and activations at the compute precision, bf16 (or fp32)
    gradients, Adam state when the optimizer runs on the GPU."""
    w = BYTES[precision]
    g = 4.0 if precision == "fp32" else 2.0
    states = _ADAM_BYTES if cfg.optimizer == "gpu" else 0.0
    acts = cfg.batch * cfg.seq * cfg.hidden * cfg.layers * _ACT_FACTOR * w
    if cfg.sharding == "fsdp":  # a shard of everything, plus two layers gathered at a time
        return cfg.params * (w + g + states) / gpus + 2 * cfg.params_per_layer * w + acts
    return cfg.params * (w + g + states) + acts


class Training:
    """The training workload bound to a run context; `step(s)` emits one step's spans."""

    def __init__(self, ctx: Context, cfg: TrainConfig) -> None:
        cfg.check()
        self.ctx, self.cfg = ctx, cfg
        topo = ctx.topology
        self.gpus = topo.of_type("gpu")
        if not self.gpus:
            raise WorkloadError(f"topology {topo.name} has no GPUs to train on")
        self.dpus = topo.of_type("dpu") or topo.of_type("cpu")
        if not self.dpus:
            raise WorkloadError(
                f"topology {topo.name} has no DPU or CPU to feed the GPUs their input; "
                "add one, or run --workload infer"
            )
        self.cpus = topo.of_type("cpu")
        if cfg.optimizer == "cpu" and not self.cpus:
            raise WorkloadError(f"workload optimizer = 'cpu' but topology {topo.name} has no CPU")
        g0 = topo.chips[self.gpus[0]]
        self.precision = resolve_precision(g0, ctx.precision)
        self.grad_bytes = 4.0 if self.precision == "fp32" else 2.0
        need = memory_bytes(cfg, self.precision, len(self.gpus))
        small = min(self.gpus, key=lambda g: topo.chips[g].memory_bytes)
        if need > topo.chips[small].memory_bytes:
            raise WorkloadError(
                f"workload does not fit: needs {need / 1e9:.1f} GB per GPU, {small} "
                f"({topo.chips[small].model}) has {topo.chips[small].memory_bytes / 1e9:.0f} GB; "
                "lower layers, hidden or batch, or use a narrower precision"
            )
        self.memory_per_gpu = need
        net = ctx.network
        # Each GPU's host: its nearest CPU (none without CPUs; the CPU paths require them).
        self.host: dict[str, str] = (
            balanced(self.gpus, lambda g: net.nearest(g, self.cpus), self.cpus[0])
            if self.cpus
            else {}
        )
        # Static placement feeds each GPU from its nearest DPU (the one on its own host),
        # equally near ones dealt round robin.
        self.home_dpu = balanced(self.gpus, lambda g: net.nearest(g, self.dpus), self.dpus[0])
        self.buckets = self._buckets()
        self.dpu_free = dict.fromkeys(self.dpus, 0.0)
        self.plans: dict[object, collectives.Plan] = {}  # per bucket size (and kind)
        self.eff = Efficiency(cfg.efficiency)
        self.comm_eff = self.eff.of(g0.efficiency, "comm", self.precision)
        self.t = 0.0  # end of the previous step
        # Optional host path and switch ops.
        self.ingest = Ingest(self) if cfg.host_load_flops_per_byte > 0 else None
        self.fabric = Fabric(ctx) if cfg.switch_ops else None
        self.prev_start = 0.0
        self.prev_trace: int | None = None  # the previous step's trace and root: where the
        self.prev_root = 0  # prefetched input of the next step is recorded

    def _buckets(self) -> list[tuple[int, float]]:
        """Gradient buckets as (last layer whose gradients they hold, bytes): layers in
        backward order, cut every bucket_mb, as DDP's bucketing of parameter tensors does.
        Small buckets mean many collectives, each paying the ring's 2(n-1) latencies."""
        share = ATTN_SHARE if self.cfg.moe else 1.0  # experts' grads stay on their GPU
        per_layer = self.cfg.params_per_layer * share * self.grad_bytes
        if self.cfg.sharding == "fsdp":  # one reduce-scatter per layer
            return [(layer, per_layer) for layer in reversed(range(self.cfg.layers))]
        cap = self.cfg.bucket_mb * 1e6
        out: list[tuple[int, float]] = []
        fill = 0.0
        for layer in reversed(range(self.cfg.layers)):
            left = per_layer
            while left > 0:
                take = min(left, cap - fill)
                fill += take
                left -= take
                if fill >= cap * (1 - 1e-9):
                    out.append((layer, fill))
                    fill = 0.0
        if fill > 0:
            out.append((0, fill))
        return out

    def describe(self) -> dict[str, object]:
        return {
            "kind": "train",
            **asdict(self.cfg),
            "params": self.cfg.params,
            "precision": self.precision,
            "memory_bytes_per_gpu": self.memory_per_gpu,
            "buckets": len(self.buckets),
        }

    def step(self, s: int) -> float:
        """Emit step `s`; returns its end (virtual ns)."""
        start = self.t
        end = run_step(self, s, start)
        self.prev_start, self.t = start, end
        return end
