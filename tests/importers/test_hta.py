"""metrics.ranks agrees with HolisticTraceAnalysis 0.5.0 on every fixture it reads.

Needs `pip install -e '.[hta]'`; runs with `pytest -m hta` (a CI step of its own)."""

from __future__ import annotations

import math
import shutil
import warnings

import pytest

import chiptrace
from chiptrace.analysis.ranks import rank_breakdown
from tests.importers.conftest import KINETO

pytestmark = pytest.mark.hta

CASES = {
    "2rank": ["2rank_sampled_rank-0.json.gz", "2rank_sampled_rank-1.json.gz"],
    "nccl_data": ["nccl_data.json.gz"],
    "simple_add": ["simple_add.json.gz"],
    "cuda_event_sync": ["cuda_event_sync.json.gz"],
    "amd_mi250": ["amd_mi250_minitoy_train.json.gz"],
    "mtia": ["mtia_inference_rank_0.json.gz"],
    "compare_base": ["compare_base.json.gz"],
    "compare_test": ["compare_test.json.gz"],
    # The public corpus (tests/fixtures/corpus): older profiler generations among them.
    **{
        f"corpus_{name}": [f"../corpus/kineto/{name}.json.gz"]
        for name in (
            "tb_resnet50_nw0_pt18",
            "tb_resnet50_nw0_pt19",
            "tb_resnet50_nw4_pt19",
            "tb_gpu_metrics_input",
            "hta_inference_rank_1",
            "hta_gpu_user_annotation",
            "hta_ns_resolution_rank0",
            "hta_alexnet",
        )
    },
}


def _hta(folder):
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ta = trace_analysis.TraceAnalysis(trace_dir=str(folder))
        tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    return tb, ov


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_agree_with_hta(case, tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in CASES[case]:
        shutil.copy(KINETO / name, folder / name.rsplit("/", 1)[-1])
    tb, ov = _hta(folder)
    chiptrace.import_trace(folder, tmp_path / "out")
    ours = rank_breakdown(chiptrace.connect(tmp_path / "out"))
    assert [r["rank"] for r in ours] == sorted(tb.index)
    for r in ours:
        row = tb.loc[r["rank"]]
        assert abs(r["gpu_idle_pct"] - row["idle_time_pctg"]) <= 0.5
        assert abs(r["gpu_compute_pct"] - row["compute_time_pctg"]) <= 0.5
        assert abs(r["gpu_non_compute_pct"] - row["non_compute_time_pctg"]) <= 0.5
        theirs = ov.loc[r["rank"], "comp_comm_overlap_pctg"]
        if r["comm_compute_overlap_pct"] is None:
            assert math.isnan(theirs)
        else:
            assert abs(r["comm_compute_overlap_pct"] - theirs) <= 0.5
