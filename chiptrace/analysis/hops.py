"""The link hops of a step's transfers, as arrays: one graph node per transfer, not per hop.

A transfer crosses its route hop by hop, and a trace records one span per hop (and, for a
collective, per flow: an nvl72 ring round is 1,296 flows of 2 hops each). The hops of one
transfer share their parent, name, bytes and times, so the step graph (stepgraph.py) makes
them one node that occupies every link direction on its path; this module keeps what the
replay needs of the hops (which direction, how many, how crowded) as NumPy arrays:
~1.8M hops of an nvl72 step are a few arrays, not 1.8M Python objects.

Hops come from Python rows (`from_rows`: a step already in memory) or straight from DuckDB
(`load`: aggregated there, fetched as Arrow), the same table either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chiptrace.analysis.workloads import arrow

Dir = tuple[str, str, str]  # (link id, source, destination): one direction of a link


@dataclass
class Hops:
    """Hop rows of a step's transfers, sorted by their node.

    Attributes:
        owner: per hop row, the representative span id of its transfer's group (`reps`
            index) until the graph is built, then the node index.
        dir: per hop row, its direction (`dirs` index).
        count: hops of the transfer on that direction (flows of one collective alike).
        dirs: (link id, source, destination) of each direction; `types` their link type.
        reps: the representative span id of each transfer.
        conc: per hop row, transfers sharing its direction at its midpoint (set by
            `crowding` once the nodes' times are known).
    """

    owner: np.ndarray
    dir: np.ndarray
    count: np.ndarray
    dirs: list[Dir]
    types: list[str | None]
    reps: list[str]
    conc: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @staticmethod
    def empty() -> Hops:
        z = np.zeros(0, np.int64)
        return Hops(z, z.copy(), z.copy(), [], [], [])

    def __len__(self) -> int:
        return len(self.owner)

    def renumber(self, node_of: Sequence[int]) -> None:
        """Point `owner` at node indices (`node_of[group]`) and sort the rows by node."""
        idx = np.asarray(node_of, dtype=np.int64)
        owner = idx[self.owner] if len(self.owner) else self.owner
        keep = owner >= 0  # a transfer that is no node (a link span with children)
        owner, d, c = owner[keep], self.dir[keep], self.count[keep]
        conc = self.conc[keep] if len(self.conc) == len(keep) else self.conc
        if len(owner) > 1 and (np.diff(owner) < 0).any():
            order = np.argsort(owner, kind="stable")
            owner, d, c = owner[order], d[order], c[order]
            conc = conc[order] if len(conc) == len(order) else conc
        self.owner, self.dir, self.count, self.conc = owner, d, c, conc

    def bounds(self, n_nodes: int) -> np.ndarray:
        """Start of each node's hop rows (length n_nodes + 1; empty ranges for non-transfers)."""
        return np.searchsorted(self.owner, np.arange(n_nodes + 1), side="left")


def hop_key(parent: Any, r: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the hops of one transfer share: parent, name, bytes and times."""
    return (parent, r.get("name"), float(r.get("op_bytes") or 0.0), r["start_ns"], r["end_ns"])


def from_rows(
    rows: Sequence[Mapping[str, Any]], parent: Mapping[str, str | None], leaves: set[str]
) -> tuple[list[str], Hops, dict[str, str]]:
    """Group the leaf link spans among `rows` into transfers: (the span ids to drop, the
    hops, member span id -> its transfer's representative)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("link_id") and r["span_id"] in leaves:
            groups.setdefault(hop_key(parent.get(r["span_id"]), r), []).append(r)
    dir_ix: dict[Dir, int] = {}
    types: list[str | None] = []
    owner: list[int] = []
    dirs: list[int] = []
    reps: list[str] = []
    drop: list[str] = []
    alias: dict[str, str] = {}
    for members in groups.values():
        rep = min(m["span_id"] for m in members)
        g = len(reps)
        reps.append(rep)
        for m in members:
            d = (str(m["link_id"]), str(m.get("link_src") or ""), str(m.get("link_dst") or ""))
            if d not in dir_ix:
                dir_ix[d] = len(dir_ix)
                types.append(m.get("link_type"))
            owner.append(g)
            dirs.append(dir_ix[d])
            if m["span_id"] != rep:
                drop.append(m["span_id"])
                alias[m["span_id"]] = rep
    hops = Hops(
        np.asarray(owner, np.int64),
        np.asarray(dirs, np.int64),
        np.ones(len(owner), np.int64),
        list(dir_ix),
        types,
        reps,
    )
    return drop, hops, alias


# A step's hops, grouped by DuckDB into transfers (`gk`: one transfer's parent, name,
# bytes and times hashed) and directions (`dk`: link, source, destination hashed); the hop
# rows themselves come back as those two int64 keys only.
_HOPS = """
SELECT hash(pk, name, bk, start_ns, end_ns) AS gk, hash(link_id, link_src, link_dst) AS dk,
       span_id, pk, name, bk, start_ns, end_ns, links, link_id, link_type, link_src,
       link_dst, op_kind
FROM (SELECT coalesce(parent_span_id, ''::BLOB) AS pk, name, coalesce(op_bytes, -1) AS bk,
             start_ns, greatest(end_ns, start_ns) AS end_ns, span_id, links, link_id,
             link_type, link_src, link_dst, op_kind
      FROM spans_raw
      WHERE link_id IS NOT NULL AND start_ns >= {lo} AND start_ns <= {hi}
        AND trace_id = unhex('{trace}'))
"""
_GROUPS = """
SELECT gk, lower(hex(min(span_id))) AS span_id,
       nullif(lower(hex(any_value(pk))), '') AS parent_span_id, any_value(name) AS name,
       any_value(start_ns) AS start_ns, any_value(end_ns) AS end_ns,
       any_value(link_id) AS link_id, any_value(link_type) AS link_type,
       any_value(link_src) AS link_src, any_value(link_dst) AS link_dst,
       any_value(op_kind) AS op_kind, nullif(any_value(bk), -1) AS op_bytes,
       string_agg(links, chr(31)) AS links,
       CASE WHEN count(*) <= {few} THEN list(lower(hex(span_id))) END AS members
FROM h GROUP BY gk ORDER BY start_ns, span_id
"""
_DIRS = """
SELECT dk, any_value(link_id) AS l, any_value(link_src) AS s, any_value(link_dst) AS d,
       any_value(link_type) AS t
FROM h GROUP BY dk ORDER BY dk
"""
FEW = 16  # transfers of up to this many hops keep their hops' ids (links may name them)


def load(
    con: Any, trace_id: str, lo: int, hi: int
) -> tuple[list[dict[str, Any]], Hops, dict[str, str]]:
    """The transfers of trace `trace_id` that start in [lo, hi], grouped in DuckDB: one row
    per transfer (its representative span, its hops' links merged), its hops, and the
    other hops' span ids -> the representative (for transfers of up to FEW hops)."""
    h = f"WITH h AS ({_HOPS.format(lo=int(lo), hi=int(hi), trace=trace_id)}) "
    cur = con.execute(h + _GROUPS.format(few=FEW))
    names = [d[0] for d in cur.description]
    groups = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    if not groups:
        return [], Hops.empty(), {}
    alias: dict[str, str] = {}
    for g in groups:
        for m in g.pop("members") or ():
            if m != g["span_id"]:
                alias[m] = g["span_id"]
        if g["links"]:
            g["links"] = _merged_links(g["links"])
        g.update(op_flops=None, chip_id=None, chip_type=None)
    dirs = con.execute(h + _DIRS).fetchall()
    keys = arrow(con, h + "SELECT gk, dk FROM h")
    gks = np.array([g.pop("gk") for g in groups], np.uint64)
    order = np.argsort(gks)
    hop_g = keys.column("gk").to_numpy(zero_copy_only=False).astype(np.uint64)
    owner = order[np.searchsorted(gks[order], hop_g)]
    dks = np.array([d[0] for d in dirs], np.uint64)  # sorted by the query
    hop_d = keys.column("dk").to_numpy(zero_copy_only=False).astype(np.uint64)
    hops = Hops(
        owner.astype(np.int64),
        np.searchsorted(dks, hop_d).astype(np.int64),
        np.ones(len(hop_g), np.int64),
        [(str(d[1]), str(d[2] or ""), str(d[3] or "")) for d in dirs],
        [d[4] for d in dirs],
        [g["span_id"] for g in groups],
    )
    return groups, hops, alias


def _merged_links(joined: str) -> list[dict[str, Any]]:
    """The span links of a transfer's hops (their JSON texts joined by \\x1f), as one list."""
    out: list[dict[str, Any]] = []
    for part in joined.split("\x1f"):
        try:
            items = json.loads(part)
        except ValueError:
            continue
        if isinstance(items, list):
            out.extend(i for i in items if isinstance(i, dict))
    return out


def _window(lo: np.ndarray, hi: np.ndarray, pad: int) -> tuple[int, int]:
    """Offset and width that key (direction, time) pairs as one sortable int64, for times
    in [lo - pad, hi + pad]."""
    if not len(lo):
        return 0, 1
    t0 = int(lo.min()) - pad
    return t0, int(hi.max()) + pad - t0 + 1


def _search(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """np.searchsorted(keys, queries, side="right") with the queries sorted first: in
    order, the lookups walk the keys once (unsorted, 1.8M of them miss the cache)."""
    order = np.argsort(queries)
    out = np.empty(len(queries), np.int64)
    out[order] = np.searchsorted(keys, queries[order], side="right")
    return out


def crowding(h: Hops, start: np.ndarray, end: np.ndarray) -> None:
    """Per hop row, the transfers (with their hop counts) on its direction at its
    midpoint: a link direction shared by k transfers gives each about 1/k of it."""
    if not len(h):
        h.conc = np.zeros(0, np.int64)
        return
    s, e = start[h.owner], end[h.owner]
    t0, w = _window(s, e, 0)
    base = h.dir * w
    ks, ke = base + (s - t0), base + (e - t0)
    os_, oe = np.argsort(ks), np.argsort(ke)
    cs = np.concatenate([[0], np.cumsum(h.count[os_])])
    ce = np.concatenate([[0], np.cumsum(h.count[oe])])
    mid = base + ((s + e) // 2 - t0)
    # both counts take in every earlier direction's rows: their difference is this one's
    started = cs[_search(ks[os_], mid)]
    ended = ce[_search(ke[oe], mid)]
    h.conc = np.maximum(started - ended, 1)


def order_edges(
    h: Hops, start: np.ndarray, end: np.ndarray, slack: np.ndarray, rounds: int = 8
) -> list[tuple[int, int, int]]:
    """(node, predecessor, gap) where the transfer that last used one of a transfer's link
    directions ended within its slack before it started: the order per direction (the
    latest to end by start + slack, among those that started before it)."""
    if not len(h):
        return []
    s, e = start[h.owner], end[h.owner]
    t0, w = _window(s, e, int(slack.max()))
    key_end = h.dir * w + (e - t0)
    order = np.argsort(key_end)
    k = _search(key_end[order], h.dir * w + (s + slack[h.owner] - t0)) - 1
    todo = np.arange(len(h))
    found = np.full(len(h), -1, np.int64)
    for _ in range(rounds):
        if not len(todo):
            break
        kk = k[todo]
        ok = kk >= 0
        cand = np.where(ok, order[np.maximum(kk, 0)], 0)
        ok &= h.dir[cand] == h.dir[todo]
        gone = ~ok  # nothing earlier on this direction
        good = ok & (h.owner[cand] != h.owner[todo]) & (s[cand] < s[todo])
        found[todo[good]] = cand[good]
        keep = ~(good | gone)
        todo = todo[keep]
        k[todo] -= 1
    hit = np.nonzero(found >= 0)[0]
    pred = found[hit]
    gap = s[hit] - e[pred]
    gate = gap <= slack[h.owner[hit]]
    out = np.stack([h.owner[hit][gate], h.owner[pred][gate], gap[gate]], axis=1)
    if not len(out):
        return []
    out = out[np.lexsort((out[:, 2], out[:, 1], out[:, 0]))]
    first = np.ones(len(out), bool)
    first[1:] = (out[1:, 0] != out[:-1, 0]) | (out[1:, 1] != out[:-1, 1])
    return [(int(a), int(b), int(c)) for a, b, c in out[first].tolist()]
