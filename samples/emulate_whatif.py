"""What if this rack had PCIe instead of NVLink, or ran nvfp4 instead of bf16?

Runs the same data-parallel training on the emulated rack under a few what-ifs and prints,
for each, the step time and where it went, straight from the trace directories with SQL.

    python3 samples/emulate_whatif.py [--steps 5] [--out chiptrace-traces/whatif]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chiptrace.emulator import emulate
from chiptrace.query import connect

SCENARIOS = {
    "rack6 (NVLink 6), bf16": {},
    "pcie8 (PCIe 4.0), bf16": {"topology": "pcie8"},
    "rack6, nvfp4": {"precision": "nvfp4"},
    "rack6, gpu:3 4x slow": {"faults": ["slow:gpu:3:4"]},
    "rack6, 8 MB buckets": {"options": {"bucket_mb": 8}},
    "rack6, optimizer on CPU": {"options": {"optimizer": "cpu"}},
}

PHASES = """
SELECT avg(r.duration_ns) / 1e6 AS step_ms,
       avg(p.duration_ns) FILTER (WHERE p.name = 'forward') / 1e6 AS fwd_ms,
       avg(p.duration_ns) FILTER (WHERE p.name = 'backward') / 1e6 AS bwd_ms,
       avg(p.duration_ns) FILTER (WHERE p.name = 'allreduce') / 1e6 AS allreduce_ms,
       avg(p.duration_ns) FILTER (WHERE p.name = 'optimizer') / 1e6 AS opt_ms
FROM spans p JOIN spans r ON p.parent_span_id = r.span_id WHERE r.parent_span_id IS NULL
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="chiptrace-traces/whatif")
    args = ap.parse_args()
    print(f"{'scenario':<28} {'step ms':>8} {'fwd':>7} {'bwd':>7} {'allred':>7} {'optim':>7}")
    for i, (name, kwargs) in enumerate(SCENARIOS.items()):
        out = Path(args.out) / f"s{i}"
        emulate(steps=args.steps, seed=1, out=out, progress=False, **kwargs)
        row = connect(out).sql(PHASES).fetchall()[0]
        print(f"{name:<28} " + " ".join(f"{v:>7.1f}" for v in row))
    print(f"\ntraces under {args.out}; try: chiptrace report {args.out}/s1")


if __name__ == "__main__":
    main()
