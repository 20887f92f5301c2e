"""Max-min fair, work-conserving sharing (issue 17, item 1): progressive filling over whole
routes, per link direction, refilled at every arrival and completion."""

from __future__ import annotations

import numpy as np
import pytest

from chiptrace.emulator import build_topology
from chiptrace.emulator.network import Network
from chiptrace.emulator.sharing import fluid_ends, maxmin_rates

# Two 100 MB flows share a 32 GB/s trunk; the first is capped at 8 GB/s on its last hop.
TRUNK = {
    "name": "trunk",
    "chip_models": {"G": {"type": "gpu", "peak_tflops": {"bf16": 100}, "memory_GB": 80}},
    "chips": [{"model": "G", "count": 4}, {"type": "switch", "count": 2}],
    "links": [
        {"type": "pcie5", "a": ["gpu:0", "gpu:1"], "b": "switch:0", "bandwidth_GBps": 64},
        {"type": "pcie4", "a": "switch:0", "b": "switch:1", "bandwidth_GBps": 32},
        {"type": "pcie4", "a": "switch:1", "b": "gpu:2", "bandwidth_GBps": 8},
        {"type": "pcie5", "a": "switch:1", "b": "gpu:3", "bandwidth_GBps": 64},
    ],
}


def test_a_flow_capped_elsewhere_hands_the_trunk_back():
    net = Network(build_topology(TRUNK))
    capped, free = net.route("gpu:0", "gpu:2"), net.route("gpu:1", "gpu:3")
    assert len(capped.dirs) == len(free.dirs) == 3
    ends = net.fluid([0.0, 0.0], [capped, free], [100e6, 100e6]) / 1e3
    # max-min: 8 GB/s and the trunk's other 24 GB/s (an equal split would give 6257.5 us)
    assert ends[1] == pytest.approx(7.5 + 100e6 / 24e9 * 1e6, abs=0.05)  # 4174.2 us
    assert ends[1] == pytest.approx(4174.2, abs=0.05)
    assert ends[0] == pytest.approx(7.5 + 100e6 / 8e9 * 1e6, abs=0.05)


def test_the_freed_share_goes_to_the_others_when_a_flow_ends():
    net = Network(build_topology(TRUNK))
    short, long = net.route("gpu:0", "gpu:3"), net.route("gpu:1", "gpu:3")
    ends = net.fluid([0.0, 0.0], [short, long], [32e6, 96e6]) / 1e3
    # both at 16 GB/s until the short one is done (2 ms), then the long one alone at 32
    assert ends[0] == pytest.approx(7.5 + 2000, abs=0.01)
    assert ends[1] == pytest.approx(7.5 + 2000 + 64e6 / 32e9 * 1e6, abs=0.01)


def test_opposite_directions_do_not_share():
    net = Network(build_topology(TRUNK))
    there, back = net.route("gpu:0", "gpu:3"), net.route("gpu:3", "gpu:0")
    ends = net.fluid([0.0, 0.0], [there, back], [32e6, 32e6]) / 1e3
    assert ends == pytest.approx([7.5 + 1000, 7.5 + 1000])


def test_progressive_filling_levels_and_ceilings():
    cap = np.array([10.0, 4.0, 10.0])
    # flow 0 crosses 0 and 1, flow 1 crosses 0, flow 2 crosses 0 and 2 with a ceiling of 1
    dirs = np.array([[0, 1], [0, -1], [0, 2]])
    rates = maxmin_rates(dirs, cap, np.array([np.inf, np.inf, 1.0]))
    assert rates == pytest.approx([4.0, 5.0, 1.0])  # 4 held by dir 1, 1 by its ceiling
    assert rates.sum() == pytest.approx(10.0)  # direction 0 is full: work-conserving
    assert maxmin_rates(np.zeros((1, 0), np.int64), cap)[0] == np.inf


def test_fluid_late_arrival_and_zero_bytes():
    cap = np.array([1e9])
    ends = fluid_ends(np.array([[0], [0], [0]]), np.array([1e6, 1e6, 0.0]), [0.0, 5e5, 7.0], cap)
    # alone for 0.5 ms (half done), then both at half rate: the first ends at 1.5 ms
    assert ends == pytest.approx([1.5e6, 2e6, 7.0])
