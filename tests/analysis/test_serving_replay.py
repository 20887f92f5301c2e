"""A served workload's what-if runs its batcher again (chiptrace/analysis/batcher.py):
unchanged it gives back the run; a slow or straggling device is priced as the emulator
re-run without the fault measures it; `queue-overload` speaks only where requests arrive
faster than the devices can serve them (fault_cases.py's steady rates are below that)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from chiptrace.analysis import TraceAnalysis
from chiptrace.analysis.batcher import Batcher
from chiptrace.analysis.serving import back_ends, evaluate
from chiptrace.analysis.whatif import Change

pytest.importorskip("chiptrace.emulator")

OPTS = {"layers": 8, "efficiency": "ideal"}


def _emulate(out: Path, topology: str, rate: float, seed: int, **kw: object) -> TraceAnalysis:
    from chiptrace.emulator import emulate

    emulate(
        topology=topology,
        workload="infer",
        steps=kw.pop("steps", 60),  # type: ignore[arg-type]
        seed=seed,
        out=out,
        options={**OPTS, "rate": rate},
        progress=False,
        **kw,  # type: ignore[arg-type]
    )
    return TraceAnalysis(out)


def _mean_latency(ta: TraceAnalysis) -> float:
    (w,) = ta.tables.workloads
    s, e = w.steps.column("start_ns").to_pylist(), w.steps.column("end_ns").to_pylist()
    return statistics.fmean(b - a for a, b in zip(s, e, strict=True))


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_the_batcher_unchanged_gives_back_the_run(tmp_path: Path, schedule: str) -> None:
    ta = _emulate(tmp_path / schedule, "rack6", 3000, 7, schedule=schedule)
    (w,) = ta.tables.workloads
    b = Batcher.load(ta.con, w.steps, back_ends(w.steps) or {}, ta.tables.topology)
    assert b is not None and b.policy.schedule == schedule
    assert b.base == pytest.approx(_mean_latency(ta), rel=1e-3)
    assert not any(b.delay.values())  # nobody straggles
    res = evaluate(ta.con, w.steps, ta.tables.topology, {"none": Change()})
    assert res["none"]["saving_ns"] == pytest.approx(0.0, abs=1e3)


@pytest.mark.parametrize(
    ("topology", "rate", "fault", "seed"),
    [
        ("pcie8", 100, "slow:gpu:4:1.55", 5260),  # steady: missed or priced at 42% before
        ("rack6", 400, "straggler:npu:1:9.28", 6585),  # steady: not found at all before
        ("rack6", 4000, "slow:gpu:0:1.61", 470),  # overloaded: claimed 2.94 of 20.6 ms
    ],
)
def test_a_slow_or_late_device_is_priced_as_a_rerun_measures_it(
    tmp_path: Path, topology: str, rate: float, fault: str, seed: int
) -> None:
    target = ":".join(fault.split(":")[1:3])
    healthy = _mean_latency(_emulate(tmp_path / "ok", topology, rate, seed, steps=80))
    ta = _emulate(tmp_path / "bad", topology, rate, seed, steps=80, faults=[fault])
    actual = _mean_latency(ta) - healthy
    assert actual > 0.02 * healthy  # the fault matters
    found = ta.findings()
    named = [f for f in found if f.culprit == target or target in f.parts]
    assert named and named[0] is found[0], [(f.rule, f.culprit, f.saving_ns) for f in found[:3]]
    assert named[0].saving_ns == pytest.approx(actual, rel=0.1)


def test_queue_overload_only_where_arrivals_exceed_the_service_rate(tmp_path: Path) -> None:
    steady = _emulate(tmp_path / "s", "pcie8", 100, 581, steps=80)  # named gpu:6 before
    assert not [f for f in steady.findings() if f.rule == "queue-overload"]
    # Static scheduling deals uneven batches: no chip of a healthy run is a straggler.
    for seed in (402, 1192):
        found = _emulate(tmp_path / f"r{seed}", "rack6", 400, seed, steps=80).findings()
        assert not [f for f in found if f.severity != "info"], found[:2]
    over = _emulate(tmp_path / "o", "pcie8", 1500, 2757, steps=80)
    (q,) = [f for f in over.findings() if f.rule == "queue-overload"]
    ev = q.evidence
    assert ev["arrival_rate_per_s"] > ev["service_rate_per_s"] > 0
    assert ev["schedule"] == "static"
    assert sorted(q.parts) == [f"gpu:{k}" for k in range(8)]  # the whole pool
    assert q.evidence["what_if"] == "every serving device twice as fast"


def test_fault_cases_steady_rates_sit_below_what_the_devices_serve() -> None:
    import fault_cases as fc

    from chiptrace.emulator.infer import serving_capacity

    for topology, (steady, overloaded) in fc.RATES.items():
        capacity = serving_capacity(topology, OPTS)
        assert steady <= 0.6 * capacity, (topology, steady, capacity)
        assert overloaded >= 1.5 * capacity, (topology, overloaded, capacity)


def test_a_device_a_downed_link_cuts_off_is_left_out_and_found(tmp_path: Path) -> None:
    """gpu:3's only link to the CPUs is down: the pool serves without it (the run used to
    fail with "no route"), and the report names the link, priced with gpu:3 back."""
    link = "c2c:gpu:3-cpu:0"
    healthy = _mean_latency(_emulate(tmp_path / "ok", "rack6", 400, 6975, steps=80))
    ta = _emulate(tmp_path / "cut", "rack6", 400, 6975, steps=80, faults=[f"down:{link}"])
    (m,) = ta.tables.manifests
    assert m["link_state"] == [{"link": link, "state": "down", "chips_lost": ["gpu:3"]}]
    assert "gpu:3" not in m["workload"]["devices"]
    actual = _mean_latency(ta) - healthy
    top = ta.findings()[0]
    assert (top.rule, top.culprit, top.parts) == ("link-down", link, (link, "gpu:3"))
    assert top.saving_ns == pytest.approx(actual, rel=0.1)


def test_a_downed_uplink_names_the_uplink_not_the_devices_links(tmp_path: Path) -> None:
    """switch:1's uplink down cuts off every GPU behind it: one finding, the uplink, with
    the GPUs in `parts`, priced with them all back (the GPUs' own links carried nothing
    too, but only because nothing reached them)."""
    link = "pcie4:switch:1-cpu:0"
    healthy = _mean_latency(_emulate(tmp_path / "ok", "pcie8", 100, 6429, steps=80))
    ta = _emulate(tmp_path / "cut", "pcie8", 100, 6429, steps=80, faults=[f"down:{link}"])
    actual = _mean_latency(ta) - healthy
    top = ta.findings()[0]
    assert (top.rule, top.culprit) == ("link-down", link)
    assert top.parts == (link, "gpu:4", "gpu:5", "gpu:6", "gpu:7")
    assert top.saving_ns == pytest.approx(actual, rel=0.1)


def test_every_device_cut_off_is_still_an_error(tmp_path: Path) -> None:
    from chiptrace.emulator.errors import WorkloadError

    with pytest.raises(WorkloadError, match="has none; the downed links cut off gpu:0, "):
        _emulate(
            tmp_path / "x",
            "pcie8",
            100,
            1,
            steps=2,
            faults=["down:pcie4:switch:0-cpu:0", "down:pcie4:switch:1-cpu:0"],
        )
