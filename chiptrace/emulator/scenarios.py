"""Named what-if scenarios with a clear bottleneck each: `emulate(**SCENARIOS[name], out=DIR)`.

Each is a set of `emulate` keyword arguments on top of the default rack6 training run, chosen
so that one chip, link or phase stands out. The analysis proves its rules on these, and a user
can start from one (`chiptrace emulate` flags are given beside each).
"""

from __future__ import annotations

from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    # nothing wrong: the reference the others are compared with
    "baseline": {},
    # --fault slow:gpu:3:4 -> gpu:3 busy 4x its peers; everyone waits at the all-reduce
    "slow_gpu": {"faults": ["slow:gpu:3:4"]},
    # --fault degrade:nvlink6:gpu:1-switch:0:0.1 -> one NVLink at 10%, every ring round waits on it
    "degraded_nvlink": {"faults": ["degrade:nvlink6:gpu:1-switch:0:0.1"]},
    # --fault down:nvlink6:gpu:1-switch:0 -> gpu:1's ring traffic detours over C2C and the CPUs
    "down_nvlink": {"faults": ["down:nvlink6:gpu:1-switch:0"]},
    # --fault slow:dpu:0:8 -> one DPU cannot keep up: its GPUs wait for input
    "thin_dpu": {"faults": ["slow:dpu:0:8"]},
    # --set preprocess_flops_per_byte=800 -> all DPUs under-provisioned for the input pipeline
    "underprovisioned_dpus": {"options": {"preprocess_flops_per_byte": 800}},
    # --set optimizer=cpu -> Adam on the CPUs, gradients down and parameters up every step
    "cpu_optimizer": {"options": {"optimizer": "cpu"}},
    # --fault straggler:gpu:5:5 -> gpu:5 starts every step 5 ms late
    "straggler": {"faults": ["straggler:gpu:5:5"]},
    # --set bucket_mb=8 -> ~800 small all-reduces a step, each paying 14 link latencies
    "latency_bound_allreduce": {"options": {"bucket_mb": 8}},
    # --set overlap=false -> the all-reduce waits for the whole backward pass
    "no_overlap": {"options": {"overlap": False}},
    # --topology pcie8 -> the legacy baseline: all-reduce over shared PCIe 4.0 uplinks
    "pcie_baseline": {"topology": "pcie8"},
    # --precision nvfp4 -> 4x the bf16 peak: compute shrinks, communication's share grows
    "nvfp4": {"precision": "nvfp4"},
    # --workload infer --schedule static -> slow NPUs queue up while fast GPUs idle
    "serving_static": {"workload": "infer", "schedule": "static"},
    # --workload infer --schedule dynamic -> earliest-finish placement keeps every device busy
    "serving_dynamic": {"workload": "infer", "schedule": "dynamic"},
}
