"""Which format a trace file is, from its first bytes (never from its name alone)."""

from __future__ import annotations

import os
import re

from chiptrace.importers.source import TraceFormatError, head

FORMATS = ("kineto", "chrome", "otlp-json", "jaeger-json")
EXPECTED = (
    'expected a PyTorch profiler (Kineto) or Chrome trace ({"traceEvents": [...]}), '
    'OTLP JSON or JSONL ({"resourceSpans": [...]}) or Jaeger JSON ({"data": [...]})'
)
_KINETO_HINTS = (
    b'"schemaVersion"',
    b'"distributedInfo"',
    b'"deviceProperties"',
    b'"cat": "cpu_op"',
    b'"cat":"cpu_op"',
    b'"cat": "kernel"',
    b'"cat": "user_annotation"',
    b'"cat": "cuda_runtime"',
    # The PyTorch 1.8-1.9 profiler: capitalised categories, its name in every op's args
    # (its first files were a bare array with no schemaVersion).
    b'"Trace name": "PyTorch Profiler"',
    b'"name": "PyTorch Profiler (0)"',
    b'"cat": "Runtime"',
)


def detect(path: str | os.PathLike[str]) -> str:
    """The format of `path`: one of FORMATS.

    Raises:
        TraceFormatError: unreadable, empty, not JSON, or JSON of no known trace shape.
    """
    text = head(path).lstrip()
    if not text:
        raise TraceFormatError(f"{path}: empty file; {EXPECTED}")
    if text[:1] not in (b"{", b"["):
        raise TraceFormatError(f"{path}: not JSON (starts with {text[:12]!r}); {EXPECTED}")
    first_key = re.match(rb'\[?\s*\{\s*"([^"]{1,40})"', text)
    key = first_key.group(1) if first_key else b""
    if b'"resourceSpans"' in text[:4096] or key == b"resourceSpans":
        return "otlp-json"
    if key == b"data" or (key in (b"traceID", b"spans") and b'"spanID"' in text):
        return "jaeger-json"
    if b'"traceEvents"' in text or (text[:1] == b"[" and b'"ph"' in text[:4096]):
        if any(h in text for h in _KINETO_HINTS) and b'"generator":"chiptrace"' not in text:
            return "kineto"
        return "chrome"
    raise TraceFormatError(f"{path}: JSON, but no trace in it; {EXPECTED}")
