from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import chiptrace
from tests.conftest import assert_span_tree, spans_by_name


def test_bare_and_argument_decorators_tag_chips(trace_dir):
    @chiptrace.trace
    def plain(x):
        return x * 2

    @chiptrace.trace(
        name="gemm", chip="gpu:3", precision="fp8", attributes={"op.flops": 10, "k": 1}
    )
    def gemm():
        return 7

    assert plain(4) == 8
    assert gemm() == 7
    spans = spans_by_name(trace_dir)
    assert len(spans["test_bare_and_argument_decorators_tag_chips.plain"]) == 1
    (g,) = spans["gemm"]
    assert (g["chip_id"], g["chip_type"], g["op_kind"], g["op_precision"]) == (
        "gpu:3",
        "gpu",
        "compute",
        "fp8",
    )
    assert g["op_flops"] == 10
    assert g["attributes"] == '{"k":1}'
    assert g["end_ns"] >= g["start_ns"] and g["parent_span_id"] is None


def test_link_tags_and_span_object(trace_dir):
    with chiptrace.span("copy", link="pcie5:cpu:0-gpu:1") as s:
        s.set_attribute("op.bytes", 1 << 20)
        s.add_event("halfway", {"pct": 50})
    (c,) = spans_by_name(trace_dir)["copy"]
    assert (c["link_type"], c["link_src"], c["link_dst"], c["op_kind"]) == (
        "pcie5",
        "cpu:0",
        "gpu:1",
        "comm",
    )
    assert c["op_bytes"] == 1 << 20
    assert '"halfway"' in c["events"]


def test_unknown_chip_type_fails_at_decoration():
    with pytest.raises(chiptrace.ChipError, match="unknown chip type 'tpu'"):
        chiptrace.trace(chip="tpu:0")
    with pytest.raises(chiptrace.ChipError, match="unknown link type"):
        chiptrace.trace(link="pcie9:cpu:0-gpu:0")
    with pytest.raises(chiptrace.ChipError, match="op kind"):
        chiptrace.trace(op="magic")


def test_exception_sets_error_and_propagates(trace_dir):
    class Boom(Exception):
        pass

    @chiptrace.trace(name="fails")
    def fails():
        raise Boom("bad input")

    with pytest.raises(Boom, match="bad input"):
        fails()
    (f,) = spans_by_name(trace_dir)["fails"]
    assert f["status_code"] == 2
    assert "Boom: bad input" in f["status_message"]
    assert '"exception"' in f["events"] and "exception.stacktrace" in f["events"]


def test_nesting_across_threads_and_asyncio(trace_dir):
    @chiptrace.trace(name="leaf", chip="gpu:0")
    def leaf():
        time.sleep(0.001)

    @chiptrace.trace(name="worker")
    def worker():
        leaf()

    @chiptrace.trace(name="atask", chip="cpu:1")
    async def atask(i):
        await asyncio.sleep(0.001 * (3 - i))
        leaf()

    @chiptrace.trace(name="amain")
    async def amain():
        await asyncio.gather(*(atask(i) for i in range(3)))

    @chiptrace.trace(name="root")
    def root():
        threads = [threading.Thread(target=chiptrace.carry(worker)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with cf.ThreadPoolExecutor(2) as pool:
            bound = chiptrace.carry(worker)
            list(pool.map(lambda _: bound(), range(4)))
        asyncio.run(amain())

    root()
    spans = spans_by_name(trace_dir)
    assert len(spans["root"]) == 1 and len(spans["worker"]) == 8
    assert len(spans["atask"]) == 3 and len(spans["leaf"]) == 11
    rows = [r for rs in spans.values() for r in rs]
    assert_span_tree(rows, {"root": None, "worker": "root", "amain": "root", "atask": "amain"})
    by_id = {r["span_id"]: r for r in rows}
    parents = sorted(by_id[r["parent_span_id"]]["name"] for r in spans["leaf"])
    assert parents == ["atask"] * 3 + ["worker"] * 8
    assert len({r["trace_id"] for r in rows}) == 1
    for r in rows:  # children lie inside their parents
        if r["parent_span_id"]:
            p = by_id[r["parent_span_id"]]
            assert p["start_ns"] <= r["start_ns"] <= r["end_ns"] <= p["end_ns"]


def test_thread_without_carry_starts_its_own_trace(trace_dir):
    @chiptrace.trace(name="t")
    def t():
        pass

    with chiptrace.span("outer"):
        th = threading.Thread(target=t)
        th.start()
        th.join()
    spans = spans_by_name(trace_dir)
    assert spans["t"][0]["parent_span_id"] is None


def test_generator_span_covers_iteration_without_leaking(trace_dir):
    @chiptrace.trace(name="gen", chip="dpu:0")
    def gen(n):
        for i in range(n):
            with chiptrace.span("item"):
                pass
            yield i
        return "done"

    with chiptrace.span("consumer"):
        g = gen(3)
        out = []
        for x in g:
            # between yields, the generator's span must not be current
            assert otel_trace.get_current_span().name == "consumer"
            out.append(x)
    assert out == [0, 1, 2]
    spans = spans_by_name(trace_dir)
    rows = [r for rs in spans.values() for r in rs]
    assert_span_tree(rows, {"gen": "consumer", "item": "gen", "consumer": None})
    assert len(spans["item"]) == 3


def test_methods_and_async(trace_dir):
    class Model:
        @chiptrace.trace(chip="npu:0")
        def infer(self, x):
            return x + 1

        @chiptrace.trace
        @staticmethod
        def helper():
            return 5

    @chiptrace.trace(name="co")
    async def co(x):
        await asyncio.sleep(0)
        return x

    assert Model().infer(1) == 2
    assert Model.helper() == 5
    assert asyncio.run(co(9)) == 9
    spans = spans_by_name(trace_dir)
    assert spans["test_methods_and_async.Model.infer"][0]["chip_id"] == "npu:0"
    assert "co" in spans and "test_methods_and_async.Model.helper" in spans


@pytest.fixture
def otel_sdk():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("other-instrumentation"), exporter


def test_otel_interop_both_ways(trace_dir, otel_sdk):
    tracer, exporter = otel_sdk

    @chiptrace.trace(name="ct_inner", chip="gpu:0")
    def ct_inner():
        with tracer.start_as_current_span("otel_leaf"):
            pass

    with tracer.start_as_current_span("otel_root") as root:
        ct_inner()
    otel = {s.name: s for s in exporter.get_finished_spans()}
    (ct,) = spans_by_name(trace_dir)["ct_inner"]
    root_ctx = root.get_span_context()
    # chiptrace span inside an OTel span: its child, same trace
    assert ct["trace_id"] == f"{root_ctx.trace_id:032x}"
    assert ct["parent_span_id"] == f"{root_ctx.span_id:016x}"
    # OTel span inside a chiptrace span: the chiptrace span's child
    leaf = otel["otel_leaf"]
    assert f"{leaf.parent.span_id:016x}" == ct["span_id"]
    assert leaf.context.trace_id == root_ctx.trace_id


def test_disabled_records_nothing(tmp_path):
    chiptrace.init(tmp_path / "off", enabled=False)
    try:

        @chiptrace.trace
        def f():
            return 1

        assert f() == 1
        with chiptrace.span("x"):
            pass
        assert chiptrace.get_recorder() is None
        assert not (tmp_path / "off").exists()
    finally:
        chiptrace.init(tmp_path / "on", enabled=True)
        chiptrace.shutdown()


def test_user_span_exporter_receives_spans(tmp_path):
    exporter = InMemorySpanExporter()
    chiptrace.init(tmp_path / "t", exporters=[exporter])
    with chiptrace.span("exported", chip="gpu:2") as s:
        s.set_attribute("x", 3)
    chiptrace.shutdown()
    (sp,) = exporter.get_finished_spans()
    assert sp.name == "exported"
    assert sp.attributes["chip.id"] == "gpu:2" and sp.attributes["x"] == 3


def test_no_configuration_writes_under_default_dir(tmp_path):
    import os
    import subprocess
    import sys

    code = "import chiptrace\n@chiptrace.trace(chip='gpu:0')\ndef f():\n    return 1\nassert f() == 1\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHIPTRACE_", "OTEL_"))}
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
    (run_dir,) = (tmp_path / "chiptrace-traces").iterdir()
    con = chiptrace.connect(run_dir)
    assert con.sql("SELECT name, chip_id FROM spans").fetchall() == [("f", "gpu:0")]


def test_bad_setting_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPTRACE_FLUSH_INTERVAL", "soon")
    with pytest.raises(
        chiptrace.ConfigError, match="CHIPTRACE_FLUSH_INTERVAL='soon': expected a number"
    ):
        chiptrace.init(tmp_path / "x")
