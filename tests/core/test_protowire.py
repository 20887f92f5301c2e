"""The one protobuf wire codec: what the exporter writes, the collector reads back."""

from __future__ import annotations

import pytest

from chiptrace._protowire import WireError, fields, key_value, message_field, read_varint, varint


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**63 - 1])
def test_varint_round_trips(n: int) -> None:
    raw = varint(n)
    assert read_varint(raw, 0) == (n, len(raw))


def test_negative_int64_is_ten_bytes_twos_complement() -> None:
    raw = varint(-1)
    assert len(raw) == 10 and read_varint(raw, 0)[0] == 2**64 - 1


def test_fields_read_what_was_written() -> None:
    body = message_field(1, b"abc") + b"\x10" + varint(300)
    body += message_field(3, key_value("chip.id", "gpu:0"))
    got = list(fields(body, 0, len(body)))
    assert [(n, wt) for n, wt, _ in got] == [(1, 2), (2, 0), (3, 2)]
    lo, hi = got[0][2]
    assert body[lo:hi] == b"abc" and got[1][2] == 300
    lo, hi = got[2][2]
    inner = list(fields(body, lo, hi))
    k_lo, k_hi = inner[0][2]
    assert body[k_lo:k_hi] == b"chip.id"


def test_truncated_message_is_a_wire_error() -> None:
    body = message_field(1, b"abcdef")
    with pytest.raises(WireError, match="past its message"):
        list(fields(body[:-2], 0, len(body) - 2))
