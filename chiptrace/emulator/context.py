"""What every workload of a run shares: the faulted rack, its network, the span table."""

from __future__ import annotations

from dataclasses import dataclass

from chiptrace.emulator.network import Network
from chiptrace.emulator.spans import SpanTable
from chiptrace.emulator.topology_files import Topology


@dataclass
class Context:
    """One run's state: topology after faults, network, spans, and the run's choices."""

    topology: Topology
    network: Network
    table: SpanTable
    precision: str
    schedule: str
    slow: dict[str, float]
    delay: dict[str, float]

    def chip(self, chip_id: str) -> int:
        """The span table's index of a chip."""
        return self.table.chip_index[chip_id]
