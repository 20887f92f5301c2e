"""The C @trace wrapper (chiptrace/recording/_cwrap.c) against the Python body it
replaces: the same program, run once with each, stores the same spans and behaves the same
(return values, exceptions, methods, pickling, signatures, the OpenTelemetry context, a
fork, tracing turned off, the first call starting the recorder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chiptrace.recording import wrappers

PROGRAM = textwrap.dedent(
    """
    import asyncio, inspect, json, os, pickle, sys, threading
    import chiptrace
    from opentelemetry import trace as otel
    from chiptrace.recording import wrappers

    out = {"c": wrappers.compiled_in_c()}

    @chiptrace.trace(chip="gpu:0", op="compute")
    def f(x, y=2, *, z=3):
        "doc of f"
        return x + y + z

    @chiptrace.trace
    def boom():
        raise ValueError("bad input")

    class A:
        @chiptrace.trace
        def m(self, k):
            return (self, k)

        @staticmethod
        @chiptrace.trace
        def s(k):
            return k

    @chiptrace.trace
    def outer():
        return f(1) + inner()

    @chiptrace.trace
    def inner():
        with chiptrace.span("block"):
            cur = otel.get_current_span().get_span_context()
            out["inner_sees_block"] = cur.is_valid
            return f(2, z=0)

    @chiptrace.trace
    def writes():
        chiptrace.current_span().set_attribute("k", "v")
        return 1

    @chiptrace.trace
    def nothing():
        return None

    out["first"] = f(1)  # no init(): the first call starts the recorder from the environment

    # span() blocks: attributes, reuse of one object (nested, threads, asyncio tasks), an
    # exception, a status and an event (the general row), a renamed span, a link id.
    with chiptrace.span("attrs", attributes={"step": 3, "phase": "fwd"}) as s1:
        s1.set_attribute("late", 1.5)
    again = chiptrace.span("again", chip="cpu:0")
    with again:
        with again:
            f(3)
    ts = [threading.Thread(target=lambda: [again.__enter__(), again.__exit__(None, None, None)])
          for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]

    async def task():
        async with again:
            await asyncio.sleep(0)

    async def tasks():
        await asyncio.gather(*(task() for _ in range(3)))

    asyncio.run(tasks())
    try:
        with chiptrace.span("fails"):
            raise KeyError("k")
    except KeyError:
        pass
    with chiptrace.span("rich") as s2:
        s2.add_event("ev", {"a": 1})
        s2.set_status(otel.Status(otel.StatusCode.ERROR, "why"))
        s2.update_name("renamed")
    with chiptrace.span("xfer", link="nvlink5:gpu:0-gpu:1", attributes={}):
        pass
    from chiptrace.recording import sites
    full, sites.MAX_SITES = sites.MAX_SITES, len(sites.NAMES)  # past a full site table
    with chiptrace.span("past-full", chip="gpu:1"):
        pass
    with chiptrace.span("past-full-attrs", attributes={"x": 1}):
        pass
    sites.MAX_SITES = full
    out["calls"] = [f(1, 5, z=1), outer(), writes(), nothing()]
    try:
        boom()
    except ValueError as e:
        out["raised"] = [str(e), e.__traceback__ is not None]
    a = A()
    out["method"] = [a.m(3)[0] is a, A.m(a, 4)[1], A.s(5)]
    out["pickled"] = pickle.loads(pickle.dumps(f)) is f
    out["meta"] = [f.__name__, f.__doc__, str(inspect.signature(f)), f.__wrapped__.__name__]
    t = threading.Thread(target=lambda: [f(i) for i in range(100)])
    t.start()
    t.join()
    pid = os.fork()
    if pid == 0:
        f(7)
        chiptrace.shutdown()
        os._exit(0)
    os.waitpid(pid, 0)
    chiptrace.get_recorder().flush()
    from chiptrace import lifecycle
    lifecycle._STATE.enabled = False
    out["off"] = f(1)
    lifecycle._STATE.enabled = True
    chiptrace.shutdown()
    con = chiptrace.connect(sys.argv[1])
    out["spans"] = con.sql(
        "SELECT name, chip_id, op_kind, status_code, status_message, attributes, "
        "count(*) AS n, count(parent_span_id) AS children, count(DISTINCT pid) AS pids "
        "FROM spans GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    nested = con.sql(
        "SELECT c.name, p.name FROM spans c JOIN spans p ON c.parent_span_id = p.span_id "
        "AND c.trace_id = p.trace_id ORDER BY ALL"
    ).fetchall()
    out["nested"] = sorted(set(nested))
    out["events"] = sorted(
        [name, [e["name"] for e in json.loads(ev)]]
        for name, ev in con.sql("SELECT name, events FROM spans WHERE events IS NOT NULL").fetchall()
    )
    print(json.dumps(out, default=str))
    """
)


def _program(tmp_path: Path, source: str, c: str) -> str:
    """Run `source` in a fresh interpreter with CHIPTRACE_C_WRAPPER=c, its trace dir (also
    its first argument) its own; returns its stdout (a failed run fails the test)."""
    out = tmp_path / f"trace-{c}"
    script = tmp_path / f"program-{c}.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script), str(out)],
        env={**os.environ, "CHIPTRACE_C_WRAPPER": c, "CHIPTRACE_DIR": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _run(tmp_path: Path, c: str) -> dict:
    return json.loads(_program(tmp_path, PROGRAM, c).splitlines()[-1])


def _built() -> bool:
    return any(Path(wrappers.__file__).parent.glob("_cwrap*.so"))


@pytest.mark.skipif(not _built(), reason="the C wrapper was not built (no C compiler)")
def test_the_c_wrapper_behaves_as_the_python_body(tmp_path: Path) -> None:
    c, py = _run(tmp_path, "1"), _run(tmp_path, "0")
    assert c.pop("c") is True and py.pop("c") is False
    assert c == py
    assert c["raised"] == ["bad input", True]
    assert c["method"] == [True, 4, 5]
    assert c["pickled"] is True
    assert c["meta"] == ["f", "doc of f", "(x, y=2, *, z=3)", "f"]
    assert c["inner_sees_block"] is True
    rows = {(r[0], r[1], r[2]): r for r in c["spans"]}
    assert (
        rows[("f", "gpu:0", "compute")][6] == 1 + 1 + 3 + 100 + 1
    )  # in a block, and the forked child's too
    assert rows[("f", "gpu:0", "compute")][8] == 2  # two processes
    assert rows[("boom", None, None)][3:5] == [2, "ValueError: bad input"]
    assert json.loads(rows[("writes", None, None)][5]) == {"k": "v"}
    assert ["block", "inner"] in c["nested"] and ["f", "block"] in c["nested"]
    assert ["again", "again"] in c["nested"] and ["f", "again"] in c["nested"]
    assert rows[("again", "cpu:0", "compute")][6] == 2 + 4 + 3
    assert json.loads(rows[("attrs", None, None)][5]) == {"step": 3, "phase": "fwd", "late": 1.5}
    assert rows[("fails", None, None)][3:5] == [2, "KeyError: 'k'"]
    assert rows[("renamed", None, None)][3:5] == [2, "why"]
    assert rows[("past-full", "gpu:1", "compute")][6] == 1
    assert json.loads(rows[("past-full-attrs", None, None)][5]) == {"x": 1}
    assert ["renamed", ["ev"]] in c["events"] and ["fails", ["exception"]] in c["events"]


def test_the_wrapper_in_use_is_the_one_built() -> None:
    """Where the extension was built, `import chiptrace` uses it (a silently broken
    binding would leave every program on the slower body)."""
    expected = _built() and os.environ.get("CHIPTRACE_C_WRAPPER", "1") != "0"
    assert wrappers.compiled_in_c() is expected


INTERRUPTED = textwrap.dedent(
    """
    import sys, chiptrace

    rec = chiptrace.init(sys.argv[1], flush_interval_s=3600)

    def interrupted():  # as a SIGINT handler raises, inside chiptrace's own Python code
        raise KeyboardInterrupt

    @chiptrace.trace
    def f():
        return 1

    got = []
    for way in ("trace", "span"):
        rec.roll = interrupted  # the chunk's roll runs the handler
        try:
            for _ in range(5000):
                if way == "trace":
                    f()
                else:
                    with chiptrace.span("s"):
                        pass
            got.append("swallowed")
        except KeyboardInterrupt:
            got.append("raised")
        del rec.roll
    print(",".join(got))
    """
)


@pytest.mark.parametrize("c", ["1", "0"])
def test_a_keyboard_interrupt_raised_inside_recording_reaches_the_program(
    tmp_path: Path, c: str
) -> None:
    """A signal handler's KeyboardInterrupt or SystemExit can be raised inside the Python
    code a span's end calls (the chunk's roll): it is the program's, never swallowed (the C
    wrapper swallowed it, and a SIGTERM handler's sys.exit() then never ended the process)."""
    assert _program(tmp_path, INTERRUPTED, c) == "raised,raised"


RECURSIVE = textwrap.dedent(
    """
    import sys, chiptrace

    chiptrace.init(sys.argv[1])

    @chiptrace.trace
    def r(n):
        return 0 if n == 0 else 1 + r(n - 1)

    def depth(n):
        try:
            return str(r(n))
        except RecursionError:
            return "RecursionError"

    got = [depth(300), depth(700)]
    sys.setrecursionlimit(10**6)  # deeper than the C stack could take, one C frame a level
    got.append(depth(20_000))
    print(",".join(got))
    """
)


@pytest.mark.parametrize("c", ["1", "0"])
def test_deep_recursion_is_a_recursion_error_never_a_crash(tmp_path: Path, c: str) -> None:
    """A traced recursive function goes as deep under the C wrapper as under the Python one
    at the default limit; past what the C stack can take it raises RecursionError (it
    crashed with SIGSEGV at ~15,000 levels once a program raised the limit)."""
    expected = "RecursionError" if c == "1" and _built() else "20000"  # C where it was built
    assert _program(tmp_path, RECURSIVE, c) == f"300,RecursionError,{expected}"
