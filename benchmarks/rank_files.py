"""Many-rank Kineto traces made from the two-rank fixtures: for bench_scale.py and the Dask tests.

Rank r is a copy of `2rank_sampled_rank-{r % 2}` with `distributedInfo` saying rank r of
the world, its clock shifted by a few hundred microseconds (so the import's NCCL alignment
has work to do), and its steps repeated `copies` times end to end (shifted times, step
numbers and correlation ids: bench_import's templates), to reach a size.

    python benchmarks/rank_files.py DIR --ranks 64 --copies 20
"""

from __future__ import annotations

import argparse
import gzip
import json
from functools import cache
from pathlib import Path

from bench_import import _template, render_copy

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kineto"


@cache
def _source(which: int) -> tuple[dict, list[dict], list[tuple[list[str], list[str]]], float]:
    doc = json.load(gzip.open(FIXTURES / f"2rank_sampled_rank-{which}.json.gz"))
    events = doc.pop("traceEvents")
    timed = [e for e in events if e.get("ph") in ("X", "s", "f")]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0 + 1000.0
    head = dict(doc, metadata_events=[e for e in events if e.get("ph") not in ("X", "s", "f")])
    return head, timed, [_template(e) for e in timed], span


def skew_us(rank: int) -> int:
    """The clock shift of a rank's file (the aligned import takes it back out)."""
    return (rank * 37) % 400


def write_rank(path: Path, rank: int, world: int, copies: int) -> int:
    """One rank's file; returns its events."""
    head, events, templates, span = _source(rank % 2)
    meta = head["metadata_events"]
    doc = {k: v for k, v in head.items() if k != "metadata_events"}
    doc["distributedInfo"] = dict(doc["distributedInfo"], rank=rank, world_size=world)
    n = 0
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as fh:
        fh.write(json.dumps(doc)[:-1] + ', "traceEvents": [\n')
        fh.write(",\n".join(json.dumps(e) for e in meta))
        n += len(meta)
        for c in range(copies):
            shift, extra = c * span + skew_us(rank), c * 1_000_000
            out = render_copy(events, templates, c, shift, extra)
            fh.write(",\n" + ",\n".join(out))
            n += len(out)
        fh.write("\n]}\n")
    return n


def make_rank_files(out: Path, ranks: int, copies: int = 1, suffix: str = ".json") -> list[Path]:
    """`ranks` files `rank-00000.json`... in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        p = out / f"rank-{r:05d}{suffix}"
        write_rank(p, r, ranks, copies)
        paths.append(p)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--copies", type=int, default=1)
    args = ap.parse_args()
    paths = make_rank_files(args.out, args.ranks, args.copies)
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} files, {total / 1e6:.0f} MB in {args.out}")


if __name__ == "__main__":
    main()
