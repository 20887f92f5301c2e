"""The mixed workload: the whole rack at work, each chip type doing what it is for.

Data-parallel training runs on the GPUs with its input coming in over the network (the
NICs receive it, the Ethernet switch forwards it, the CPUs decode and tokenize it, the DPUs
preprocess it: see ingest.py) and its all-reduce forwarded by the NVLink switch (fabric.py),
while the NPUs serve an inference request stream (infer.py, `devices=npu`). A step is one
training step plus every inference batch that finishes by that step's end; both share the
run's clock, table and seeded generator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from chiptrace.emulator.context import Context
from chiptrace.emulator.errors import WorkloadError
from chiptrace.emulator.infer import InferConfig, Inference, _total
from chiptrace.emulator.train import TrainConfig, Training

_INFER_PREFIX = "infer_"


@dataclass
class MixedConfig(TrainConfig):
    """Training knobs (TrainConfig, with the host path and switch ops on) plus the
    inference stream's knobs, prefixed `infer_` (see InferConfig); `efficiency` applies
    to both."""

    host_load_flops_per_byte: float = 200.0  # decode + tokenize on the host CPU
    switch_ops: bool = True
    infer_layers: int = 8  # a ~1.6B model: two Gaudi 3s keep up with the default rate (~88% busy)
    infer_hidden: int = 4096
    infer_rate: float = 100.0
    infer_prompt_tokens: int = 512
    infer_output_tokens: int = 128
    infer_token_budget: int = 16384
    infer_max_wait_ms: float = 50.0
    infer_devices: str = "npu"

    def infer_config(self) -> InferConfig:
        """The InferConfig the `infer_*` knobs describe (the rest at InferConfig's defaults)."""
        known = {f.name for f in fields(InferConfig)}
        kw = {
            f.name[len(_INFER_PREFIX) :]: getattr(self, f.name)
            for f in fields(self)
            if f.name.startswith(_INFER_PREFIX) and f.name[len(_INFER_PREFIX) :] in known
        }
        return InferConfig(**kw, efficiency=self.efficiency)

    def check(self) -> None:
        super().check()
        try:
            self.infer_config().check()
        except WorkloadError as e:  # name the knob as the user spelled it
            raise WorkloadError(
                str(e).replace("workload ", f"workload {_INFER_PREFIX}", 1)
            ) from None


class Mixed:
    """Training on the GPUs and serving on the NPUs, one training step at a time."""

    def __init__(self, ctx: Context, cfg: MixedConfig) -> None:
        cfg.check()
        topo = ctx.topology
        # The whole rack at work, whatever it has: a rack without NICs or CPUs skips the
        # host path, one without the serving devices (pcie8, nvl72) only trains.
        if not (topo.of_type("nic") and topo.of_type("cpu")):
            cfg.host_load_flops_per_byte = 0.0
        self.cfg = cfg
        self.train = Training(ctx, cfg)
        serving = any(topo.of_type(t) for t in cfg.infer_devices.split("+"))
        self.infer = Inference(ctx, cfg.infer_config()) if serving else None
        self.batches = 0
        # A batch formed (its requests taken from the queue) but not run yet: it ends later.
        self.pending: tuple[float, list[tuple[float, int, int]]] | None = None

    def describe(self) -> dict[str, object]:
        train = self.train.describe()
        infer = self.infer.describe() if self.infer else None
        return {
            **train,
            "kind": "mixed",
            "infer": infer,
            **{k: v for k, v in asdict(self.cfg).items() if k.startswith(_INFER_PREFIX)},
        }

    def step(self, s: int) -> float:
        """Training step `s`, then every inference batch that finishes by its end (a batch
        still running waits for a later step): a paced run hands spans over at the step's
        end, so a live view never shows work from its future, and its window, which ends at
        the last span, sees both workloads up to the same instant. Returns the step's end."""
        end = self.train.step(s)
        last, inf = end, self.infer
        while inf is not None:
            if self.pending is None:
                if not inf.queue and inf.next_arrival >= end:
                    break
                self.pending = inf.form_batch()
            close, batch = self.pending
            device, start = inf.place(self.batches, close, batch)
            if start + _total(inf.costs(device, batch)) > end:
                break
            last = max(last, inf.run_batch(self.batches, close, batch))
            self.pending = None
            self.batches += 1
        return last
