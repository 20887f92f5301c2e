"""Round trips keep what the report needs: a Chrome export carries each process's resource
(service, rank, host) in its metadata and each span's links in its args, so an import of
the file gives every span its own process's resource and the per-rank figures come back."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import chiptrace
from chiptrace.analysis.ranks import rank_breakdown
from chiptrace.cli import main

KINETO = Path(__file__).resolve().parents[1] / "fixtures" / "kineto"
RANKS = 8


def _ranks(directory: Path) -> list[dict[str, Any]]:
    """metrics.ranks of the report (HTA's per-rank GPU time breakdown)."""
    return rank_breakdown(chiptrace.connect(directory))


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-rank NCCL job: HTA's two sampled ranks, each copied as four ranks."""
    root = tmp_path_factory.mktemp("ranks")
    for rank in range(RANKS):
        doc = json.loads(gzip.open(KINETO / f"2rank_sampled_rank-{rank % 2}.json.gz").read())
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank, "world_size": RANKS}
        (root / f"rank-{rank}.json").write_text(json.dumps(doc))
    out = root / "store"
    files = sorted(str(p) for p in root.glob("rank-*.json"))
    assert main(["import", *files, "--out", str(out), "--align", "none"]) == 0
    return out


def test_chrome_round_trip_keeps_every_rank_and_resource(
    eight_ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _ranks(eight_ranks)
    assert len(before) == RANKS

    chrome = tmp_path / "c.json"
    assert main(["export", str(eight_ranks), "-f", "chrome", "-o", str(chrome)]) == 0
    doc = json.loads(chrome.read_text())
    procs = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(procs) == RANKS
    ranks = {p["args"]["resource"]["distributed.rank"] for p in procs}
    assert ranks == set(range(RANKS))
    labels = {e["args"]["labels"] for e in doc["traceEvents"] if e["name"] == "process_labels"}
    assert any("rank=7" in label for label in labels)

    back = tmp_path / "back"
    assert main(["import", str(chrome), "--out", str(back)]) == 0
    assert _ranks(back) == before

    # Each span has its own process's resource, service and host.
    sql = (
        "SELECT service, host, json_extract_string(resource, '$.\"distributed.rank\"') AS r, "
        "count(*) AS n FROM spans GROUP BY ALL ORDER BY service"
    )
    rows = [chiptrace.connect(d).sql(sql).fetchall() for d in (eight_ranks, back)]
    assert rows[0] == rows[1] and len(rows[0]) == RANKS


def test_a_copy_without_topology_says_so_instead_of_resolved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["--steps", "2", "--fault", "slow:gpu:3:4", "--no-progress"]
    assert main(["emulate", *args, "--out", str(run)]) == 0
    chrome, copy = tmp_path / "c.json", tmp_path / "copy"
    assert main(["export", str(run), "-f", "chrome", "-o", str(chrome)]) == 0
    assert main(["import", str(chrome), "--out", str(copy)]) == 0
    capsys.readouterr()

    assert main(["report", str(copy)]) == 0
    assert "no topology recorded" in capsys.readouterr().out
    assert main(["diff", str(run), str(copy), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert any("B has no topology" in n for n in d["notes"])
    compute = [f for f in d["findings"] if f["rule"] == "compute-bound"]
    assert compute and all(f["status"] == "not judged" for f in compute)
    assert not any(f["status"] == "resolved" for f in d["findings"])
    assert main(["diff", str(run), str(copy)]) == 0
    text = capsys.readouterr().out
    assert "not judged compute-bound" in text and "resolved" not in text


def test_a_chrome_file_with_several_processes_keeps_each_processes_resource(
    tmp_path: Path,
) -> None:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "Browser"}},
        {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "Renderer"}},
    ]
    for pid in (1, 2, 2):
        events.append(
            {"ph": "X", "name": f"task{pid}", "pid": pid, "tid": 7, "ts": 10, "dur": 5, "cat": "x"}
        )
    path = tmp_path / "browser.json"
    path.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "t"
    assert main(["import", str(path), "--out", str(out)]) == 0
    rows = (
        chiptrace.connect(out)
        .sql(
            "SELECT name, service, json_extract_string(resource, '$.\"service.name\"') "
            "FROM spans ORDER BY name"
        )
        .fetchall()
    )
    assert rows == [
        ("task1", "Browser", "Browser"),
        ("task2", "Renderer", "Renderer"),
        ("task2", "Renderer", "Renderer"),
    ]
