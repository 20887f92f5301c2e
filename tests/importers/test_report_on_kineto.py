"""The report on real PyTorch profiler traces: each rule's figures checked against values
computed here from the raw JSON (kineto_raw.py), not from chiptrace's tables."""

from __future__ import annotations

import functools
import gzip
import json
import statistics
from collections import defaultdict

import pytest

from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.errors import StepError
from chiptrace.cli import main
from tests.importers import kineto_raw as raw
from tests.importers.conftest import KINETO, KINETO_FILES

TWO_RANKS = ["2rank_sampled_rank-0.json.gz", "2rank_sampled_rank-1.json.gz"]
# Every fixture once: the two ranks of one job as one store.
SETS = [n for n in KINETO_FILES if n not in TWO_RANKS] + ["2rank"]
GPU_STEPPED = [
    "nccl_data.json.gz",
    "amd_mi250_minitoy_train.json.gz",
    "cuda_event_sync.json.gz",
    "compare_base.json.gz",
    "compare_test.json.gz",
]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from chiptrace import import_trace

    out = tmp_path_factory.mktemp("2rank")
    import_trace([KINETO / n for n in TWO_RANKS], out)
    return out


def _store(name, imported, two_ranks):
    return two_ranks if name == "2rank" else imported(name)[0]


@functools.cache
def _docs(name):
    return [raw.load(KINETO / n) for n in (TWO_RANKS if name == "2rank" else [name])]


@pytest.fixture(scope="module")
def analysed(imported, two_ranks):
    """name -> (TraceAnalysis, report dict), each computed once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            ta = TraceAnalysis(_store(name, imported, two_ranks))
            cache[name] = (ta, ta.report().to_dict())
        return cache[name]

    return get


def _finding(report: dict, rule: str) -> dict | None:
    found = [f for f in report["findings"] if f["rule"] == rule]
    return found[0] if found else None


# ------------------------------------------------------------------------ steps


@pytest.mark.parametrize("name", SETS)
def test_the_guess_and_the_glob_find_the_profiler_steps(name, imported, two_ranks):
    out = _store(name, imported, two_ranks)
    want = sum(len(raw.steps(d)) for d in _docs(name))
    ta = TraceAnalysis(out)  # the guess, on its own
    first = ta.tables.workloads[0] if ta.tables.workloads else None
    if not want:
        assert first is None or "ProfilerStep" not in first.name
        with pytest.raises(StepError, match="matches no span"):
            _ = TraceAnalysis(out, step_name="ProfilerStep#*").tables
        return
    assert first.name.startswith("ProfilerStep#") and first.steps.num_rows == want
    assert "PyTorch profiler" in first.choice.reason
    glob = TraceAnalysis(out, step_name="ProfilerStep#*").tables.workloads[0]
    assert glob.steps.num_rows == want


# ----------------------------------------------------------- raw per-step figures


def _per_step_chip(name):
    """{(file index, step, device): [Device...]} for the work each step launched (or that
    started in it)."""
    out = defaultdict(list)
    for i, doc in enumerate(_docs(name)):
        for d in raw.devices(doc):
            if d.step is not None:
                out[(i, d.step, d.device)].append(d)
    return out


def _window(name, i, step, ops):
    s = next(x for x in raw.steps(_docs(name)[i]) if x.name == step)
    launched = [o.end for o in ops if o.launch_start is not None]
    return s.start, max([s.end, *launched])


def _raw_exposure(name):
    """Per (file, device): [(comm, exposed, compute free of comm, step window)] per step."""
    rows = defaultdict(list)
    for (i, step, dev), ops in _per_step_chip(name).items():
        t0, t1 = _window(name, i, step, ops)
        comm = raw.union([(max(o.start, t0), o.end) for o in ops if o.kind == "comm"])
        comp = raw.union([(max(o.start, t0), o.end) for o in ops if o.kind == "compute"])
        rows[(i, dev)].append(
            (
                raw.length(comm),
                raw.length(raw.minus(comm, comp)),
                raw.length(raw.minus(comp, comm)),
                t1 - t0,
            )
        )
    return {k: v for k, v in rows.items() if any(r[0] for r in v)}


@pytest.mark.parametrize("name", ["nccl_data.json.gz", "2rank"])
def test_exposed_comm_is_comm_with_no_compute_on_its_gpu(name, analysed):
    rep = analysed(name)[1]
    rows = _raw_exposure(name)
    assert rows, "these traces have NCCL kernels"
    exposed = [statistics.fmean(r[1] for r in v) for v in rows.values()]
    comm = [statistics.fmean(r[0] for r in v) for v in rows.values()]
    hide = [statistics.fmean(min(r[1], r[2]) for r in v) for v in rows.values()]
    f = _finding(rep, "exposed-comm")
    assert f is not None and f["culprit"].startswith("ncclKernel_")
    ev = f["evidence"]
    assert ev["steps_sampled"] == rep["workloads"][0]["steps"]
    assert ev["exposed_ms_per_step"] == pytest.approx(statistics.fmean(exposed) / 1e6, abs=1e-4)
    assert ev["comm_ms_per_step"] == pytest.approx(statistics.fmean(comm) / 1e6, abs=1e-4)
    assert f["saving_ms"] == pytest.approx(statistics.median(hide) / 1e6, abs=1e-4)
    assert ev["overlap_pct"] == pytest.approx(100 * (1 - sum(exposed) / sum(comm)), abs=0.01)
    # The same exposure HTA's overlap describes (hta-marked tests compare it with HTA).
    assert 0 < ev["overlap_pct"] < 50


def _raw_host_wait(name):
    """Per (file, device): [(idle, host wait, step window)] per step: gaps between the
    merged work, and before the first (from the step's start, or the end of earlier work
    still running then); host wait from a gap's start until the work ending it was
    launched."""
    rows = defaultdict(list)
    for (i, step, dev), ops in _per_step_chip(name).items():
        if not any(o.launch_start is not None for o in ops):
            continue
        t0, t1 = _window(name, i, step, ops)
        busy = raw.union([(max(o.start, t0), o.end) for o in ops])
        earlier = [
            d.end
            for d in raw.devices(_docs(name)[i])
            if d.device == dev and d.start < t0 < d.end and d.start >= t0 - 60 * 10**9
        ]
        lead = max([t0, *earlier])
        busy = [(lead, lead), *busy] if busy and busy[0][0] > lead else busy
        idle = wait = 0
        for (_, b), (c, _) in zip(busy, busy[1:], strict=False):
            idle += c - b
            launches = [o.launch_start for o in ops if o.start == c and o.launch_start is not None]
            if launches and min(launches) > b:
                wait += min(min(launches), c) - b  # until the host launched it
        rows[(i, dev)].append((idle, wait, t1 - t0))
    return rows


@pytest.mark.parametrize("name", [*GPU_STEPPED, "2rank"])
def test_a_gpu_waiting_on_its_host_is_launch_or_host_bound(name, analysed):
    """HTA's host wait: launch-bound where the host spends the GPU's idle time in launch
    calls, host-bound (or data-loading) where it runs the step's own work meanwhile."""
    rep = analysed(name)[1]
    rows = _raw_host_wait(name)
    wait = statistics.median(statistics.fmean(r[1] for r in v) for v in rows.values())
    idle = statistics.median(statistics.fmean(r[0] for r in v) for v in rows.values())
    step = statistics.median(r[2] for v in rows.values() for r in v)
    found = [_finding(rep, r) for r in ("launch-bound", "host-bound", "data-loading")]
    found = [f for f in found if f is not None]
    if wait < 0.05 * step:
        assert found == []
        return
    (f,) = found
    assert f["evidence"]["host_wait_ms_per_step"] == pytest.approx(wait / 1e6, abs=1e-4)
    assert f["evidence"]["gpu_idle_ms_per_step"] == pytest.approx(idle / 1e6, abs=1e-4)
    launch = f["evidence"]["launch_calls_share_of_idle"]
    assert (f["rule"] == "launch-bound") == (launch >= 0.5)
    if f["rule"] == "launch-bound":
        assert f["saving_ms"] == pytest.approx(wait / 1e6, abs=1e-4)
    else:  # overlapping host work with the GPU saves at most the GPU's own work
        assert f["saving_ms"] <= wait / 1e6 + 1e-4
    # the starvation rule would say the same of the same idle time: it gives way
    assert _finding(rep, "starvation") is None


def test_nccl_data_waits_on_host_work_and_exposes_its_all_reduce(analysed):
    """The A100 job HTA says waits on its host (99% of idle is host wait): the host runs
    the DDP forward and backward then, and its launch calls cover a few % of the idle."""
    rep = analysed("nccl_data.json.gz")[1]
    rules = [f["rule"] for f in rep["findings"]]
    assert rules[:2] == ["host-bound", "exposed-comm"]
    hb = _finding(rep, "host-bound")
    assert hb["severity"] == "high" and hb["evidence"]["launch_calls_share_of_idle"] < 0.1
    assert hb["culprit"] == "## forward ##"
    assert _finding(rep, "exposed-comm")["culprit"].startswith("ncclKernel_AllReduce")


# --------------------------------------------------------------- rank stragglers


def _late_copy(doc: dict, delay_us: int) -> dict:
    """Rank 1 of the same job, arriving `delay_us` late at every collective long enough to
    absorb it: its NCCL kernels start later and end when rank 0's do."""
    out = json.loads(json.dumps(doc))
    out["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": 1, "world_size": 2}
    for e in raw.events(out):
        if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
            dur = float(e["dur"])
            if dur > delay_us + 100:
                e["ts"] = float(e["ts"]) + delay_us
                e["dur"] = dur - delay_us
    return out


def test_rank_straggler_names_the_rank_the_others_wait_for(tmp_path):
    from chiptrace import import_trace

    with gzip.open(KINETO / "nccl_data.json.gz", "rb") as fh:
        plain = json.load(fh)  # floats, to write back
    delay = 1000
    (tmp_path / "r0.json").write_text(json.dumps(plain))
    (tmp_path / "r1.json").write_text(json.dumps(_late_copy(plain, delay)))
    doc = raw.load(KINETO / "nccl_data.json.gz")
    out = tmp_path / "store"
    import_trace([tmp_path / "r0.json", tmp_path / "r1.json"], out)
    rep = TraceAnalysis(out).report().to_dict()
    f = _finding(rep, "rank-straggler")
    assert f is not None and f["culprit"] == "rank1/gpu:0"
    # raw: the collectives each step launched that were long enough to be delayed
    per_step = defaultdict(int)
    for d in raw.devices(doc):
        if d.kind == "comm" and d.step and (d.end - d.start) / 1000 > delay + 100:
            per_step[d.step] += 1
    want_ms = delay / 1000 * sum(per_step.values()) / len(per_step)
    assert f["evidence"]["others_waited_ms_per_step"] == pytest.approx(want_ms, abs=1e-3)
    assert f["saving_ms"] == pytest.approx(want_ms, abs=1e-3)
    assert f["evidence"]["others_wait_ms_per_step"]["rank0/gpu:0"] >= want_ms - 1e-3


def test_no_rank_straggler_on_one_rank(analysed):
    rep = analysed("nccl_data.json.gz")[1]
    assert _finding(rep, "rank-straggler") is None


# ------------------------------------------------------------- kernel breakdown


@pytest.mark.parametrize("name", [*GPU_STEPPED, "simple_add.json.gz", "2rank"])
def test_kernel_breakdown_sums_the_device_events(name, analysed):
    rep = analysed(name)[1]
    k = rep["kernels"]
    kinds = defaultdict(lambda: [0, 0])
    names = defaultdict(int)
    for doc in _docs(name):
        for d in raw.devices(doc):
            kinds[d.kind][0] += 1
            kinds[d.kind][1] += d.end - d.start
            names[(d.name, d.kind)] += d.end - d.start
    ours = {r["kind"]: r for r in k["by_kind"] if r["kind"] != "sync"}
    assert set(ours) == set(kinds)
    for kind, (n, t) in kinds.items():
        assert ours[kind]["kernels"] == n
        assert ours[kind]["time_ms"] == pytest.approx(t / 1e6, abs=1e-4)
    top = max(names, key=lambda x: names[x])
    assert (k["top"][0]["name"], k["top"][0]["kind"]) == top
    assert k["top"][0]["time_ms"] == pytest.approx(names[top] / 1e6, abs=1e-4)


# ---------------------------------------------------------------- critical path


@pytest.mark.parametrize("name", SETS)
def test_critical_path_shares_stay_within_the_step(name, analysed):
    ta = analysed(name)[0]
    for x in ta.inputs:
        for p in x.paths:
            assert sum(s.on_path_ns for s in p.segments) == p.duration_ns
            assert all(s.on_path_ns >= 0 for s in p.segments)
            for by in ("chip_type", "op_kind", "name"):
                shares = p.share(by)
                assert all(0 <= v <= 1 + 1e-9 for v in shares.values())
                assert sum(shares.values()) == pytest.approx(1.0)


def test_a_step_lasts_until_the_device_work_it_launched_ends(analysed):
    """compare_base: the GPU runs ~57 ms behind its host; each step's path runs to the end
    of the last kernel the step launched."""
    ta, rep = analysed("compare_base.json.gz")
    doc = raw.load(KINETO / "compare_base.json.gz")
    ends = defaultdict(int)
    for d in raw.devices(doc):
        if d.launch_start is not None and d.step:
            ends[d.step] = max(ends[d.step], d.end)
    for p in ta.critical_paths:
        step = next(s for s in raw.steps(doc) if s.name == p.root)
        assert p.duration_ns == max(step.end, ends[p.root]) - step.start
        assert p.root_end_ns - p.start_ns == step.end - step.start
    cp = rep["critical_path"]
    assert cp["duration_ms"] > cp["root_ms"]


def _kineto(path, events, steps=((0, 1000),)):
    """A minimal PyTorch profiler trace: ProfilerStep#N annotations plus `events`."""
    evs = [
        _event("user_annotation", f"ProfilerStep#{i + 1}", 1, s, e - s, {})
        for i, (s, e) in enumerate(steps)
    ]
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": evs + events}
    path.write_text(json.dumps(doc))
    return path


def _event(cat, name, pid, ts, dur, args, tid=1):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _launch(corr, ts, dur=5, name="cudaLaunchKernel"):
    return _event("cuda_runtime", name, 1, ts, dur, {"correlation": corr})


def _kernel(corr, ts, dur, name="gemm"):
    return _event("kernel", name, 0, ts, dur, {"correlation": corr, "device": 0, "stream": 7}, 7)


def test_critical_path_follows_the_gpu_through_a_sync(tmp_path):
    """The host queues five 150 us kernels in 50 us and waits in cudaDeviceSynchronize: the
    step's time is the GPU's, not the waiting CPU call's."""
    from chiptrace import import_trace

    evs = []
    for i in range(5):
        evs += [_launch(i + 1, 10 + 10 * i), _kernel(i + 1, 60 + 150 * i, 150)]
    evs.append(_launch(99, 60, 755, "cudaDeviceSynchronize"))
    import_trace(_kineto(tmp_path / "t.json", evs, steps=((0, 820), (820, 830))), tmp_path / "s")
    p = TraceAnalysis(tmp_path / "s", step_name="ProfilerStep#1").critical_path()
    share = p.share("chip_type")
    assert share["gpu"] == pytest.approx(750 / 820)
    # how the walk (backwards) reached each: the sync's wait to the last kernel, kernels
    # back to back on the GPU, the first kernel to the call that launched it
    vias = [(s.name, s.via) for s in p.segments if s.via != "gap"]
    assert vias[-2:] == [("gemm", "sync"), ("cudaDeviceSynchronize", "end")]
    assert vias[:5] == [("cudaLaunchKernel", "link"), *[("gemm", "resource")] * 4]


def test_device_work_long_after_its_step_counts_once(tmp_path):
    """A kernel launched in a 100 us step runs 5 ms later (a hand-converted trace once
    printed "gap 5616%"): the step's path runs to that kernel's end, shares add to 100%."""
    from chiptrace import import_trace

    evs = [_launch(1, 10), _kernel(1, 5000, 100)]
    import_trace(_kineto(tmp_path / "t.json", evs, steps=((0, 100), (100, 150))), tmp_path / "s")
    rep = TraceAnalysis(tmp_path / "s").report().to_dict()
    cp = rep["critical_path"]
    assert cp["duration_ms"] == pytest.approx(5.1) and cp["root_ms"] == pytest.approx(0.1)
    assert cp["by_chip_type"]["gpu"] == pytest.approx(0.1 / 5.1, abs=1e-4)
    assert sum(cp["by_chip_type"].values()) == pytest.approx(1.0, abs=1e-3)
    assert all(v <= 1 for v in cp["by_op_kind"].values())


# ----------------------------------------------------------------------- output


@pytest.mark.parametrize("name", SETS)
def test_a_training_trace_has_no_endpoints(name, analysed):
    rep = analysed(name)[1]
    assert rep["endpoints"] == []
    assert not {"error-rate", "tail-latency"} & {f["rule"] for f in rep["findings"]}


def test_text_shortens_kernel_names_json_keeps_them(two_ranks, capsys):
    assert main(["report", str(two_ranks), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    longest = max((r["name"] for r in rep["kernels"]["top"]), key=len)
    assert len(longest) > 500
    assert main(["report", str(two_ranks)]) == 0
    text = capsys.readouterr().out
    assert longest not in text and "GenericPackedTensorAccessor" not in text
    assert "split_embedding_backwar" in text and "Endpoints" not in text
    for section in ("Device work", "by kind", "Ranks (HTA", "queue 2", "Critical path"):
        assert section in text
    assert max(len(line) for line in text.splitlines()) < 700
    assert main(["report", str(two_ranks), "--html", str(two_ranks / "r.html")]) == 0
    page = (two_ranks / "r.html").read_text()
    assert "Top kernels" in page and "Launch queue" in page and 'title="void split_' in page
