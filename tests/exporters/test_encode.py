"""The columnar OTLP encoder against opentelemetry-proto and the SDK's own encoder."""

from __future__ import annotations

import glob
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from chiptrace import _protowire as _wire
from chiptrace.collector.decode import decode_any_value
from chiptrace.exporters.otlp_encode import encode_request, encode_spans, requests
from chiptrace.recording.otel_sinks import batch_to_readable_spans
from tests.exporters.conftest import stored_table


def _by_span(req: ExportTraceServiceRequest) -> dict[bytes, dict]:
    """span id -> the span's dict with its resource and scope, attributes order-free."""
    out = {}
    for rs in req.resource_spans:
        res = {kv.key: decode_any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                d = MessageToDict(sp)
                d["attributes"] = {kv.key: decode_any_value(kv.value) for kv in sp.attributes}
                d.pop("flags", None)  # the SDK sets only the is-remote bits here
                out[sp.span_id] = {"span": d, "resource": res, "scope": ss.scope.name}
    return out


def test_same_spans_as_the_sdk_encoder(code_trace: Path) -> None:
    table = stored_table(code_trace)
    ours = ExportTraceServiceRequest.FromString(encode_request(table))
    sdk = sdk_encode(list(batch_to_readable_spans(table)))
    assert _by_span(ours) == _by_span(sdk)


def test_store_schema_and_duckdb_types_encode_alike(code_trace: Path) -> None:
    parquet = pq.read_table(sorted(glob.glob(str(code_trace / "spans" / "*.parquet"))))
    assert pa.types.is_dictionary(parquet.schema.field("name").type)
    duck = stored_table(code_trace)
    a = _by_span(ExportTraceServiceRequest.FromString(encode_request(parquet)))
    b = _by_span(ExportTraceServiceRequest.FromString(encode_request(duck)))
    assert a == b and len(a) == 11


def test_requests_split_and_keep_every_span(code_trace: Path) -> None:
    enc = encode_spans(stored_table(code_trace))
    reqs = list(requests(enc, max_spans=4))
    assert [n for _, n in reqs] == [4, 4, 3]
    ids = [sid for body, _ in reqs for sid in _by_span(ExportTraceServiceRequest.FromString(body))]
    assert sorted(ids) == sorted(stored_table(code_trace).column("span_id").to_pylist())


@pytest.mark.parametrize(
    "value",
    [
        "",
        "é",
        0,
        -1,
        2**63 - 1,
        -(2**63),
        1.5,
        -0.0,
        True,
        False,
        [1, "a", [2.5]],
        {"k": {"j": [True]}},
    ],
)
def test_any_value_round_trip(value: object) -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    assert decode_any_value(AnyValue.FromString(_wire.any_value(value))) == value


def test_sliced_batches_encode_their_own_rows(code_trace: Path) -> None:
    table = pq.read_table(
        sorted(glob.glob(str(code_trace / "spans" / "*.parquet")))
    ).combine_chunks()
    part = table.slice(2, 3)
    got = _by_span(ExportTraceServiceRequest.FromString(encode_request(part)))
    assert sorted(got) == sorted(part.column("span_id").to_pylist())


def test_odd_json_columns_do_not_break_the_encoder() -> None:
    from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary

    batch = batch_from_columns(
        {
            "trace_id": trace_ids_to_binary([b"\1" * 16] * 4),
            "span_id": ids_to_binary([1, 2, 3, 4]),
            "name": "x",
            "start_ns": [1, 2, 3, 4],
            "end_ns": [5, 6, 7, 8],
            "attributes": ["{not json", "[1,2]", '{"a":{"b":null}}', None],
            "events": ['[{"name":"e","attributes":[1]}]', '"text"', "[1]", None],
            "links": [
                '[{"span_id":"zz"}]',
                '[{"trace_id":"01","span_id":"02","attributes":{}}]',
                "{}",
                None,
            ],
        }
    )
    got = _by_span(ExportTraceServiceRequest.FromString(encode_request(batch)))
    spans = [got[i.to_bytes(8, "big")]["span"] for i in (1, 2, 3, 4)]
    assert spans[0]["attributes"] == {} and spans[1]["attributes"] == {}
    assert spans[2]["attributes"] == {"a": {"b": None}}
    assert spans[0]["events"][0]["name"] == "e" and "links" not in spans[0]
    assert len(spans[1]["links"]) == 1 and "events" not in spans[1]
