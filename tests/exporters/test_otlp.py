"""OTLP export to a real receiver process: every span arrives exactly as stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import chiptrace
from chiptrace._attributes import attributes as span_attributes
from chiptrace.cli import main
from chiptrace.collector.decode import decode_any_value
from tests.exporters.conftest import Receiver, stored_rows


def _kv(attrs: Any) -> dict[str, Any]:
    return {kv.key: decode_any_value(kv.value) for kv in attrs}


def assert_received_as_stored(receiver: Receiver, directory: Path, where: str = "true") -> int:
    """Every stored span (matching `where`) arrived once, bit for bit."""
    rows = {r["span_id"]: r for r in stored_rows(directory, where)}
    got = receiver.spans()
    assert len(got) == len(rows) > 0
    assert len({sp.span_id for _, _, sp in got}) == len(got), "a span arrived twice"
    for resource, scope, sp in got:
        row = rows[sp.span_id]
        assert sp.trace_id == row["trace_id"]
        assert (sp.parent_span_id or None) == row["parent_span_id"]
        assert sp.name == row["name"]
        assert sp.kind == row["kind"]
        assert sp.start_time_unix_nano == row["start_ns"]
        assert sp.end_time_unix_nano == row["end_ns"]
        assert sp.status.code == row["status_code"]
        assert (sp.status.message or None) == row["status_message"]
        assert _kv(sp.attributes) == span_attributes(row)
        assert _kv(resource.attributes) == json.loads(row["resource"])
        assert scope.name == row["scope"]
        events = json.loads(row["events"]) if row["events"] else []
        assert [(e.name, e.time_unix_nano, _kv(e.attributes)) for e in sp.events] == [
            (e["name"], e["time_ns"], e["attributes"]) for e in events
        ]
        links = json.loads(row["links"]) if row["links"] else []
        assert [(lk.trace_id.hex(), lk.span_id.hex(), _kv(lk.attributes)) for lk in sp.links] == [
            (lk["trace_id"], lk["span_id"], lk["attributes"]) for lk in links
        ]
    return len(got)


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_cli_export_arrives_exactly(
    code_trace: Path,
    receiver: Receiver,
    proto: str,
    compression: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = receiver.http_url if proto == "http" else receiver.grpc_url
    rc = main(
        [
            "export",
            str(code_trace),
            "--otlp",
            url,
            "--compression",
            compression,
            "--batch-size",
            "3",
        ]
    )
    assert rc == 0
    n = assert_received_as_stored(receiver, code_trace)
    assert n == 11
    assert f"sent {n} spans in " in capsys.readouterr().out
    sizes = [
        sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans)
        for r in receiver.requests()
    ]
    assert max(sizes) == 3
    assert receiver.stats()["encodings"][0] == (
        "grpc" if proto == "grpc" else compression.replace("none", "")
    )


def test_resource_and_scope_grouping(code_trace: Path, receiver: Receiver) -> None:
    assert main(["export", str(code_trace), "--otlp", receiver.http_url, "--no-progress"]) == 0
    (req,) = receiver.requests()
    groups = {
        _kv(rs.resource.attributes)["service.name"]: sorted(ss.scope.name for ss in rs.scope_spans)
        for rs in req.resource_spans
    }
    assert groups == {"trainer": ["chiptrace"], "remote": ["io.other", "io.remote"]}


def test_env_conventions(
    code_trace: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.http_url + "/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # the traces one wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abc,x-team=rack")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=chips")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5000")
    assert main(["export", str(code_trace), "--otlp"]) == 0
    stats = receiver.stats()
    assert stats["encodings"] == ["gzip"]
    headers = stats["headers"][0]
    assert headers["authorization"] == "Bearer abc" and headers["x-team"] == "chips"
    assert headers["user-agent"].startswith("chiptrace/")
    assert_received_as_stored(receiver, code_trace)


def test_grpc_headers_as_metadata(code_trace: Path, receiver: Receiver) -> None:
    rc = main(["export", str(code_trace), "--otlp", receiver.grpc_url, "--header", "X-Tenant=a"])
    assert rc == 0
    assert receiver.stats()["headers"][0]["x-tenant"] == "a"


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_retries_transient_failures(code_trace: Path, flaky_receiver: Receiver, proto: str) -> None:
    url = flaky_receiver.http_url if proto == "http" else flaky_receiver.grpc_url
    assert main(["export", str(code_trace), "--otlp", url, "--retries", "3"]) == 0
    assert flaky_receiver.stats()["failed"] == 2
    assert_received_as_stored(flaky_receiver, code_trace)


def test_gives_up_with_one_line_saying_what_was_sent(
    code_trace: Path, flaky_receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["export", str(code_trace), "--otlp", flaky_receiver.http_url, "--retries", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert len(err.splitlines()) == 1
    assert "HTTP 503" in err and "after 2 attempt(s)" in err and "sent 0 of 11 spans" in err


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_unreachable_endpoint(
    code_trace: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    rc = main(
        [
            "export",
            str(code_trace),
            "--otlp",
            f"{scheme}://127.0.0.1:9",
            "--retries",
            "1",
            "--timeout",
            "2",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.startswith("chiptrace: error: OTLP export to") and len(err.splitlines()) == 1
    assert "sent 0 of 11 spans" in err


def test_filters(code_trace: Path, receiver: Receiver) -> None:
    trace = "07" * 16
    assert main(["export", str(code_trace), "--otlp", receiver.http_url, "--trace-id", trace]) == 0
    assert {sp.trace_id.hex() for _, _, sp in receiver.spans()} == {trace}
    assert len(receiver.spans()) == 4
    assert (
        main(
            [
                "export",
                str(code_trace),
                "--otlp",
                receiver.http_url,
                "--where",
                "chip_type = 'gpu' AND op_flops > 0",
            ]
        )
        == 0
    )
    # The three matmuls, and their parent `step` as context: a closed tree.
    assert sorted(sp.name for _, _, sp in receiver.spans()[4:]) == [
        "_decorated_workload.matmul"
    ] * 3 + ["step"]
    assert (
        main(
            [
                "export",
                str(code_trace),
                "--otlp",
                receiver.http_url,
                "--since",
                "1970-01-01T00:00:00.000001Z",
                "--until",
                "1200",
            ]
        )
        == 0
    )
    assert sorted(sp.name for _, _, sp in receiver.spans()[8:]) == ["copy", "req", "send"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--otlp", "ftp://x:1"], "expected a URL like http://127.0.0.1:4318"),
        (["--otlp", "http://127.0.0.1:99999"], "port"),
        (["--otlp", "http://h:1", "--trace-id", "xyz"], "--trace-id 'xyz'"),
        (["--otlp", "http://h:1", "--where", "nope ="], "SQL error"),
        (["--otlp", "http://h:1", "--header", "novalue"], "'novalue' is not key=value"),
        (["--format", "chrome"], "needs -o FILE"),
        (["--format", "chrome", "--otlp", "http://h:1"], "cannot be combined"),
    ],
)
def test_user_mistakes_are_one_line(
    code_trace: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["export", str(code_trace), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_env_timeout_is_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from chiptrace.errors import ConfigError
    from chiptrace.exporters.otlp_config import resolve

    s = resolve(
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}
    )
    assert (s.url, s.timeout_s, s.protocol) == ("http://c:4318/v1/traces", 2.5, "http/protobuf")
    s = resolve(
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert (s.protocol, s.target) == ("grpc", "c:4317")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TIMEOUT"):
        resolve(env={"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="compression"):
        resolve(env={"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"})


@pytest.mark.parametrize("via_env", [False, True])
def test_live_sink_streams_while_storing(
    tmp_path: Path, receiver: Receiver, via_env: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init(otlp_endpoint=...) and OTEL_EXPORTER_OTLP_ENDPOINT: stored and streamed alike."""
    out = tmp_path / "live"
    if via_env:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_url)
        rec = chiptrace.init(out, service="live", flush_interval_s=60)
    else:
        rec = chiptrace.init(
            out, service="live", flush_interval_s=60, otlp_endpoint=receiver.http_url
        )
    from chiptrace.exporters.otlp import OtlpSink

    assert any(isinstance(s, OtlpSink) for s in rec.sinks)
    for i in range(5):
        with chiptrace.span("op", chip=f"gpu:{i % 2}") as s:
            s.set_attribute("i", i)
    chiptrace.shutdown()
    assert assert_received_as_stored(receiver, out) == 5


def test_live_sink_to_a_dead_endpoint_neither_blocks_nor_loses_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from chiptrace.exporters.otlp import OtlpSink

    out = tmp_path / "dead"
    rec = chiptrace.init(
        out, service="live", flush_interval_s=60, otlp_endpoint="http://127.0.0.1:9"
    )
    (sink,) = [s for s in rec.sinks if isinstance(s, OtlpSink)]
    for _ in range(3):
        with chiptrace.span("op", chip="gpu:0"):
            pass
    chiptrace.shutdown()
    assert len(stored_rows(out)) == 3
    assert (sink.sent, sink.failed + sink.dropped) == (0, 3)
    assert "OTLP export to http://127.0.0.1:9/v1/traces failed" in caplog.text


def test_progress_bar_draws_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from chiptrace.cli.export import Progress

    bar = Progress(4, True)
    bar(2)
    bar(2)
    bar.end()
    err = capsys.readouterr().err
    assert "4/4 spans" in err and "#" * 30 in err


def test_live_sink_uses_the_traces_endpoint_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from chiptrace.exporters.otlp import OtlpSink

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/custom/traces")
    sink = OtlpSink("http://127.0.0.1:9/custom/traces")
    try:
        assert sink.settings.url == "http://127.0.0.1:9/custom/traces"
    finally:
        sink.close(timeout_s=0.1)
    sink = OtlpSink("http://127.0.0.1:9")
    assert sink.settings.url == "http://127.0.0.1:9/v1/traces"
    sink.close(timeout_s=0.1)


def test_failure_midway_says_how_many_spans_got_there(
    code_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = Receiver(tmp_path, "--fail-after", "2")
    try:
        rc = main(
            [
                "export",
                str(code_trace),
                "--otlp",
                rec.http_url,
                "--batch-size",
                "3",
                "--retries",
                "1",
            ]
        )
        err = capsys.readouterr().err.strip()
        assert rc == 1 and len(err.splitlines()) == 1
        assert "sent 6 of 11 spans" in err
        assert len(rec.spans()) == 6
    finally:
        rec.stop()


def test_env_protocol_grpc_with_an_http_url(
    code_trace: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's style: OTEL_EXPORTER_OTLP_PROTOCOL=grpc and an http:// endpoint."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.grpc_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    assert main(["export", str(code_trace), "--otlp"]) == 0
    assert receiver.stats()["encodings"] == ["grpc"]
    assert_received_as_stored(receiver, code_trace)
