"""Every generation of the PyTorch profiler's categories maps GPU work to GPU chips (issue 24,
item 2): the capitalised 1.8-1.9 names, today's names, and an unknown category is a counted
warning (summary, manifest, stderr), never silent host work."""

from __future__ import annotations

import json

import pytest

import chiptrace
from chiptrace.cli import main

# (kernel, copy, memset, runtime, operator, annotation, gpu annotation) per generation.
GENERATIONS = {
    "pytorch-1.8": ("Kernel", "Memcpy", "Memset", "Runtime", "Operator", "User", None),
    "pytorch-1.10": (
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cuda_runtime",
        "cpu_op",
        "user_annotation",
        "gpu_user_Annotation",
    ),
    "pytorch-2": (
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cuda_driver",
        "cpu_op",
        "user_annotation",
        "gpu_user_annotation",
    ),
}


def _trace(cats, step_cat: str) -> dict:
    kernel, copy, memset, runtime, op, _, gpu_ann = cats
    ev = [
        {"ph": "X", "cat": step_cat, "name": "ProfilerStep#3", "pid": 9, "tid": 9, "ts": 0,
         "dur": 100},
        {"ph": "X", "cat": op, "name": "aten::mm", "pid": 9, "tid": 9, "ts": 1, "dur": 20},
    ]  # fmt: skip
    for i, (cat, name) in enumerate(
        [(kernel, "gemm"), (copy, "Memcpy HtoD (Pinned -> Device)"), (memset, "Memset (Device)")]
    ):
        ts = 2 + i * 5
        ev.append(
            {"ph": "X", "cat": runtime, "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": ts,
             "dur": 2, "args": {"correlation": 10 + i}}
        )  # fmt: skip
        ev.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": "stream 7", "ts": ts + 30,
             "dur": 4, "args": {"correlation": 10 + i, "device": 0, "stream": 7,
                                "bytes": 4096}}
        )  # fmt: skip
    if gpu_ann:
        ev.append(
            {"ph": "X", "cat": gpu_ann, "name": "fwd", "pid": 0, "tid": "stream 7", "ts": 31,
             "dur": 20, "args": {"device": 0}}
        )  # fmt: skip
    return {"schemaVersion": 1, "traceEvents": ev}


@pytest.mark.parametrize("gen", sorted(GENERATIONS))
def test_every_generation_puts_device_work_on_the_gpu(tmp_path, gen):
    cats = GENERATIONS[gen]
    step_cat = cats[4] if gen == "pytorch-1.8" else cats[5]  # 1.8: the step is an Operator
    f = tmp_path / "t.json"
    f.write_text(json.dumps(_trace(cats, step_cat)))
    summary = chiptrace.import_trace(f, tmp_path / "o")
    assert summary.files[0]["format"] == "kineto"
    assert "unrecognised" not in summary.files[0]
    con = chiptrace.connect(tmp_path / "o")
    rows = con.execute(
        "SELECT name, chip_id, op_kind, link_id FROM spans ORDER BY start_ns, name"
    ).fetchall()
    got = {name: (chip, kind, link) for name, chip, kind, link in rows}
    assert got["gemm"][:2] == ("gpu:0", "compute")
    assert got["Memcpy HtoD (Pinned -> Device)"] == ("gpu:0", "memcpy", "pcie4:cpu:0-gpu:0")
    assert got["Memset (Device)"][:2] == ("gpu:0", "memset")
    assert got["cudaLaunchKernel"][:2] == ("cpu:0", "launch")
    assert got["aten::mm"][:2] == ("cpu:0", "host")
    if cats[6]:  # a device-side annotation: on no chip, never host work
        assert got["fwd"][:2] == (None, None)
    # Launches link to their kernels, and the step is a step whatever its category.
    linked = con.execute(
        "SELECT count(*) FROM spans WHERE chip_type = 'gpu' AND len(links) > 2"
    ).fetchone()[0]
    assert linked == 3
    steps = con.execute(
        "SELECT count(*) FROM spans WHERE name = 'ProfilerStep#3' AND parent_span_id IS NULL"
    ).fetchone()[0]
    assert steps == 1
    cat = con.execute(
        """SELECT json_extract_string(attributes, '$."kineto.cat"') FROM spans
           WHERE name = 'gemm'"""
    ).fetchone()[0]
    assert cat == "kernel"  # the current name, whatever the file called it


def test_an_unknown_category_is_a_counted_warning(tmp_path, capsys):
    doc = _trace(GENERATIONS["pytorch-2"], "user_annotation")
    doc["traceEvents"] += [
        {"ph": "X", "cat": "npu_magic", "name": "x", "pid": 9, "tid": 9, "ts": 5, "dur": 1}
    ] * 2
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    assert main(["import", str(f), "--out", str(tmp_path / "o"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["files"][0]["unrecognised"] == {"npu_magic": 2}
    assert "2 events of unrecognised category 'npu_magic'" in err
    manifest = json.loads(next((tmp_path / "o" / "manifest").glob("*.json")).read_text())
    assert manifest["import_summary"]["files"][0]["unrecognised"] == {"npu_magic": 2}
