"""Exports are strict JSON whatever the store holds: NaN and infinities become the strings
the OTLP JSON encoding writes ("NaN", "Infinity", "-Infinity"), and every attribute type
comes back from Jaeger JSON as it went out (Chrome args carry no types: the non-finite
floats come back as those strings)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import chiptrace
from chiptrace.cli import main

BIG = 1152921504606846979  # 2^60 + 3

ATTRS: dict[str, Any] = {
    "str": "text",
    "empty": "",
    "bool": True,
    "int": -7,
    "big": BIG,
    "float": 2.5,
    "nan": math.nan,
    "inf": math.inf,
    "ninf": -math.inf,
    "strs": ["a", "b"],
    "bools": [True, False],
    "ints": [1, BIG],
    "floats": [1.5, math.nan, math.inf, -math.inf],
}
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity"}
# Lists as strict JSON writes them: non-finite floats as text.
AS_TEXT: dict[str, Any] = {"floats": [1.5, "NaN", "Infinity", "-Infinity"]}


def _strict(path: Path) -> Any:
    """json.loads as a browser's JSON.parse reads it: NaN/Infinity are errors."""

    def refuse(name: str) -> None:
        raise ValueError(f"{path.name}: {name} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, list):
        return isinstance(got, list) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    return type(got) is type(want) and got == want


@pytest.fixture
def store(tmp_path: Path) -> Path:
    out = tmp_path / "t"
    chiptrace.init(out, flush_interval_s=3600, resource={"rack.temp": math.nan})
    try:
        with chiptrace.span("every-type", chip="gpu:0") as s:
            for k, v in ATTRS.items():
                s.set_attribute(k, v)
            s.add_event("sample", {"nan": math.nan, "inf": math.inf})
    finally:
        chiptrace.shutdown()
    return out


def _attributes(directory: Path) -> tuple[dict[str, Any], list[Any]]:
    con = chiptrace.connect(directory)
    raw, events = con.sql("SELECT attributes, events FROM spans").fetchall()[0]
    return json.loads(raw), json.loads(events or "[]")


def test_jaeger_json_is_strict_and_round_trips_every_type(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "j.json"
    assert main(["export", str(store), "-f", "jaeger-json", "-o", str(out)]) == 0
    doc = _strict(out)
    (span,) = doc["data"][0]["spans"]
    tags = {t["key"]: t for t in span["tags"]}
    for k, text in NON_FINITE.items():
        assert tags[k] == {"key": k, "type": "float64", "value": text}
    assert tags["big"]["value"] == str(BIG)
    assert json.loads(tags["floats"]["value"]) == [1.5, "NaN", "Infinity", "-Infinity"]
    assert {"key": "nan", "type": "float64", "value": "NaN"} in span["logs"][0]["fields"]

    back = tmp_path / "back"
    assert main(["import", str(out), "--out", str(back)]) == 0
    attrs, events = _attributes(back)
    for k, want in ATTRS.items():
        if isinstance(want, list):  # Jaeger tags have no list type: JSON text, as Jaeger does
            want = json.dumps(AS_TEXT.get(k, want), separators=(",", ":"))
        assert _same(attrs[k], want), (k, attrs[k], want)
    assert math.isinf(events[0]["attributes"]["inf"])


def test_chrome_json_is_strict_and_round_trips_every_type(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert main(["export", str(store), "-f", "chrome", "-o", str(out)]) == 0
    doc = _strict(out)
    assert isinstance(doc["traceEvents"], list)
    (span,) = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for k, text in NON_FINITE.items():
        assert span["args"][k] == text
    (instant,) = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert instant["args"] == {"nan": "NaN", "inf": "Infinity"}

    back = tmp_path / "back"
    assert main(["import", str(out), "--out", str(back)]) == 0
    attrs, _ = _attributes(back)
    for k, want in ATTRS.items():
        if isinstance(want, float) and not math.isfinite(want):
            want = NON_FINITE[k]
        elif k == "big":
            want = str(BIG)  # past 2^53 as text, as Jaeger writes it
        elif k == "ints":  # Chrome args are JSON numbers: past 2^53 as text
            want = [1, str(BIG)]
        else:
            want = AS_TEXT.get(k, want)
        assert _same(attrs[k], want), (k, attrs[k], want)
