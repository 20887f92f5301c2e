"""Kineto import checked against the events in each real file."""

from __future__ import annotations

import re
from collections import Counter
from decimal import Decimal

import pytest

import chiptrace
from tests.importers.conftest import KINETO_FILES, load_events

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events"}


def _complete(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]


@pytest.mark.parametrize("name", KINETO_FILES)
def test_span_counts_per_category_equal_the_file(name, imported):
    out, summary = imported(name)
    want = Counter(e.get("cat", "") for e in _complete(load_events(name)))
    con = chiptrace.connect(out)
    got = dict(
        con.execute("SELECT attributes->>'kineto.cat', count(*) FROM spans GROUP BY 1").fetchall()
    )
    assert got == dict(want)
    assert summary.spans == sum(want.values())
    assert summary.files[0]["categories"] == dict(sorted(want.items()))


@pytest.mark.parametrize("name", KINETO_FILES)
def test_kernel_time_sums_exactly(name, imported):
    out, _ = imported(name)
    ns = [round(e["dur"] * 1000) for e in _complete(load_events(name)) if e["cat"] == "kernel"]
    con = chiptrace.connect(out)
    got = con.execute(
        "SELECT coalesce(sum(end_ns - start_ns), 0), count(*) FROM spans "
        "WHERE attributes->>'kineto.cat' = 'kernel'"
    ).fetchone()
    assert got == (sum(ns), len(ns))


@pytest.mark.parametrize("name", KINETO_FILES)
def test_one_chip_per_rank_and_device(name, imported):
    out, _ = imported(name)
    doc = load_events(name)
    devices = {
        (e["args"].get("device", e["pid"]), "npu" if e["cat"].startswith("mtia") else "gpu")
        for e in _complete(doc)
        if e["cat"] in DEVICE_CATS
    }
    hosts = any(
        e["cat"] not in DEVICE_CATS | {"gpu_user_annotation", "Trace"} for e in _complete(doc)
    )
    want = {f"{t}:{d}" for d, t in devices} | ({"cpu:0"} if hosts else set())
    con = chiptrace.connect(out)
    chips = {r[0].rsplit("/", 1)[-1] for r in con.execute("SELECT chip_id FROM chips").fetchall()}
    assert chips == want


@pytest.mark.parametrize("name", KINETO_FILES)
def test_steps_are_root_spans_with_their_own_trace(name, imported):
    out, _ = imported(name)
    names = {
        e["name"]
        for e in _complete(load_events(name))
        if re.match(r"ProfilerStep#\d+$", e["name"]) and e["cat"] == "user_annotation"
    }
    con = chiptrace.connect(out)
    rows = con.execute(
        "SELECT name, parent_span_id, trace_id FROM spans WHERE name LIKE 'ProfilerStep#%' "
        "AND chip_type = 'cpu'"
    ).fetchall()
    assert {r[0] for r in rows} == names
    assert all(r[1] is None for r in rows)
    assert len({r[2] for r in rows}) == len(rows)
    if rows:  # the step's work hangs under it, in its trace
        deep = con.execute(
            "SELECT count(*) FROM spans s JOIN spans p ON s.parent_span_id = p.span_id "
            "WHERE s.trace_id <> p.trace_id"
        ).fetchone()[0]
        assert deep == 0


def test_nccl_collectives_are_comm_spans_with_bytes(imported):
    out, _ = imported("nccl_data.json.gz")
    size = {"Float": 4, "Long": 8, "Int": 4}
    want = sorted(
        max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * size[e["args"]["dtype"]]
        for e in _complete(load_events("nccl_data.json.gz"))
        if e["cat"] == "kernel" and e["name"].startswith("nccl")
    )
    con = chiptrace.connect(out)
    got = sorted(
        r[0] for r in con.execute("SELECT op_bytes FROM spans WHERE op_kind = 'comm'").fetchall()
    )
    assert got == want and len(want) == 21
    assert con.execute(
        "SELECT DISTINCT attributes->>'Group size' FROM spans WHERE op_kind = 'comm'"
    ).fetchall() == [("2",)]


def test_launch_links_and_copies_on_the_host_link(imported):
    out, _ = imported("simple_add.json.gz")
    con = chiptrace.connect(out)
    # Every kernel links to the runtime call with its correlation id, which started first.
    rows = con.execute(
        "SELECT k.attributes->>'correlation', l.attributes->>'correlation', k.start_ns - l.start_ns "
        "FROM spans k JOIN spans l ON l.span_id = k.links->>'$[0].span_id' "
        "WHERE k.attributes->>'kineto.cat' = 'kernel'"
    ).fetchall()
    assert len(rows) == 79 and all(a == b and d >= 0 for a, b, d in rows)
    copies = con.execute(
        "SELECT link_type, link_src, link_dst, count(*), sum(op_bytes) FROM spans "
        "WHERE link_id IS NOT NULL GROUP BY ALL ORDER BY 2"
    ).fetchall()
    doc = _complete(load_events("simple_add.json.gz"))
    htod = [e["args"]["bytes"] for e in doc if e["name"].startswith("Memcpy HtoD")]
    assert ("pcie4", "cpu:0", "gpu:0", len(htod), sum(htod)) in copies


def test_ranks_share_step_traces_and_get_rank_qualified_chips(tmp_path):
    from tests.importers.conftest import KINETO

    files = [KINETO / "2rank_sampled_rank-0.json.gz", KINETO / "2rank_sampled_rank-1.json.gz"]
    summary = chiptrace.import_trace(files, tmp_path)
    assert [f["rank"] for f in summary.files] == [0, 1]
    con = chiptrace.connect(tmp_path)
    chips = sorted(r[0] for r in con.execute("SELECT chip_id FROM chips").fetchall())
    assert chips == ["rank0/cpu:0", "rank0/gpu:0", "rank1/cpu:0", "rank1/gpu:1"]
    steps = con.execute(
        "SELECT name, count(DISTINCT trace_id), count(*) FROM spans "
        "WHERE name LIKE 'ProfilerStep#%' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert steps == [("ProfilerStep#551", 1, 2), ("ProfilerStep#552", 1, 2)]
    ranks = con.execute(
        "SELECT DISTINCT resource->>'$.\"distributed.rank\"', resource->>'$.\"distributed.world_size\"' "
        "FROM spans ORDER BY 1"
    ).fetchall()
    assert ranks == [("0", "128"), ("1", "128")]
    assert list(summary.offsets_ns.values()) and all(
        v % 1000 == 0 for v in summary.offsets_ns.values()
    )


def _ns(us: float) -> int:
    return int(Decimal(repr(us)) * 1000)  # the exact ns of a 3-decimal µs value


def test_launches_view_gives_device_work_its_launch_and_delay(imported):
    out, _ = imported("simple_add.json.gz")
    doc = _complete(load_events("simple_add.json.gz"))
    calls = {
        e["args"]["correlation"]: e
        for e in doc
        if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    want = sorted(
        (e["name"], calls[c]["name"], _ns(e["ts"]) - _ns(calls[c]["ts"]) - _ns(calls[c]["dur"]))
        for e in doc
        if e["cat"] in DEVICE_CATS and (c := e["args"].get("correlation")) in calls
    )
    con = chiptrace.connect(out)
    got = con.execute(
        "SELECT name, launch_name, launch_delay_ns FROM launches ORDER BY ALL"
    ).fetchall()
    assert got == want and len(got) == 139
    kinds = dict(con.execute("SELECT op_kind, count(*) FROM launches GROUP BY 1").fetchall())
    assert kinds == {"compute": 79, "memcpy": 16, "memset": 3, "sync": 41}
