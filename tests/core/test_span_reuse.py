"""One `span()` object entered many times: nested, from threads, from asyncio tasks. Each
entry gets its own span and context token; nothing raises into the program."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import chiptrace
from tests.conftest import spans_by_name


def test_reused_span_object_nests_and_ends_each_entry(trace_dir: Path) -> None:
    s = chiptrace.span("step")
    with s as outer:
        with s as inner:
            assert chiptrace.current_span() is inner
            assert inner.parent_id == outer.span_id
        assert chiptrace.current_span() is outer
    assert not chiptrace.current_span().get_span_context().is_valid
    with s:
        pass
    rows = spans_by_name(trace_dir)["step"]
    assert len(rows) == 3
    assert len({r["span_id"] for r in rows}) == 3


def test_shared_span_object_across_threads(trace_dir: Path) -> None:
    s = chiptrace.span("work")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(200):
                with s as mine:
                    barrier.wait(timeout=10) if _ == 0 else None
                    assert chiptrace.current_span() is mine
                assert not chiptrace.current_span().get_span_context().is_valid
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(spans_by_name(trace_dir)["work"]) == 800


def test_shared_span_object_across_asyncio_tasks(trace_dir: Path) -> None:
    s = chiptrace.span("request")

    async def handler(i: int, started: asyncio.Event, go: asyncio.Event) -> int:
        async with s as mine:
            started.set()
            await go.wait()  # both tasks are inside the same object's block now
            assert chiptrace.current_span() is mine
        assert not chiptrace.current_span().get_span_context().is_valid
        return i

    async def main() -> None:
        e1, e2, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        t1 = asyncio.create_task(handler(1, e1, go))
        t2 = asyncio.create_task(handler(2, e2, go))
        await e1.wait()
        await e2.wait()
        go.set()
        assert await asyncio.gather(t1, t2) == [1, 2]

    asyncio.run(main())
    rows = spans_by_name(trace_dir)["request"]
    assert len(rows) == 2 and all(r["parent_span_id"] is None for r in rows)


def test_exit_without_enter_and_foreign_context_do_not_raise(trace_dir: Path) -> None:
    s = chiptrace.span("odd")
    s.__exit__(None, None, None)  # never entered: nothing to end, nothing raised
    with s:
        # The block leaves another context current (a library that attached and forgot).
        from opentelemetry import context

        context.attach(context.set_value("k", 1))
    assert len(spans_by_name(trace_dir)["odd"]) == 1


def test_odd_names_and_kinds_never_raise_into_the_program(trace_dir: Path) -> None:
    with chiptrace.span(["not", "a", "name"]):  # type: ignore[arg-type]
        pass
    with chiptrace.span("renamed") as s:
        s.update_name({"a": 1})  # type: ignore[arg-type]
    with chiptrace.span("kind", kind=99):
        pass
    rec = chiptrace.get_recorder()
    chiptrace.flush()
    assert rec is not None and rec.spans_rejected == 2  # counted, dropped, never raised
