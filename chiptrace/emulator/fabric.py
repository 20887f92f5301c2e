"""Op spans for the chips that move data: switches forwarding, NICs receiving.

Link spans say what a wire carried; these say what the chip at its end did for it, so a
switch or NIC shows load like any other chip. A switch forwards every flow that crosses it:
one `forward` span (op_kind comm) per switch per collective round, lasting as long as the
slowest flow through it (the link model's time), with the bytes of all its flows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chiptrace.emulator.collectives import Round
from chiptrace.emulator.context import Context


class Fabric:
    """Which switch each link direction enters or leaves, for one run's network and table."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx  # its table is set after the workload is built: read it late
        net, topo = ctx.network, ctx.topology
        index = {c: i for i, c in enumerate(topo.chips)}  # the span table's chip order
        ndir = len(net.dir_bw)
        ends = [net.dir_endpoints(d) for d in range(ndir)]
        # The switch a direction leads into (or, for a switch's own uplink, out of): -1 for none.
        self.dir_switch = np.array(
            [
                index[b]
                if topo.chips[b].type == "switch"
                else index[a]
                if topo.chips[a].type == "switch"
                else -1
                for a, b in ends
            ],
            dtype=np.int64,
        )

    def switches_of(self, dirs: Sequence[int]) -> list[int]:
        """Span-table indices of the switches a route crosses, in order, each once."""
        out: list[int] = []
        for d in dirs:
            s = int(self.dir_switch[d])
            if s >= 0 and s not in out:
                out.append(s)
        return out

    def forward_rounds(
        self, rounds: Sequence[Round], start: float, trace: int, parent: int
    ) -> None:
        """`forward` spans on every switch for each repeat of each collective round, from
        the first flow through it to the last (the flows' own link-span times)."""
        tb, t = self.ctx.table, float(start)
        name = tb.name("forward")
        for r in rounds:
            sw = np.where(r.dirs >= 0, self.dir_switch[np.maximum(r.dirs, 0)], -1)
            for s in np.unique(sw[sw >= 0]):
                through = (sw == s).any(axis=1)  # flows that cross switch s
                starts = t + r.period * np.arange(r.repeat, dtype=np.float64)
                tb.add(
                    trace,
                    name,
                    starts + float(r.start[through].min()),
                    starts + float(r.end[through].max()),
                    parent,
                    chip=int(s),
                    op="comm",
                    nbytes=int(round(float(r.nbytes[through].sum()))),
                )
            t += r.period * r.repeat

    def forward_union(
        self,
        switch: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        nbytes: float,
        trace: int,
        parent: int,
        caused: np.ndarray,
    ) -> None:
        """`forward` spans for transfers through `switch` (span-table indices): transfers
        that overlap on one switch make one span over their union with their summed bytes,
        so a chip's op spans never overlap (the viewer sums busy time per chip). Each span
        links to the spans in `caused` (the transfers' receiving ops) it covers."""
        tb = self.ctx.table
        rows: list[tuple[int, float, float, int, list[int]]] = []
        for i in np.lexsort((starts, switch)):
            sw, a, b = int(switch[i]), float(starts[i]), float(ends[i])
            if rows and rows[-1][0] == sw and a < rows[-1][2]:
                _, a0, b0, n0, ids = rows[-1]
                rows[-1] = (sw, a0, max(b0, b), n0 + 1, [*ids, int(caused[i])])
            else:
                rows.append((sw, a, b, 1, [int(caused[i])]))
        tb.add(
            trace,
            tb.name("forward"),
            np.array([r[1] for r in rows]),
            np.array([r[2] for r in rows]),
            parent,
            chip=np.array([r[0] for r in rows]),
            op="comm",
            nbytes=np.array([round(r[3] * nbytes) for r in rows], np.int64),
            links=[[(trace, x) for x in r[4]] for r in rows],
        )
