"""OpenTelemetry span limits by their OTEL_* names, and the buffer bounded in bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import chiptrace
from chiptrace import config
from chiptrace.errors import ConfigError
from tests.conftest import spans_by_name


def test_span_limits_from_the_otel_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "2")
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "1")
    out = tmp_path / "t"
    chiptrace.init(out, flush_interval_s=3600)
    try:
        with chiptrace.span("outer") as o:
            ctx = o.get_span_context()
            with chiptrace.span("s") as s:
                for i in range(10):
                    s.set_attribute(f"k{i}", "abcdefgh")
                s.set_attribute("k0", "again")  # a key it has: replaced, not refused
                for i in range(5):
                    s.add_event(f"e{i}")
                s.add_link(ctx)
                s.add_link(ctx)
        (row,) = spans_by_name(out)["s"]
    finally:
        monkeypatch.delenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT")
        monkeypatch.delenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
        monkeypatch.delenv("OTEL_SPAN_EVENT_COUNT_LIMIT")
        monkeypatch.delenv("OTEL_SPAN_LINK_COUNT_LIMIT")
        chiptrace.init(tmp_path / "u")  # the limits back to their defaults
        chiptrace.shutdown()
    attrs = json.loads(row["attributes"])
    assert attrs == {"k0": "again", "k1": "abcde", "k2": "abcde"}
    assert [e["name"] for e in json.loads(row["events"])] == ["e0", "e1"]
    assert len(json.loads(row["links"])) == 1


def _limited(monkeypatch: pytest.MonkeyPatch, **limits: str) -> None:
    for name, value in limits.items():
        monkeypatch.setenv(f"OTEL_{name}", value)


def test_attributes_given_at_once_are_bounded_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK bounds a span's start attributes as it does set_attribute's; so must
    # span(attributes=...), a decorator's attributes and an event's values.
    _limited(monkeypatch, SPAN_ATTRIBUTE_COUNT_LIMIT="2", ATTRIBUTE_VALUE_LENGTH_LIMIT="3")
    out = tmp_path / "t"
    chiptrace.init(out, flush_interval_s=3600)
    try:

        @chiptrace.trace(name="decorated", attributes={"d0": "abcdef", "d1": 1, "d2": 2})
        def decorated() -> None:
            pass

        decorated()
        with chiptrace.span("s", attributes={"a0": "abcdef", "a1": 1, "a2": 2}) as s:
            s.add_event("e", {"k": "abcdef"})
        rows = spans_by_name(out)
    finally:
        monkeypatch.undo()
        chiptrace.init(tmp_path / "u")  # the limits back to their defaults
        chiptrace.shutdown()
    (d,) = rows["decorated"]
    (row,) = rows["s"]
    assert json.loads(d["attributes"]) == {"d0": "abc", "d1": 1}
    assert json.loads(row["attributes"]) == {"a0": "abc", "a1": 1}
    assert json.loads(row["events"])[0]["attributes"] == {"k": "abc"}


def test_a_limit_of_zero_keeps_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _limited(
        monkeypatch,
        SPAN_ATTRIBUTE_COUNT_LIMIT="0",
        SPAN_EVENT_COUNT_LIMIT="0",
        SPAN_LINK_COUNT_LIMIT="0",
    )
    out = tmp_path / "t"
    chiptrace.init(out, flush_interval_s=3600)
    try:
        with chiptrace.span("outer") as o:
            with chiptrace.span("s", attributes={"a": 1}) as s:
                s.set_attribute("b", 2)
                s.add_event("e")
                s.add_link(o.get_span_context())
        (row,) = spans_by_name(out)["s"]
    finally:
        monkeypatch.undo()
        chiptrace.init(tmp_path / "u")
        chiptrace.shutdown()
    assert (row["attributes"], row["events"], row["links"]) == (None, None, None)


def test_bad_limit_is_one_line_naming_it() -> None:
    with pytest.raises(
        ConfigError, match="OTEL_SPAN_EVENT_COUNT_LIMIT='many': expected a whole number"
    ):
        config.span_limits({"OTEL_SPAN_EVENT_COUNT_LIMIT": "many"})


def test_buffer_is_bounded_in_bytes(tmp_path: Path) -> None:
    rec = chiptrace.init(tmp_path / "t", flush_interval_s=3600, flush_spans=10**9)
    assert rec is not None
    rec.max_bytes = 2 << 20  # 2 MiB: about a thousand rows carrying a 1 KB attribute
    try:
        for _ in range(5000):
            with chiptrace.span("big") as s:
                s.set_attribute("blob", "x" * 1000)
        assert rec.dropped > 0
        assert rec._full_bytes <= rec.max_bytes
        kept = chiptrace.flush()
        assert 0 < kept < 5000 and kept + rec.dropped == 5000
    finally:
        chiptrace.shutdown()


@pytest.mark.parametrize("carry", ["event", "list", "bytes"])
def test_the_byte_bound_counts_events_lists_and_bytes(tmp_path: Path, carry: str) -> None:
    """What a span carries in an event, a list value or bytes counts toward
    CHIPTRACE_MAX_BUFFERED_BYTES as a string attribute does (288 MB sat under 20 MiB)."""
    rec = chiptrace.init(tmp_path / "t", flush_interval_s=3600, flush_spans=10**9)
    assert rec is not None
    rec.max_bytes = 2 << 20
    try:
        for _ in range(5000):
            with chiptrace.span("big") as s:
                if carry == "event":
                    s.add_event("e", {"blob": "x" * 1000})
                elif carry == "list":
                    s.set_attribute("blob", ["x" * 100] * 10)
                else:
                    s.set_attribute("blob", b"x" * 1000)
        assert rec.dropped > 0
        assert rec._full_bytes <= rec.max_bytes
    finally:
        chiptrace.shutdown()


def test_a_full_tag_table_checks_new_tags_on_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chiptrace.recording import sites as _sites

    out = tmp_path / "t"
    rec = chiptrace.init(out, flush_interval_s=3600)
    assert rec is not None
    monkeypatch.setattr(_sites, "MAX_TAGS", len(_sites._by_value))  # full from now on
    try:
        with chiptrace.span("xfer", link="nvlink6:gpu:900-gpu:901"):
            pass
        with chiptrace.span("bad", link="warp9:gpu:0-gpu:1"):  # no ChipError at the call
            pass
        rows = spans_by_name(out)
    finally:
        monkeypatch.undo()
        chiptrace.shutdown()
    (x,) = rows["xfer"]
    assert (x["link_type"], x["link_src"], x["link_dst"]) == ("nvlink6", "gpu:900", "gpu:901")
    assert x["op_kind"] == "comm" and "bad" not in rows
    assert rec.spans_rejected == 1
