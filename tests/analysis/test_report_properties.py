"""Property tests: whatever span table the store accepts, `report`, `report --json`,
`--html`, `diff` and `view --no-ui` finish without a traceback, the JSON is valid (no NaN),
and no share exceeds 100%.

Hypothesis builds the tables: NULLs in every optional column (op.bytes, op.flops,
chip.type, link fields), zero-length, negative (end before start) and far-future spans,
children that outlive or precede their parent, orphans, non-ASCII names, bad JSON in
attributes and links, manifests with and without a topology. One span, no spans and
10,000-deep nesting have tests of their own. Examples are few (a report is ~0.3 s).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chiptrace.analysis.render_text import render_report
from chiptrace.cli import main
from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from chiptrace.store import PartWriter

T0 = 1_700_000_000_000_000_000
NAMES = [
    "step",
    "ProfilerStep#1",
    "ProfilerStep#2",
    "fwd.0",
    "GET /users/{id}",
    "步骤",
    "é",
    "ステップ 3",
    "🚀",
    "",
    "a" * 300,
]
CHIPS = [None, "gpu:0", "gpu:1", "gpu:2", "npu:0", "node1/gpu:0", "tpu:0", "cpu:0", "gpu:", ""]
LINKS = [None, "pcie5:cpu:0-gpu:0", "nvlink6:gpu:0-gpu:1", "nvlink6:gpu:1-gpu:0", "weird", ""]
STARTS = [T0, T0 + 1, T0 + 10**6, T0 + 10**9, 0, -(10**12), 2**62 - 10, 2**63 - 10**6]
DURS = [0, 1, 10**3, 10**6, 5 * 10**7, -1, -(10**9), 10**15]
TOPOLOGY = {
    "chips": [
        {
            "id": f"gpu:{i}",
            "type": "gpu",
            "model": "B200",
            "memory_bandwidth_Bps": 8e12,
            "peak_flops": {"bf16": 2.25e15, "nvfp4": 9e15, "fp32": 1.1e15},
        }
        for i in range(3)
    ],
    "links": [
        {
            "id": "nvlink6:gpu:0-gpu:1",
            "type": "nvlink6",
            "src": "gpu:0",
            "dst": "gpu:1",
            "bandwidth_Bps": 1.8e12,
            "latency_ns": 2500,
        }
    ],
}

opt = st.none

span = st.fixed_dictionaries(
    {
        "trace": st.integers(1, 3),
        "parent": st.one_of(st.none(), st.integers(0, 40), st.just(999_999)),  # 999999: orphan
        "name": st.sampled_from(NAMES),
        "kind": st.integers(0, 5),
        "start": st.sampled_from(STARTS) | st.integers(T0, T0 + 10**10),
        "dur": st.sampled_from(DURS) | st.integers(-(10**6), 10**9),
        "status_code": st.integers(0, 2),
        "chip_id": st.sampled_from(CHIPS),
        "chip_type": st.sampled_from([None, "gpu", "cpu", "npu", "bogus"]),
        "link_id": st.sampled_from(LINKS),
        "link_type": st.sampled_from([None, "nvlink6", "pcie5"]),
        "link_src": st.sampled_from([None, "gpu:0", "cpu:0"]),
        "link_dst": st.sampled_from([None, "gpu:1", "gpu:0"]),
        "op_kind": st.sampled_from([None, "compute", "comm", "idle", "memcpy", "io", "host"]),
        "op_bytes": st.sampled_from([None, 0, 1, 4 << 20, 2**62]) | st.integers(-5, 10**9),
        "op_flops": st.sampled_from([None, 0, 10**12, 2**62]),
        "op_precision": st.sampled_from([None, "bf16", "fp32", "nvfp4", "fp4x"]),
        "attributes": st.sampled_from([None, "{}", '{"train.step":3}', "not json", "[1,2]"]),
        "links": st.sampled_from([None, "[]", "garbage", '[{"trace_id":"zz","span_id":1}]']),
    }
)


def _write(directory: Path, rows: list[dict[str, Any]], manifest: dict[str, Any]) -> Path:
    writer = PartWriter(directory, manifest={"run_id": "prop", **manifest})
    if rows:
        ids = list(range(1, len(rows) + 1))
        end = [max(min(r["start"] + r["dur"], 2**63 - 1), -(2**63)) for r in rows]
        cols: dict[str, Any] = {
            "trace_id": trace_ids_to_binary([r["trace"].to_bytes(16, "big") for r in rows]),
            "span_id": ids_to_binary(ids),
            "parent_span_id": ids_to_binary(
                [r["parent"] or 0 for r in rows],
                zero_is_null=True,
            ),
            "start_ns": [r["start"] for r in rows],
            "end_ns": end,
        }
        for k in rows[0]:
            if k not in ("trace", "parent", "start", "dur"):
                cols[k] = [r[k] for r in rows]
        writer.write(batch_from_columns(cols))
    writer.write_manifest()
    return directory


def _no_nan(text: str) -> Any:
    def bad(c: str) -> Any:
        raise AssertionError(f"{c} in report JSON")

    return json.loads(text, parse_constant=bad)


def _check_shares(data: dict[str, Any]) -> None:
    for f in data["findings"]:
        assert 0 <= f["share"] <= 1 and 0 <= f["saving_pct"] <= 100, f
        assert f["saving_ms"] >= 0 and math.isfinite(f["saving_ms"])
    m = data["metrics"]
    for key in ("comm_share", "critical_path_comm_share", "mfu"):
        assert m[key] is None or 0 <= m[key] <= 1, (key, m[key])
    assert all(0 <= v <= 1 for v in m["utilization"].values())
    for w in data["workloads"]:
        assert w["comm_share"] is None or 0 <= w["comm_share"] <= 1
    for series in data["utilization"]["series"].values():
        assert all(0 <= v <= 1 for v in series)
    cp = data["critical_path"]
    if cp:
        assert all(0 <= v <= 1.0001 for v in cp["by_chip_type"].values())


def run_every_path(d: Path, capsys: Any) -> dict[str, Any] | None:
    """`report --json --html` (one analysis), the text report of that JSON, `diff` of it
    with itself, and `view --no-ui`, on `d`; returns the JSON report (None: no spans)."""
    page = d.parent / "r.html"
    rc = main(["report", str(d), "--json", "--html", str(page)])
    out, err = capsys.readouterr()
    if rc == 2:  # a user-facing error (an empty store): one line, no traceback
        assert err.startswith("chiptrace: error:") and err.count("\n") == 1, err
        return None
    assert rc == 0, err
    data = _no_nan(out)
    _check_shares(data)
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert render_report(data).startswith("chiptrace report")
    saved = d.parent / "r.json"
    saved.write_text(out, encoding="utf-8")
    assert main(["diff", str(saved), str(saved)]) == 0
    assert main(["diff", str(saved), str(saved), "--json"]) == 0
    assert main(["view", str(d), "--no-ui"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return data


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.lists(span, min_size=0, max_size=40),
    topology=st.booleans(),
    manifest_junk=st.sampled_from([{}, {"topology": "not json"}, {"spans_dropped": 3}]),
)
def test_any_span_table(
    rows: list[dict[str, Any]], topology: bool, manifest_junk: dict, capsys
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        manifest = {**manifest_junk, **({"topology": TOPOLOGY} if topology else {})}
        d = _write(Path(tmp) / "t", rows, manifest)
        run_every_path(d, capsys)


_OPTIONAL = ("chip_type", "link_id", "link_type", "link_src", "link_dst", "op_kind", "op_bytes")
_OPTIONAL += ("op_flops", "op_precision", "attributes", "links")


def _row(**given: Any) -> dict[str, Any]:
    """One span row with every optional column NULL unless given."""
    row = {"trace": 1, "parent": None, "kind": 1, "status_code": 0, "chip_id": None}
    return {**row, **dict.fromkeys(_OPTIONAL), **given}


def test_one_span_and_no_spans(tmp_path: Path, capsys) -> None:
    one = _row(name="only", start=T0, dur=10, chip_id="gpu:0")
    data = run_every_path(_write(tmp_path / "one", [one], {}), capsys)
    assert data is not None and data["metrics"]["spans"] == 1
    assert run_every_path(_write(tmp_path / "none", [], {}), capsys) is None


def test_ten_thousand_deep(tmp_path: Path, capsys) -> None:
    n = 10_000
    rows = [
        _row(
            parent=i or None,
            name=f"level {i} ✓",
            start=T0 + i,
            dur=2 * (n - i),
            chip_id="gpu:0" if i == n - 1 else None,
        )
        for i in range(n)
    ]
    data = run_every_path(_write(tmp_path / "deep", rows, {}), capsys)
    assert data is not None and data["metrics"]["spans"] == n
