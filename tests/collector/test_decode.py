"""The collector's wire reader against opentelemetry-proto's parser and chiptrace's encoder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

import chiptrace
from chiptrace._attributes import attributes as span_attributes
from chiptrace.collector.anyvalue import MAX_VALUE_DEPTH, TRUNCATED
from chiptrace.collector.decode import DecodeError, decode, decode_any_value
from chiptrace.collector.span_reader import MAX_CACHED_BYTES, Caches, SpanReader
from chiptrace.schema import COLUMNS, chip_type_of
from tests.collector.test_collect import sample_request


def _reference(body: bytes) -> dict[bytes, dict]:
    """What opentelemetry-proto's own parser says each span holds."""
    out = {}
    for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out[sp.span_id] = {
                    "trace_id": sp.trace_id,
                    "parent": sp.parent_span_id or None,
                    "name": sp.name,
                    "kind": sp.kind,
                    "start": sp.start_time_unix_nano,
                    "end": sp.end_time_unix_nano,
                    "status": (sp.status.code, sp.status.message or None),
                    "scope": ss.scope.name,
                    "attributes": _with_chip_type(
                        {kv.key: decode_any_value(kv.value) for kv in sp.attributes}
                    ),
                    "events": [(e.name, e.time_unix_nano) for e in sp.events],
                }
    return out


def _with_chip_type(attrs: dict) -> dict:
    """What the collector stores: a chip.id without a chip.type gets the type it names."""
    if "chip.type" not in attrs and chip_type_of(attrs.get("chip.id")):
        attrs["chip.type"] = chip_type_of(attrs["chip.id"])
    return attrs


def _check(body: bytes) -> pa.RecordBatch:
    batch = decode(body).batch
    ref = _reference(body)
    assert batch.num_rows == len(ref)
    for row in batch.to_pylist():
        r = ref[row["span_id"]]
        assert (row["trace_id"], row["parent_span_id"], row["name"], row["kind"]) == (
            r["trace_id"],
            r["parent"],
            r["name"],
            r["kind"],
        )
        assert (row["start_ns"], row["end_ns"]) == (r["start"], r["end"])
        assert (row["status_code"], row["status_message"]) == r["status"]
        assert span_attributes(row) == r["attributes"] and row["scope"] == r["scope"]
        events = json.loads(row["events"]) if row["events"] else []
        assert [(e["name"], e["time_ns"]) for e in events] == r["events"]
    return batch


def test_sdk_encoded_and_chiptrace_encoded_requests(tmp_path: Path) -> None:
    sys_path = Path(__file__).resolve().parents[2] / "benchmarks"
    import sys

    sys.path.insert(0, str(sys_path))
    from bench_collect import make_requests

    for body in make_requests()[:2]:  # SDK field order: the fast path
        _check(body)
    from chiptrace.exporters.otlp_encode import encode_request
    from tests.exporters.conftest import _decorated_workload

    chiptrace.init(tmp_path / "t", service="x", flush_interval_s=60)
    _decorated_workload()
    chiptrace.shutdown()
    table = chiptrace.connect(tmp_path / "t").sql("SELECT * FROM spans_raw").to_arrow_table()
    batch = _check(encode_request(table))  # chiptrace's field order: the field-by-field path
    back = {r["span_id"]: r for r in batch.to_pylist()}
    for row in table.to_pylist():
        got = back[row["span_id"]]
        for col in COLUMNS:
            if col not in ("host", "pid"):  # not resource attributes in a decorated trace
                assert got[col] == row[col], col


def test_shared_caches_do_not_leak_between_different_values() -> None:
    caches = Caches(limit=3)
    for first in (1, 100, 200, 1, 300):
        r = SpanReader(caches)
        r.read_request(sample_request(3, first))
        assert [int.from_bytes(s, "big") for s in r.columns()["span_id"]] == [
            first,
            first + 1,
            first + 2,
        ]
    assert all(len(t) <= 3 for t in (caches.kv, caches.attrs, caches.tails, caches.status))


def test_damaged_bodies_raise_decode_error_or_decode() -> None:
    body = sample_request(20)
    rng = random.Random(5)
    outcomes = set()
    for _ in range(300):
        damaged = bytearray(body)
        if rng.random() < 0.5:
            damaged = damaged[: rng.randrange(len(damaged))]
        else:
            for _ in range(3):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            decode(bytes(damaged))
            outcomes.add("ok")
        except DecodeError:
            outcomes.add("error")
    assert outcomes == {"ok", "error"}


def test_json_with_bad_ids_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="expected hex"):
        decode(
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"xyz"}]}]}]}', "application/json"
        )


def test_any_field_order_decodes_like_the_reference() -> None:
    """The SDK-order fast path must not misread a span whose fields come in another order
    (protobuf allows any), nor a root span, an empty name or a missing kind."""
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

    rng = random.Random(11)
    spans = []
    for k in range(60):
        fields = [
            Span(trace_id=bytes([k + 1]) * 16),
            Span(span_id=bytes([k + 1]) * 8),
            Span(name="op" * (k % 3)),
            Span(start_time_unix_nano=1_000 + k),
            Span(end_time_unix_nano=5_000 + k),
        ]
        if k % 2:
            fields.append(Span(parent_span_id=bytes([k]) * 8))
        if k % 4:
            fields.append(Span(kind=1 + k % 5))
        if k % 5 == 0:
            fields.append(Span(flags=0x101))
        if k % 3 == 0:
            fields.append(
                Span(attributes=[{"key": "chip.id", "value": {"string_value": f"gpu:{k % 8}"}}])
            )
        if k >= 20:
            rng.shuffle(fields)  # the first 20 keep SDK order
        spans.append(b"".join(f.SerializeToString() for f in fields))
    # Built by hand: re-serializing a parsed message would restore field-number order.
    scope = ScopeSpans(scope=InstrumentationScope(name="s")).SerializeToString()
    scope += b"".join(b"\x12" + _len(s) + s for s in spans)
    rs = b"\x12" + _len(scope) + scope
    assert len(_reference(b"\x0a" + _len(rs) + rs)) == 60
    _check(b"\x0a" + _len(rs) + rs)


def _len(b: bytes) -> bytes:
    n, out = len(b), bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _with_attribute(first: int, value: str) -> bytes:
    req = ExportTraceServiceRequest.FromString(sample_request(2, first))
    for span in req.resource_spans[0].scope_spans[0].spans:
        kv = span.attributes.add()
        kv.key, kv.value.string_value = "note", value
    return req.SerializeToString()


def test_caches_are_bounded_in_bytes_and_keep_no_large_value() -> None:
    caches = Caches(max_bytes=64 << 10)
    for i in range(300):  # unique 1 kB values: 300 kB of them
        SpanReader(caches).read_request(_with_attribute(1 + 2 * i, f"{i:04d}" * 256))
        assert caches.nbytes <= 64 << 10
    caches = Caches()
    reader = SpanReader(caches)
    reader.read_request(_with_attribute(1, "y" * (MAX_CACHED_BYTES + 1)))
    assert json.loads(reader.columns()["attributes"][0])["note"] == "y" * (MAX_CACHED_BYTES + 1)
    kept = [*caches.kv, *caches.tails, *(b"".join(k) for k in caches.attrs)]
    assert kept and all(len(k) <= MAX_CACHED_BYTES for k in kept)


def test_chip_type_is_derived_from_chip_id_or_kept_as_sent() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest as Req,
    )

    cases = [
        ({"chip.id": "node1/npu:3"}, ("node1/npu:3", "npu"), {}),
        ({"chip.id": "tpu:0"}, ("tpu:0", None), {}),  # names no known type: NULL
        ({"chip.id": "gpu:1", "chip.type": "gpu"}, ("gpu:1", "gpu"), {}),
        ({"chip.id": "x:1", "chip.type": "tpu"}, ("x:1", None), {"chip.type": "tpu"}),
        ({"chip.id": "gpu:2", "chip.type": "tpu"}, ("gpu:2", None), {"chip.type": "tpu"}),
    ]
    for attrs, columns, generic in cases:
        req = Req.FromString(sample_request(1, 1))
        span = req.resource_spans[0].scope_spans[0].spans[0]
        del span.attributes[:]
        for key, value in attrs.items():
            kv = span.attributes.add()
            kv.key, kv.value.string_value = key, value
        (row,) = decode(req.SerializeToString()).batch.to_pylist()
        assert (row["chip_id"], row["chip_type"]) == columns, attrs
        assert json.loads(row["attributes"] or "{}") == generic, attrs
        assert span_attributes(row) == attrs | (
            {"chip.type": columns[1]} if columns[1] and "chip.type" not in attrs else {}
        )


def _span_with(req: ExportTraceServiceRequest, sid: int, key: str) -> AnyValue:
    scope = req.resource_spans[0].scope_spans[0]
    span = scope.spans.add()
    span.trace_id, span.span_id, span.name = b"\x02" * 16, sid.to_bytes(8, "big"), f"s{sid}"
    span.start_time_unix_nano, span.end_time_unix_nano = 10, 20
    kv = span.attributes.add()
    kv.key = key
    return kv.value


def test_bad_values_cost_the_value_not_the_request() -> None:
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add()
    _span_with(req, 1, "text").string_value = "PLACEHOLDER"
    value = _span_with(req, 2, "deep")
    for _ in range(34):  # 34 kvlists: 102 message levels, past protobuf's 100
        value = value.kvlist_value.values.add(key="k").value
    value.string_value = "bottom"
    _span_with(req, 3, "fine").int_value = 7
    body = req.SerializeToString().replace(b"PLACEHOLDER", b"PLACE\xffOLDER")
    decoded = decode(body)
    rows = {r["span_id"]: r for r in decoded.batch.to_pylist()}
    assert len(rows) == 3 and decoded.rejected == 0
    attrs = {sid[-1]: json.loads(r["attributes"]) for sid, r in rows.items()}
    assert attrs[1] == {"text": "PLACE\ufffdOLDER"}  # replaced as in a span name
    deep, depth = attrs[2]["deep"], 0
    while isinstance(deep, dict):
        deep, depth = deep["k"], depth + 1
    assert (deep, depth) == (TRUNCATED, MAX_VALUE_DEPTH)
    assert attrs[3] == {"fine": 7}
    assert "1 attribute value(s) nested deeper than 32 levels cut" in decoded.message


def test_a_resource_nested_too_deep_costs_the_value_not_the_request() -> None:
    req = ExportTraceServiceRequest.FromString(sample_request(2, 1))
    value = req.resource_spans[0].resource.attributes.add(key="deep").value
    for _ in range(34):  # past protobuf's 100 message levels, which failed the request
        value = value.kvlist_value.values.add(key="k").value
    value.string_value = "bottom"
    decoded = decode(req.SerializeToString())
    assert decoded.batch.num_rows == 2 and decoded.rejected == 0
    resource = json.loads(decoded.batch.column("resource")[0].as_py())
    assert resource["service.name"] == "t"
    assert "1 attribute value(s) nested deeper than 32 levels cut" in decoded.message


def _varied_request(n: int, bad_utf8: bool = True) -> bytes:
    """n spans of one scope in SDK field order, varied where the column reader must be
    careful: roots and children, empty names, names with invalid UTF-8, no kind, events,
    links, statuses, typed and generic attributes."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "svc"
    rs.resource.attributes.add(key="process.pid").value.int_value = 42
    ss = rs.scope_spans.add()
    ss.scope.name = "lib"
    for i in range(n):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id = bytes([i % 3 + 1]) * 16, (i + 1).to_bytes(8, "big")
        if i % 4:
            sp.parent_span_id = (i // 4 + 1).to_bytes(8, "big")
        sp.name = "" if i % 7 == 0 else ("BAD" if i % 11 == 0 else f"op.{i % 5}")
        sp.kind = i % 3  # 0 is not written
        sp.start_time_unix_nano, sp.end_time_unix_nano = 10**18 + i, 10**18 + 2 * i + 1
        attrs = {"chip.id": f"gpu:{i % 4}", "layer": i % 6}
        if i % 5 == 0:
            attrs["op.flops"] = i << 20
        for key, value in attrs.items():
            kv = sp.attributes.add(key=key)
            if isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.string_value = value
        if i % 9 == 0:
            sp.status.code, sp.status.message = 2, "boom"
        if i % 13 == 0:
            sp.events.add(name="e", time_unix_nano=i)
        if i % 17 == 0:
            sp.links.add(trace_id=b"\x09" * 16, span_id=b"\x08" * 8)
    body = req.SerializeToString()
    return body.replace(b"BAD", b"B\xffD") if bad_utf8 else body


def test_scopes_read_whole_equal_spans_read_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import chiptrace.collector.span_reader as wire

    body = _varied_request(64)
    whole = decode(body)
    assert whole.batch.num_rows == 64 and not whole.reason
    names = {r["name"] for r in whole.batch.to_pylist()}
    assert {"", "B\ufffdD", "op.1"} <= names
    monkeypatch.setattr(wire, "MIN_SPANS", 10**9)  # every span by the per-span reader
    single = decode(body)
    assert whole.batch.schema == single.batch.schema
    assert whole.batch.to_pylist() == single.batch.to_pylist()
    monkeypatch.undo()
    body = _varied_request(64, bad_utf8=False)  # opentelemetry-proto refuses invalid UTF-8
    _check(body)
    # Two scopes: one read whole, one (too few spans) span by span, in one batch.
    req = ExportTraceServiceRequest.FromString(body)
    small = req.resource_spans[0].scope_spans.add()
    small.scope.name = "small"
    small.spans.add().CopyFrom(req.resource_spans[0].scope_spans[0].spans[1])
    small.spans[0].span_id = b"\x07" * 8
    mixed = _check(req.SerializeToString())
    assert mixed.num_rows == 65


def test_damaged_bodies_read_whole_raise_decode_error_or_decode() -> None:
    body = _varied_request(40)
    rng = random.Random(7)
    outcomes = set()
    for _ in range(300):
        damaged = bytearray(body)
        for _ in range(3):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            decode(bytes(damaged))
            outcomes.add("ok")
        except DecodeError:
            outcomes.add("error")
    assert outcomes == {"ok", "error"}
