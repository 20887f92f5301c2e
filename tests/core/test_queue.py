"""The bounded, drop-counting queue behind the viewer's feed and the live OTLP sink."""

from __future__ import annotations

import threading

from chiptrace._queue import BoundedQueue


def test_put_drops_and_counts_past_capacity() -> None:
    q: BoundedQueue[list[int]] = BoundedQueue(5)
    assert q.put([1, 2, 3]) and not q.put([4, 5, 6]) and q.put([7, 8])
    assert (q.accepted, q.dropped, q.pending) == (5, 3, 5)
    assert q.drain() == [[1, 2, 3], [7, 8]]
    assert q.pending == 0 and q.put([9] * 5)  # room again once drained


def test_get_task_done_and_join() -> None:
    q: BoundedQueue[list[int]] = BoundedQueue(10)
    q.put([1, 2])
    batch = q.get()
    assert batch == [1, 2] and q.pending == 2  # taken but not done: still counts
    assert not q.join(timeout_s=0.01)
    q.task_done(batch)
    assert q.join(timeout_s=0.01) and q.get(timeout_s=0.01) is None


def test_consumer_thread_handles_everything_then_stops_on_close() -> None:
    q: BoundedQueue[list[int]] = BoundedQueue(1000)
    seen: list[int] = []

    def consume() -> None:
        while (b := q.get()) is not None:
            seen.extend(b)
            q.task_done(b)

    t = threading.Thread(target=consume)
    t.start()
    for i in range(100):
        q.put([i])
    assert q.join(timeout_s=30)
    q.close()
    t.join(timeout=30)
    assert not t.is_alive() and seen == list(range(100))
    assert not q.put([1]) and q.dropped == 1  # closed: refused and counted


def test_close_can_drop_what_is_pending() -> None:
    q: BoundedQueue[list[int]] = BoundedQueue(10)
    q.put([1, 2, 3])
    q.close(drop_pending=True)
    assert (q.dropped, q.pending, q.drain()) == (3, 0, [])
