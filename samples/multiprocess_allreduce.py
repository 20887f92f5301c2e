"""Four worker processes as ranks doing a real ring all-reduce, traced as one trace.

Each rank is a separate OS process holding a NumPy gradient; neighbours exchange chunks
over multiprocessing pipes (reduce-scatter, then all-gather), exactly the ring algorithm
NCCL uses. Every step is a span tagged with the rank's chip (gpu:<rank>) or the link it
sends over; `chiptrace.in_context` carries the trace context and trace dir into each
process, so the four processes' parts form one trace.

    python samples/multiprocess_allreduce.py [DIR]
    chiptrace query DIR "SELECT pid, count(*) FROM spans GROUP BY 1"
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading

import numpy as np

import chiptrace

RANKS = 4
ELEMENTS = 1 << 20  # 4 MiB of float32 per rank


def exchange(phase: str, link: str, step: int, chunk: np.ndarray, send, recv) -> np.ndarray:
    """Send to the right neighbour while receiving from the left one, as NCCL does: a
    blocking send first would deadlock the ring once a chunk outgrows the pipe buffer."""
    with chiptrace.span(f"{phase}.send", link=link) as s:
        s.set_attributes({"op.bytes": chunk.nbytes, "step": step})
        sender = threading.Thread(target=send.send_bytes, args=(chunk.tobytes(),))
        sender.start()
        data = recv.recv_bytes()
        sender.join()
    return np.frombuffer(data, dtype=np.float32)


def rank_main(rank: int, send: mp.connection.Connection, recv: mp.connection.Connection) -> float:
    right = (rank + 1) % RANKS
    link = f"ethernet:gpu:{rank}-gpu:{right}"
    with chiptrace.span(f"rank {rank}", chip=f"gpu:{rank}"):
        with chiptrace.span("backward", chip=f"gpu:{rank}", op="compute"):
            grad = np.full(ELEMENTS, rank + 1, dtype=np.float32)
        chunks = np.array_split(grad, RANKS)
        for step in range(RANKS - 1):  # reduce-scatter
            out_i, in_i = (rank - step) % RANKS, (rank - step - 1) % RANKS
            incoming = exchange("reduce_scatter", link, step, chunks[out_i], send, recv)
            with chiptrace.span("reduce_scatter.add", chip=f"gpu:{rank}", op="compute"):
                chunks[in_i] += incoming
        for step in range(RANKS - 1):  # all-gather
            out_i, in_i = (rank + 1 - step) % RANKS, (rank - step) % RANKS
            incoming = exchange("all_gather", link, step, chunks[out_i], send, recv)
            with chiptrace.span("all_gather.copy", chip=f"gpu:{rank}", op="memcpy"):
                chunks[in_i] = incoming.copy()
        total = float(np.concatenate(chunks)[0])
    assert total == sum(range(1, RANKS + 1)), total  # every rank holds the full sum
    return total


def main(out: str) -> None:
    chiptrace.init(out, service="ring-allreduce")
    pipes = [mp.Pipe(duplex=False) for _ in range(RANKS)]  # pipes[r]: into rank r
    with chiptrace.span("allreduce job", chip="cpu:0"):
        procs = [
            mp.Process(
                target=chiptrace.in_context(rank_main),
                args=(r, pipes[(r + 1) % RANKS][1], pipes[r][0]),
            )
            for r in range(RANKS)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    chiptrace.shutdown()
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        sys.exit(f"ranks failed with exit codes {failed}")
    con = chiptrace.connect(out)
    print(
        con.sql(
            "SELECT pid, count(*) AS spans, count(DISTINCT trace_id) AS traces FROM spans GROUP BY 1 ORDER BY 1"
        )
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "chiptrace-traces/ring-allreduce")
