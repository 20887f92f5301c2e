"""`import chiptrace` is light and chiptrace's own start-up never lands inside a span:
NumPy and pyarrow load on the writer thread at the first flush, not at import or at the
first span; the README quickstart's first step is no slower than the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import chiptrace
from chiptrace.cli import main

ROOT = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import chiptrace
    after_import = sorted(m for m in ("numpy", "pyarrow") if m in sys.modules)
    with chiptrace.span("first"):
        pass
    took = time.perf_counter() - t0
    after_span = sorted(m for m in ("numpy", "pyarrow") if m in sys.modules)
    print(json.dumps({"import": after_import, "span": after_span, "ms": took * 1000}))
    """
)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CHIPTRACE_", "OTEL_"))}


def test_import_and_first_span_load_neither_numpy_nor_pyarrow(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(proc.stdout)
    assert got["import"] == [] and got["span"] == [], got
    # The span still reaches the store, at exit.
    (run,) = (tmp_path / "chiptrace-traces").iterdir()
    assert list((run / "spans").glob("*.parquet"))


def test_quickstart_first_step_carries_no_start_up(tmp_path: Path, capsys) -> None:
    sample = ROOT / "samples" / "quickstart.py"
    subprocess.run(
        [sys.executable, str(sample)], cwd=tmp_path, env=_clean_env(), check=True, timeout=120
    )
    (run_dir,) = (tmp_path / "chiptrace-traces").iterdir()
    assert main(["report", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rules = {f["rule"] for f in data["findings"]}
    assert not rules & {"step-outliers", "slow-first-step", "warm-up"}, data["findings"]
    # Each step takes microseconds; chiptrace's ~10 ms start-up inside one would show.
    con = chiptrace.connect(run_dir)
    ((longest_ns,),) = con.sql("SELECT max(end_ns - start_ns) FROM spans").fetchall()
    assert longest_ns < 5_000_000, longest_ns
