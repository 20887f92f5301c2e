#!/usr/bin/env bash
# What only a machine with an NVIDIA GPU can check: device time, NVML sampling and
# chiptrace.torch.profile() on CUDA. Prints one line per thing it verified; under 5 minutes.
# Without CUDA (or without PyTorch) it says so and exits 0: nothing was checked.
#
#   bash benchmarks/gpu_check.sh          (from the repository root, chiptrace installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: SKIPPED: no CUDA GPU visible to PyTorch here (or PyTorch not installed); nothing verified"
    exit 0
fi

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

timeout 240 "$PY" - "$OUT" <<'PY'
import json, sys, time
from pathlib import Path

import torch

import chiptrace
import chiptrace.torch

out = Path(sys.argv[1])
dev = torch.cuda.get_device_name(0)
print(f"gpu_check: {dev}, torch {torch.__version__}, CUDA {torch.version.cuda}")
ok = True


def check(what: str, cond: bool, detail: str) -> None:
    global ok
    ok &= bool(cond)
    print(f"  {'OK  ' if cond else 'FAIL'} {what}: {detail}")


# 1. device_time: a GPU-tagged span times the kernels, not the launch.
chiptrace.init(out / "device", flush_interval_s=3600, sample_host=True, sample_interval=0.05)
torch.cuda.init()


@chiptrace.trace(name="spin", chip="gpu:0", device_time=True)
def spin() -> None:
    torch.cuda._sleep(200_000_000)  # a kernel that spins ~0.1 s on the device


t0 = time.monotonic()
spin()
host_s = time.monotonic() - t0
torch.cuda.synchronize()
a = torch.randn(2048, 2048, device="cuda")
for _ in range(50):  # some load for the NVML sampler to see
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()
time.sleep(0.3)
chiptrace.shutdown()  # the last flush; the device span is resolved by then
con = chiptrace.connect(out / "device")
rows = {r[0]: r for r in con.sql("SELECT name, start_ns, end_ns, attributes FROM spans").fetchall()}
if "spin (device)" in rows:
    dev_s = (rows["spin (device)"][2] - rows["spin (device)"][1]) / 1e9
    attrs = json.loads(rows["spin"][3] or "{}")
    check(
        "device_time",
        host_s < 0.05 < dev_s and attrs.get("device.duration_ns", 0) > 0,
        f"launch {host_s * 1e3:.2f} ms on the host, {dev_s * 1e3:.1f} ms on the device",
    )
else:
    check("device_time", False, f"no 'spin (device)' span; spans: {sorted(rows)}")

# 2. NVML sampling: GPU rows in the metrics table beside the spans.
gpu = con.sql(
    "SELECT metric, count(*), max(value) FROM metrics WHERE chip_type = 'gpu' GROUP BY metric"
).fetchall()
seen = {m: (n, v) for m, n, v in gpu}
check(
    "NVML sampling",
    "gpu.util" in seen and "gpu.mem_used" in seen,
    f"{sum(n for n, _ in seen.values())} GPU samples, metrics {sorted(seen)}, "
    f"peak gpu.util {seen.get('gpu.util', (0, None))[1]}",
)

# 3. chiptrace.torch.profile(): CUDA kernels as gpu:0 spans under the span that launched them.
chiptrace.init(out / "profile", flush_interval_s=3600)
b = torch.randn(512, 512, device="cuda")
with chiptrace.torch.profile() as prof:
    for i in range(3):
        with chiptrace.span("step", attributes={"step": i}):
            (b @ b).relu_()
    torch.cuda.synchronize()
prof.wait()
chiptrace.shutdown()
con = chiptrace.connect(out / "profile")
spans = con.sql("SELECT span_id, parent_span_id, name, chip_id, op_kind FROM spans").fetchall()
by_id = {s[0]: s for s in spans}
kernels = [s for s in spans if s[3] == "gpu:0" and s[4] == "compute"]


def under_step(s: tuple) -> bool:
    parent = by_id.get(s[1])
    while parent is not None:
        if parent[2] == "step":
            return True
        parent = by_id.get(parent[1])
    return False


check(
    "chiptrace.torch.profile()",
    bool(kernels) and all(under_step(k) for k in kernels),
    f"{prof.spans_imported} profiler spans, {len(kernels)} kernels on gpu:0, all under 'step'",
)
print("gpu_check: all verified" if ok else "gpu_check: FAILED (see FAIL lines)")
sys.exit(0 if ok else 1)
PY

# The GPU-only tests of the suite, which skip elsewhere.
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m torch tests/torch/test_device_time.py -k cuda
timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/host/test_nvml.py -k real_gpu
