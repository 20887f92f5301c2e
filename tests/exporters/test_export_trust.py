"""Exports a user can trust to load and to mean what the store means: flows for every
link, forward in time; filtered exports that are closed trees; int64 beyond 2^53 exact;
Jaeger JSON split into files the Jaeger UI loads, each on its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chiptrace.cli import main
from chiptrace.emulator import emulate
from chiptrace.importers.jaeger import read_jaeger_json
from chiptrace.schema import batch_from_columns, ids_to_binary, trace_ids_to_binary
from chiptrace.store import PartWriter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "jaeger"
BIG = 1152921504606846979  # 2^60 + 3: a double would print 1152921504606847000


def _write(directory: Path, rows: list[dict]) -> None:
    cols = {k: [r.get(k) for r in rows] for k in {k for r in rows for k in r}}
    cols["trace_id"] = trace_ids_to_binary(cols["trace_id"])
    cols["span_id"] = ids_to_binary(cols["span_id"])
    cols["parent_span_id"] = ids_to_binary([p or 0 for p in cols["parent_span_id"]], True)
    PartWriter(directory).write(batch_from_columns(cols, len(rows)))


def _span(trace: int, sid: int, parent: int, name: str, start: int, end: int, **kw) -> dict:
    t0 = 1_800_000_000_000_000_000
    return {
        "trace_id": bytes([trace]) * 16,
        "span_id": sid,
        "parent_span_id": parent,
        "name": name,
        "start_ns": t0 + start,
        "end_ns": t0 + end,
        "service": "svc",
        **kw,
    }


def _link(trace: int, sid: int) -> str:
    return json.dumps([{"trace_id": f"{trace:02x}" * 16, "span_id": f"{sid:016x}"}])


def test_every_link_is_a_flow_forward_in_time(tmp_path: Path) -> None:
    d = tmp_path / "t"
    _write(
        d,
        [
            _span(
                1, 1, 0, "early", 0, 100_000, chip_id="cpu:0", links=_link(1, 2)
            ),  # to a later span
            _span(1, 2, 0, "late", 200_000, 300_000, chip_id="gpu:0"),
            _span(1, 3, 0, "consumer", 400_000, 500_000, chip_id="gpu:1", links=_link(1, 4)),
            _span(1, 4, 0, "producer", 100_000, 150_000, chip_id="dpu:0"),
            _span(1, 5, 0, "outer", 0, 100_000, chip_id="npu:0", links=_link(1, 6)),  # overlap
            _span(1, 6, 0, "inner", 50_000, 80_000, chip_id="nic:0"),
            _span(2, 7, 0, "other trace", 600_000, 700_000, chip_id="cpu:1", links=_link(1, 2)),
            _span(1, 8, 0, "dangling", 0, 10, chip_id="cpu:2", links=_link(1, 99)),  # not stored
        ],
    )
    out = tmp_path / "c.json"
    assert main(["export", str(d), "--format", "chrome", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "displayTimeUnit" not in doc
    slices = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == 4  # every stored link
    arrows = set()
    for fid, s in starts.items():
        f = ends[fid]
        assert s["ts"] <= f["ts"]  # forward in time
        src = next(x for x in slices.values() if (x["pid"], x["tid"]) == (s["pid"], s["tid"]))
        dst = next(x for x in slices.values() if (x["pid"], x["tid"]) == (f["pid"], f["tid"]))
        assert src["ts"] <= s["ts"] <= src["ts"] + src["dur"]
        assert dst["ts"] <= f["ts"] <= dst["ts"] + dst["dur"]
        arrows.add((src["name"], dst["name"]))
    assert arrows == {
        ("early", "late"),  # a link to a later span leaves from the linking span
        ("producer", "consumer"),
        ("inner", "outer"),
        ("late", "other trace"),
    }


def _closed(doc: dict) -> int:
    """Every reference (parent or link) names a span of the file; returns the links
    dropped and noted because their target is not in it."""
    ids = {(tr["traceID"], sp["spanID"]) for tr in doc["data"] for sp in tr["spans"]}
    noted = 0
    for tr in doc["data"]:
        for sp in tr["spans"]:
            for ref in sp["references"]:
                where = (ref["traceID"], ref["spanID"])
                assert where in ids, f"{sp['operationName']} refers outside the file"
            tags = {t["key"]: t["value"] for t in sp["tags"]}
            noted += len(tags.get("chiptrace.links_left_out", "").split(",")) - (
                "chiptrace.links_left_out" not in tags
            )
    return noted


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return emulate(steps=3, seed=4, out=tmp_path_factory.mktemp("emu") / "t", progress=False).out


@pytest.mark.parametrize(
    "flt",
    [
        ["--where", "name = 'fwd.0'"],  # its inputs: links to transfers left out
        ["--where", "link_id IS NOT NULL AND op_bytes > 1000"],
        ["--since", "1767225600080000000", "--until", "1767225600120000000"],
    ],
)
def test_filtered_exports_are_closed_trees(emulated: Path, tmp_path: Path, flt: list[str]) -> None:
    out = tmp_path / "j.json"
    assert main(["export", str(emulated), "--format", "jaeger-json", "-o", str(out), *flt]) == 0
    doc = json.loads(out.read_text())
    noted = _closed(doc)
    if flt[1] == "name = 'fwd.0'":
        assert noted > 0
    assert not read_jaeger_json(out).warnings
    for tr in doc["data"]:  # the trace is named after its real root again
        roots = [
            sp
            for sp in tr["spans"]
            if not sp["references"] or all(r["refType"] != "CHILD_OF" for r in sp["references"])
        ]
        assert [r["operationName"] for r in roots] == ["train_step"]
    chrome = tmp_path / "c.json"
    assert main(["export", str(emulated), "--format", "chrome", "-o", str(chrome), *flt]) == 0
    xs = [e for e in json.loads(chrome.read_text())["traceEvents"] if e["ph"] == "X"]
    ids = {e["args"]["span_id"] for e in xs}
    assert all(e["args"].get("parent_span_id", next(iter(ids))) in ids for e in xs)


def test_a_parent_outside_the_store_is_dropped_from_a_filtered_export(tmp_path: Path) -> None:
    d = tmp_path / "t"
    _write(d, [_span(3, 1, 77, "child of a remote span", 0, 10), _span(3, 2, 1, "leaf", 1, 5)])
    out = tmp_path / "j.json"
    assert (
        main(
            [
                "export",
                str(d),
                "--format",
                "jaeger-json",
                "-o",
                str(out),
                "--where",
                "name = 'leaf'",
            ]
        )
        == 0
    )
    (tr,) = json.loads(out.read_text())["data"]
    refs = {sp["operationName"]: sp["references"] for sp in tr["spans"]}
    assert refs["child of a remote span"] == [] and refs["leaf"][0]["spanID"] == f"{1:016x}"


def test_int64_beyond_2_53_is_a_decimal_string(tmp_path: Path) -> None:
    d = tmp_path / "t"
    attrs = json.dumps({"big": BIG, "small": 2**53 - 1, "list": [BIG, 1]})
    _write(d, [_span(4, 1, 0, "x", 0, 10, op_bytes=BIG, attributes=attrs)])
    j, c = tmp_path / "j.json", tmp_path / "c.json"
    assert main(["export", str(d), "--format", "jaeger-json", "-o", str(j)]) == 0
    assert main(["export", str(d), "--format", "chrome", "-o", str(c)]) == 0
    (sp,) = json.loads(j.read_text())["data"][0]["spans"]
    tags = {t["key"]: t for t in sp["tags"]}
    assert tags["op.bytes"] == {"key": "op.bytes", "type": "int64", "value": str(BIG)}
    assert tags["big"]["value"] == str(BIG) and tags["small"]["value"] == 2**53 - 1
    assert json.loads(tags["list"]["value"]) == [BIG, 1]  # a JSON string: exact as it is
    (x,) = [e for e in json.loads(c.read_text())["traceEvents"] if e["ph"] == "X"]
    assert x["args"]["op.bytes"] == str(BIG) and x["args"]["list"] == [str(BIG), 1]
    assert x["args"]["small"] == 2**53 - 1


def _is_context(span: dict) -> bool:
    return any(t["key"] == "chiptrace.context" for t in span["tags"])


def assert_closed_tree(trace: dict) -> None:
    """Every span a reference of this trace names (in this trace) is in the file, and the
    trace is one tree: one root."""
    ids = {sp["spanID"] for sp in trace["spans"]}
    for sp in trace["spans"]:
        for ref in sp["references"]:
            if ref["traceID"] == trace["traceID"]:
                assert ref["spanID"] in ids, (sp["operationName"], ref)
    roots = [sp for sp in trace["spans"] if not sp["references"]]
    assert len(roots) == 1, [sp["operationName"] for sp in roots]


def _many_traces(d: Path) -> int:
    rows = []
    sid = 0
    for t in range(1, 31):  # 30 traces of 60 spans
        root = sid = sid + 1
        rows.append(_span(t, root, 0, "step", t * 1000, t * 1000 + 900))
        for k in range(59):
            sid += 1
            rows.append(
                _span(t, sid, root, f"op{k}", t * 1000 + k, t * 1000 + k + 5, chip_id="gpu:0")
            )
    root = sid = sid + 1  # one trace far bigger than a file
    rows.append(_span(200, root, 0, "huge", 0, 10**7))
    for k in range(4000):
        sid += 1
        # the last 1000 link to spans 3000 earlier: in an earlier file once the trace is cut
        link = {"links": _link(200, sid - 3000)} if k >= 3000 else {}
        attrs = json.dumps({"k": k})
        rows.append(_span(200, sid, root, "tiny", 10 + k, 11 + k, attributes=attrs, **link))
    _write(d, rows)
    return len(rows)


def test_split_jaeger_json_files_each_load_alone(tmp_path: Path, capsys) -> None:
    d = tmp_path / "t"
    total = _many_traces(d)
    out = tmp_path / "big.json"
    assert (
        main(["export", str(d), "--format", "jaeger-json", "-o", str(out), "--split-mb", "0.2"])
        == 0
    )
    err = capsys.readouterr().err
    assert "--split-mb 0.2" in err and "530 MB" in err and len(err.strip().splitlines()) == 1
    files = sorted(tmp_path.glob("big-*.json"))
    assert not out.exists() and len(files) >= 4
    assert [f.name for f in files] == [f"big-{i:03d}.json" for i in range(1, len(files) + 1)]
    seen: dict[str, list[int]] = {}
    spans = links = 0
    for i, f in enumerate(files):
        assert f.stat().st_size < 0.2e6 + 20_000  # the limit, plus at most a few spans
        doc = read_jaeger_json(f)  # loads on its own
        raw = json.loads(f.read_text())
        assert raw["total"] == len(raw["data"])
        for tr in doc.traces:
            seen.setdefault(tr["traceID"], []).append(i)
            pids = {sp["processID"] for sp in tr["spans"]}
            assert pids <= set(tr["processes"])
            assert_closed_tree(tr)
            spans += sum(1 for sp in tr["spans"] if not _is_context(sp))
            for sp in tr["spans"]:
                tags = {t["key"]: t["value"] for t in sp["tags"]}
                links += sum(r["refType"] == "FOLLOWS_FROM" for r in sp["references"])
                links += "chiptrace.links_left_out" in tags
    assert spans == total
    assert links == 1000  # each link is a reference in its file, or noted as left out
    small = {t: fs for t, fs in seen.items() if not t.startswith("c8")}
    assert len(small) == 30 and all(len(fs) == 1 for fs in small.values())  # whole traces
    huge = seen["c8" * 16]
    assert len(huge) >= 2 and huge == list(range(huge[0], huge[0] + len(huge)))  # cut by time

    one = tmp_path / "one.json"
    assert main(["export", str(d), "--format", "jaeger-json", "-o", str(one)]) == 0
    assert one.exists() and not list(tmp_path.glob("one-*.json"))  # under the default 400 MB


def test_split_mb_only_for_files(tmp_path: Path, capsys) -> None:
    d = tmp_path / "t"
    _write(d, [_span(5, 1, 0, "x", 0, 10)])
    assert main(["export", str(d), "--otlp", "http://127.0.0.1:9", "--split-mb", "5"]) == 2
    assert "--split-mb" in capsys.readouterr().err


def test_jaeger_json_has_the_shape_of_the_real_files(code_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "j.json"
    assert main(["export", str(code_trace), "--format", "jaeger-json", "-o", str(out)]) == 0
    ours = json.loads(out.read_text())
    real = json.loads((FIXTURES / "upload_valid_petclinic.json").read_text())
    assert set(ours) == set(real)
    assert set(ours["data"][0]) == set(real["data"][0])
    assert set(ours["data"][0]["spans"][0]) == set(real["data"][0]["spans"][0])
    proc = next(iter(real["data"][0]["processes"].values()))
    assert all(set(p) == set(proc) for tr in ours["data"] for p in tr["processes"].values())
    types = {t["type"] for tr in ours["data"] for sp in tr["spans"] for t in sp["tags"]}
    assert types <= {"string", "bool", "int64", "float64"}
    assert np.all([read_jaeger_json(out).spans == 11])
