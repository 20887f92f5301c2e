"""The `@trace` wrapper of a plain function, compiled once per decorated function.

Its source is generated with the function's own parameters (`def f(x, y=_d0, *, k)`
calls `fn(x, y, k=k)`: no *args tuple or **kwargs dict per call) and its site number
(chiptrace.recording.sites: name, kind, tags) written in as a literal; everything else it reads
is a global of one shared dict, G: the functions it calls and the process state
chiptrace.recording.spans keeps current, bound once by chiptrace.recording (`bind`) (the enabled flag, the
recorder, the id counter). A call then costs: a flag check, the parent from
the context, an id, a `Live` tuple in a new context dict, two clock reads and one list
append. Functions whose signature cannot be read (some builtins) get the same body
with `*args, **kwargs`.

Measured beside the earlier closure (a span object per call) on the same loaded 2-core
VM: about a third of its cost (benchmarks/bench_hotpath.py has today's figures).

The same body is compiled C where the extension `_cwrap` was built at install (a C
compiler; it is optional) and OpenTelemetry's context is the usual ContextVar: about a
third of the Python body's cost again, since the frame and bytecode cost as much as the
work. The wrapper is then a `_cwrap.Wrapper` object, not a function: it binds as a
method, pickles by name, and reads what functools.wraps does not copy (`__code__`,
`__defaults__`) through to the decorated function. `CHIPTRACE_C_WRAPPER=0` keeps the
Python body (the reference: tests run both).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

# The compiled wrappers' globals: chiptrace.recording.spans.WRAPPER_GLOBALS (the process
# state, kept current there), with the functions and constants the body calls added by
# `bind`, which chiptrace.recording runs once, when the package loads. None until then.
G: dict[str, Any] | None = None
_C: Any = None  # chiptrace.recording._cwrap once bound, where it was built
_CALLS = frozenset(
    "Live parent_ids EXTRA end_live fail_live record_first start get set reset now KEY".split()
)


def bind(state: dict[str, Any], **calls: Any) -> None:
    """Make `state` (the process state the body reads) the compiled wrappers' globals,
    with the functions and constants the body calls added to it.

    Raises:
        TypeError: a name the body does not call, or one it calls left out.
    """
    global G, _C
    if set(calls) != _CALLS:
        raise TypeError(f"wrappers.bind: expected {sorted(_CALLS)}, got {sorted(calls)}")
    state.update(calls)
    G = state
    _C = None
    # The C wrappers read OpenTelemetry's ContextVar itself: a custom context runtime
    # (OTEL_PYTHON_CONTEXT) keeps the Python body.
    var = getattr(calls["get"], "__self__", None)
    if os.environ.get("CHIPTRACE_C_WRAPPER", "1") != "0" and isinstance(var, ContextVar):
        try:
            from chiptrace.recording import _cwrap
        except ImportError:  # built without a C compiler: the Python body
            return
        _cwrap.bind(state, var)
        _C = _cwrap


def refresh() -> None:
    """The process state changed (chiptrace.recording.spans calls this): the C wrappers
    read their copy of it again."""
    if _C is not None:
        _C.refresh()


def block_base(reference: type) -> type:
    """The base of chiptrace.api.span: the C enter and exit where built, else `reference`
    (the Python ones)."""
    return _C.Block if _C is not None else reference


def bind_span(block: type, span: type, *calls: Any) -> None:
    """Give the C enter and exit the classes whose slots they fill and the functions they
    call where the Python ones would (see _cwrap.c's bind_span)."""
    if _C is not None:
        _C.bind_span(block, span, *calls)


def compiled_in_c() -> bool:
    """Whether @trace wrappers are the C ones (for the benchmark and the tests)."""
    return _C is not None


_BODY = """
def make(fn, {defaults}):
    def wrapper({params}):
        if not ON:  # tracing off, or not started yet: start() starts it (once)
            if OFF or not start():
                return fn({args})
        _ct_ctx = get()
        _ct_parent = _ct_ctx.get(KEY)
        _ct_sid = new_id()
        if _ct_parent.__class__ is Live:
            _ct_th, _ct_tl, _ct_pid, _ct_start = _ct_parent
        elif _ct_parent is None and REMOTE is None:
            _ct_th = HI
            _ct_tl = _ct_sid
            _ct_pid = 0
        else:
            _ct_th, _ct_tl, _ct_pid = parent_ids(_ct_parent, _ct_sid)
        # A context holding nothing but the parent span (the usual case) is replaced
        # whole: a one-key dict costs less than copying the old one.
        _ct_start = now()
        if len(_ct_ctx) == (_ct_parent is not None):
            _ct_token = set({{KEY: Live((_ct_th, _ct_tl, _ct_sid, _ct_start))}})
        else:
            _ct_token = set({{**_ct_ctx, KEY: Live((_ct_th, _ct_tl, _ct_sid, _ct_start))}})
        try:
            return fn({args})
        except BaseException as _ct_e:
            fail_live(_ct_th, _ct_tl, _ct_sid, _ct_e)
            raise
        finally:
            _ct_end = now()
            try:
                reset(_ct_token)
            except ValueError:
                pass
            if EXTRA and _ct_sid in EXTRA:
                end_live(_ct_th, _ct_tl, _ct_sid, {site}, _ct_pid, _ct_start, _ct_end)
            elif REC is None:
                record_first(({site}, _ct_th, _ct_tl, _ct_sid, _ct_pid, _ct_start, _ct_end))
            else:
                _ct_cur = REC.cur
                _ct_cur.append(({site}, _ct_th, _ct_tl, _ct_sid, _ct_pid, _ct_start, _ct_end))
                if len(_ct_cur) >= REC.chunk_rows:
                    REC.roll()
    return wrapper
"""

_GENERIC: tuple[str, str, list[str]] = ("*args, **kwargs", "*args, **kwargs", [])
# Globals the body reads: a parameter of the same name would shadow one.
_RESERVED = frozenset(
    "fn make ON OFF start REC REMOTE HI KEY Live get set reset now new_id parent_ids fail_live "
    "end_live record_first EXTRA".split()
)


def _signature(fn: Callable[..., Any]) -> tuple[str, str, list[Any]]:
    """(parameters, call arguments, default values) mirroring fn's own signature."""
    try:
        sig = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return _GENERIC
    params: list[str] = []
    args: list[str] = []
    defaults: list[Any] = []
    star = False
    kinds = inspect.Parameter
    last_positional_only = max(
        (i for i, p in enumerate(sig.parameters.values()) if p.kind is kinds.POSITIONAL_ONLY),
        default=-1,
    )
    for i, p in enumerate(sig.parameters.values()):
        name = p.name
        if name.startswith("_ct_") or name in _RESERVED:
            return _GENERIC
        text = name
        if p.default is not kinds.empty:
            text = f"{name}=_ct_d{len(defaults)}"
            defaults.append(p.default)
        if p.kind is kinds.VAR_POSITIONAL:
            text, star = f"*{name}", True
            args.append(f"*{name}")
        elif p.kind is kinds.VAR_KEYWORD:
            text = f"**{name}"
            args.append(f"**{name}")
        elif p.kind is kinds.KEYWORD_ONLY:
            if not star:
                params.append("*")
                star = True
            args.append(f"{name}={name}")
        else:
            args.append(name)
        params.append(text)
        if i == last_positional_only:
            params.append("/")
    return ", ".join(params), ", ".join(args), defaults


@functools.lru_cache(maxsize=1024)
def _compiled(params: str, args: str, n_defaults: int, site: int) -> Any:
    defaults = ", ".join(f"_ct_d{i}" for i in range(n_defaults)) or "_ct_unused=None"
    source = _BODY.format(params=params, args=args, defaults=defaults, site=site)
    return compile(source, f"<chiptrace.trace site {site}>", "exec")


def wrap(fn: Callable[..., Any], site: int) -> Callable[..., Any]:
    """The traced version of the plain function `fn`, whose spans are site `site`."""
    if G is None:
        raise RuntimeError(
            "chiptrace.recording.wrappers: bind() has not run (chiptrace.recording runs it)"
        )
    if _C is not None:
        return functools.wraps(fn)(_C.Wrapper(fn, site))
    params, args, defaults = _signature(fn)
    namespace: dict[str, Any] = {}
    exec(_compiled(params, args, len(defaults), site), G, namespace)  # noqa: S102
    wrapper = namespace["make"](fn, *defaults)
    return functools.wraps(fn)(wrapper)
