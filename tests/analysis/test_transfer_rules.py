"""Transfer rules judge each transfer by its own size, and a link's bandwidth only where
it is known (issue 24, item 4). Verdicts are checked against the spans with SQL."""

from __future__ import annotations

from analysis_helpers import TraceBuilder

from chiptrace import connect
from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.render_text import render_report

LINK = "pcie5:cpu:0-gpu:0"


def _copies(b: TraceBuilder, n: int, every_us: float, dur_us: float, nbytes: int, **kw) -> None:
    t = b.new_trace()
    for i in range(n):
        b.span(
            kw.get("name", "copy"),
            i * every_us,
            i * every_us + dur_us,
            trace=t,
            link=kw.get("link", LINK),
            src="cpu:0",
            dst="gpu:0",
            nbytes=nbytes,
            op="memcpy",
        )


def _sql(store, q: str):
    return connect(store).execute(q).fetchall()


def test_unknown_bandwidth_is_never_saturated(builder, tmp_path):
    # the repro: a 1 MB copy every 10 ms on a link no topology describes
    _copies(builder, 50, 10_500, 10_400, 1 << 20)
    store = builder.write(tmp_path / "run")
    rep = TraceAnalysis(store).report().to_dict()
    assert not [f for f in rep["findings"] if f["rule"] == "link-bound"]
    ((rate,),) = _sql(store, "SELECT sum(op_bytes) / sum(duration_ns) FROM spans")
    (link,) = rep["links"]
    assert link["bandwidth_GBps"] is None
    assert link["GBps_while_busy"] == round(rate, 3)
    text = render_report(rep)
    assert f"{rate:.3f} GB/s peak unknown" in text


def test_known_bandwidth_is_judged(builder, tmp_path):
    _copies(builder, 50, 10_500, 10_400, 1 << 20)
    topo = {"links": [{"id": LINK, "type": "pcie5", "bandwidth_Bps": 0.11e9, "latency_ns": 2500}]}
    store = builder.write(tmp_path / "run", {"topology": topo})
    found = [f for f in TraceAnalysis(store).findings() if f.rule == "link-bound"]
    assert [f.evidence["cause"] for f in found] == ["saturated"]


def test_latency_is_charged_to_the_small_transfers_only(builder, tmp_path):
    # 61 small copies (1 KiB, 8 us) and 40 bulk ones (8 MB at ~3 GB/s): the median is small
    _copies(builder, 61, 100, 8, 1024, name="Memcpy HtoD (Pinned -> Device)")
    _copies(builder, 40, 10_000, 2_800, 8 << 20, name="Memcpy HtoD (Pinned -> Device)")
    store = builder.write(tmp_path / "run")
    ((small, small_us),) = _sql(
        store,
        "SELECT count(*), sum(duration_ns) / 1e3 FROM spans WHERE op_bytes < 65536",
    )
    (f,) = [f for f in TraceAnalysis(store).findings() if f.rule == "latency-bound"]
    assert f.evidence["small_transfers"] == small == 61
    assert f.evidence["transfers"] == 101
    assert f.saving_ns / 1e3 <= small_us  # well under a millisecond, not the bulk copies' time
    assert f.severity in ("low", "info")


def test_few_small_transfers_are_no_latency_finding(builder, tmp_path):
    _copies(builder, 20, 100, 8, 1024)
    _copies(builder, 200, 10_000, 2_800, 8 << 20)
    store = builder.write(tmp_path / "run")
    assert not [f for f in TraceAnalysis(store).findings() if f.rule == "latency-bound"]


def test_pageable_copies_are_told_to_pin(builder, tmp_path):
    _copies(builder, 20, 10_000, 2_800, 8 << 20, name="Memcpy HtoD (Pageable -> Device)")
    _copies(builder, 20, 10_000, 700, 8 << 20, name="Memcpy HtoD (Pinned -> Device)")
    store = builder.write(tmp_path / "run")
    ((pg_us, pg_bytes, pin_rate),) = _sql(
        store,
        """SELECT sum(duration_ns) FILTER (WHERE name LIKE '%Pageable%') / 1e3,
                  sum(op_bytes) FILTER (WHERE name LIKE '%Pageable%'),
                  sum(op_bytes) FILTER (WHERE name LIKE '%Pinned%')
                    / sum(duration_ns) FILTER (WHERE name LIKE '%Pinned%')
           FROM spans""",
    )
    (f,) = [f for f in TraceAnalysis(store).findings() if f.rule == "pageable-copy"]
    assert "pin" in f.suggestion and f.evidence["pinned_GBps"] == round(pin_rate, 3)
    assert abs(f.saving_ns / 1e3 - (pg_us - pg_bytes / pin_rate / 1e3)) < 1  # one run, one step
    assert not [f for f in TraceAnalysis(store).findings() if f.rule == "latency-bound"]


def _four_links(b: TraceBuilder) -> None:
    """Bulk copies to four GPUs, both ways; gpu:2's link 5x slower."""
    t = b.new_trace()
    for g in range(4):
        dur = 5_000 if g == 2 else 1_000
        for i in range(20):
            for src, dst in (("cpu:0", f"gpu:{g}"), (f"gpu:{g}", "cpu:0")):
                at = i * 20_000 + (0 if src == "cpu:0" else 10_000)
                b.span(
                    "copy",
                    at,
                    at + dur,
                    trace=t,
                    link=f"pcie4:cpu:0-gpu:{g}",
                    src=src,
                    dst=dst,
                    nbytes=8 << 20,
                    op="memcpy",
                )


def test_a_slow_link_is_judged_only_with_its_bandwidth(builder, tmp_path):
    _four_links(builder)
    plain = builder.write(tmp_path / "plain")
    assert not [f for f in TraceAnalysis(plain).findings() if f.rule == "link-bound"]
    topo = {
        "links": [
            {"id": f"pcie4:cpu:0-gpu:{g}", "type": "pcie4", "bandwidth_Bps": 32e9} for g in range(4)
        ]
    }
    known = builder.write(tmp_path / "known", {"topology": topo})
    found = [f for f in TraceAnalysis(known).findings() if f.rule == "link-bound"]
    assert [f.culprit for f in found] == ["pcie4:cpu:0-gpu:2"]
