"""What a Trace Event importer hands the tree builder: one `Block` per decoded block.

A block is split in two: the columns that are final once the block is read (name, chip,
link, op, attributes) go to the staging file; the few numbers the cross-event work needs
(times, thread, role, correlation, step) stay in memory, about 37 bytes a span, until every
file is read and parents, trace ids, clock offsets and launch links can be decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from chiptrace.schema import TAG_COLUMNS

# What a span is to the tree builder.
ROLE_CPU = 0  # host work: nests per thread, takes the step its start falls in
ROLE_DEVICE = 1  # device work: nests per stream, takes the step of the call that launched it
ROLE_STEP = 2  # a profiler step: always a root, its own trace
ROLE_LAUNCH = 3  # a runtime call with a correlation id: the launch a device span links to
ROLE_FREE = 4  # on no chip (the profiler's window, device-side annotations): nests, no link

# The span columns final once a block is read (the rest come in the second pass).
STATIC_COLUMNS = (
    "name",
    *TAG_COLUMNS,
    "op_bytes",
    "op_flops",
    "attributes",
    "pid",
    "service",
    "host",  # set per span where a file names each process's (chiptrace's Chrome export)
    "resource",
    "links",  # given links (a chiptrace Chrome export's); launch links are found later
    "kind",
    "status_code",
    "status_message",
    "events",
)


@dataclass
class Block:
    """One block's spans: static columns (staged on disk) and the numbers kept in memory."""

    static: pa.RecordBatch | None  # None once staged in `spill`
    start: np.ndarray  # int64 ns, on the file's own clock (offset added at the end)
    end: np.ndarray
    thread: np.ndarray  # int32: the (pid, tid) nesting domain
    role: np.ndarray  # int8 ROLE_*
    corr: np.ndarray  # int64 correlation id, -1 for none
    step: np.ndarray  # int64 profiler step number, -1 for none
    # Set when the file carries its own ids (chiptrace's Chrome export): hex text columns.
    ids: dict[str, Any] | None = None
    spill: str | None = None  # the staging file holding `static`


@dataclass
class FileFacts:
    """Per-file facts the tree builder and the summary need."""

    path: str
    format: str
    rank: int | None = None
    world_size: int | None = None
    base_ns: int = 0
    resource: dict[str, Any] = field(default_factory=dict)
    service: str = "trace"
    host: str | None = None
    # File-clock end of each NCCL kernel (int64 ns).
    nccl_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    categories: dict[str, int] = field(default_factory=dict)
    tally: dict[str, Any] = field(default_factory=dict)
    spans: int = 0
    events: int = 0
    warnings: list[str] = field(default_factory=list)  # loaded in part (a file cut short)


def concat(blocks: list[Block], name: str) -> np.ndarray:
    arrays = [getattr(b, name) for b in blocks]
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
