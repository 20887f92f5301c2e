"""The emulated rack: a discrete-event model of six chip types and their links.

    from chiptrace.emulator import emulate
    result = emulate(topology="rack6", workload="train", steps=20, seed=1, out="traces/run1")

See docs/emulator.md for the topology format, the workloads' knobs, faults and the manifest.
"""

from __future__ import annotations

from chiptrace.emulator.errors import EmulatorError, FaultError, TopologyError, WorkloadError
from chiptrace.emulator.faults import Fault, parse_fault
from chiptrace.emulator.run import EmulationResult, emulate, make_config
from chiptrace.emulator.scenarios import SCENARIOS
from chiptrace.emulator.topology_files import PRESETS, Topology, build_topology, load_topology

__all__ = [
    "PRESETS",
    "SCENARIOS",
    "EmulationResult",
    "EmulatorError",
    "Fault",
    "FaultError",
    "Topology",
    "TopologyError",
    "WorkloadError",
    "build_topology",
    "emulate",
    "load_topology",
    "make_config",
    "parse_fault",
]
