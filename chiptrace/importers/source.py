"""Reading trace files: plain or gzip, whole or as a stream of Trace Event blocks.

A Trace Event document (Kineto, Chrome, Perfetto JSON) is one object whose `traceEvents`
array holds millions of small objects. Loading it whole costs ~10x its size in Python
objects (HTA needs 950 GB of RAM for 200 GB of traces), so `TraceEventStream` reads it in
blocks of a few MiB, cuts each block after the last `}` `,` `{` boundary in it and
decodes the events before that cut with one msgspec call. A cut that falls inside a
nested object or a string does not decode (the brackets or quotes are unbalanced), so a
failed decode just moves the cut back to the previous boundary: the decoder, not a
hand-written scanner, decides what a complete event is. Memory: one block and its events.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any, cast

import msgspec

from chiptrace.errors import ChiptraceError

# Bytes of events decoded per call: 2 MiB (~10k events) while a file is small, so a small
# import's peak memory stays low (a block's events cost ~10x its bytes); 8 MiB once 64 MiB
# are read, where per-block costs would add ~20% to a 1 GB import.
BLOCK_BYTES = 2 << 20
BIG_BLOCK_BYTES, BIG_AFTER = 8 << 20, 64 << 20
_READ_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"


class TraceFormatError(ChiptraceError):
    """A file that is not a trace of the expected format, or is cut short."""


def open_binary(path: str | os.PathLike[str]) -> IO[bytes]:
    """The file's bytes, gunzipped when it starts with the gzip magic (whatever its name).

    Raises:
        TraceFormatError: the file cannot be opened.
    """
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from e
    fh: IO[bytes] = raw
    zipped = raw.read(2) == _GZIP_MAGIC
    if zipped:
        raw.close()
        fh = cast(IO[bytes], gzip.open(path, "rb"))  # a GzipFile is one; typeshed disagrees
    else:
        raw.seek(0)
    try:
        if fh.read(3) != _BOM:  # a UTF-8 byte order mark (Windows editors write one): skipped
            fh.seek(0)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        if not zipped:
            raise TraceFormatError(f"cannot read {path}: {e}") from None
        # Damage shows when the file is read (as one line): start that read afresh.
        fh.close()
        fh = cast(IO[bytes], gzip.open(path, "rb"))
    return fh


def read_some(fh: IO[bytes], path: Any, n: int = _READ_BYTES) -> bytes:
    """Read up to n bytes, turning a damaged gzip stream into one TraceFormatError."""
    try:
        return fh.read(n)
    except EOFError:
        raise TraceFormatError(
            f"{path}: truncated gzip (the compressed stream ends early); expected a complete "
            ".json.gz file"
        ) from None
    except (gzip.BadGzipFile, zlib.error, OSError) as e:
        raise TraceFormatError(
            f"{path}: damaged gzip ({e}); expected a .json or .json.gz file"
        ) from None


def head(path: str | os.PathLike[str], n: int = 64 << 10) -> bytes:
    """The first n bytes of the (gunzipped) file, for format detection."""
    with open_binary(path) as fh:
        return read_some(fh, path, n)


def read_all(path: str | os.PathLike[str]) -> bytes:
    """The whole (gunzipped) file: for the small document formats (OTLP JSON, Jaeger)."""
    chunks = []
    with open_binary(path) as fh:
        while chunk := read_some(fh, path):
            chunks.append(chunk)
    return b"".join(chunks)


def bad_events(path: Any, what: str) -> TraceFormatError:
    return TraceFormatError(
        f'{path}: {what}; expected Trace Event JSON ({{"traceEvents": [...]}} or a [...] of events)'
    )


def _skip_ws(buf: bytes | bytearray, i: int) -> int:
    while i < len(buf) and buf[i] in _WS:
        i += 1
    return i


class TraceEventStream:
    """Blocks of events from a Trace Event document, and its other top-level keys.

    Iterate for lists of decoded events (`event_type` structs); after the iteration,
    `header` holds every top-level key but `traceEvents` (`baseTimeNanoseconds`,
    `distributedInfo`, ... may come after the array, so it is complete only at the end).
    `header_before` has the keys that came before the array.

    `blocks()` with `in_main` off yields undecoded blocks instead, for other processes to
    decode: `[...]` bytes cut at the last `}` `,` `{` in them, not checked. A consumer whose
    decode of one fails (the cut fell inside a string or nested object) hands that block
    and every later one back with `pushback()`, and the stream goes on decoding in place.
    Before the last events the stream yields None: the consumer settles what it has out
    then (it may push back), since after that the stream cannot rewind.

    Raises (while iterating):
        TraceFormatError: not a Trace Event document, malformed JSON, or cut short.
    """

    def __init__(
        self, path: str | os.PathLike[str], event_type: Any, block_bytes: int = BLOCK_BYTES
    ) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self._grow = block_bytes == BLOCK_BYTES
        self.in_main = True
        # strict=False: numeric strings ("ts": "1623212388426902") are numbers, as in
        # catapult; any other string where a number belongs is refused naming its event.
        self._decoder = msgspec.json.Decoder(list[event_type], strict=False)
        self._any = msgspec.json.Decoder()
        self.header: dict[str, Any] = {}
        self.header_before: dict[str, Any] = {}
        self.bytes_read = 0
        self._bare = False
        self._pushed: list[bytes] = []
        self.warnings: list[str] = []  # what was loaded only in part, and why
        self._gzip_cut = False
        self._yielded = False  # events before the tail

    def _bad(self, what: str) -> TraceFormatError:
        return bad_events(self.path, what)

    def __iter__(self) -> Iterator[list[Any]]:
        self.in_main = True
        for events in self.blocks():
            if events and isinstance(events, list):  # in_main: decoded lists only
                yield events

    def blocks(self) -> Iterator[list[Any] | bytes | None]:
        """Decoded event lists, or (in_main off) undecoded blocks and the None barrier."""
        with open_binary(self.path) as fh:
            buf = bytearray()
            eof = False
            while not eof and len(buf) < (1 << 26):  # the keys before the array: 64 MiB at most
                m = _EVENTS_KEY.search(buf)
                if m or (buf and buf.lstrip(_WS)[:1] == b"["):
                    break
                chunk = self._read(fh)
                eof = not chunk
                buf += chunk
            start = self._open_array(buf)
            yield from self._blocks(fh, buf, start, eof)

    def pushback(self, blocks: list[bytes]) -> None:
        """Blocks from `blocks()` (the oldest first) to read again, decoded in place."""
        self._pushed.append(b",".join(memoryview(b)[1:-1] for b in blocks) + b",")
        self.in_main = True

    def _read(self, fh: IO[bytes]) -> bytes:
        if self._gzip_cut:
            return b""
        read1 = getattr(fh, "read1", None)
        try:
            # read1: a gzip stream that ends early loses only its last chunk (~300 KB).
            chunk = read1(_READ_BYTES) if read1 is not None else fh.read(_READ_BYTES)
        except EOFError:  # a job killed while writing: load what was written
            self._gzip_cut, chunk = True, b""
        except (gzip.BadGzipFile, zlib.error, OSError):
            chunk = read_some(fh, self.path)  # raises its one-line error
        self.bytes_read += len(chunk)
        return chunk

    def _open_array(self, buf: bytearray) -> int:
        first = _skip_ws(buf, 0)
        if first < len(buf) and buf[first : first + 1] == b"[":
            self._bare = True
            return first + 1  # a bare array of events (the Chrome format allows it)
        m = _EVENTS_KEY.search(buf)
        if first >= len(buf) or buf[first : first + 1] != b"{" or not m:
            raise self._bad("no traceEvents array")
        before = bytes(buf[first : m.start()]).rstrip(_WS).rstrip(b",")
        try:
            self.header_before = self._any.decode(before + b"}") if before != b"{" else {}
        except msgspec.DecodeError as e:
            raise self._bad(f"malformed JSON before traceEvents ({e})") from None
        self.header.update(self.header_before)
        return m.end()

    def _blocks(
        self, fh: IO[bytes], buf: bytearray, start: int, eof: bool
    ) -> Iterator[list[Any] | bytes | None]:
        while True:
            if self._pushed:
                buf[start:start] = b"".join(self._pushed)
                self._pushed.clear()
            if self._grow and self.bytes_read >= BIG_AFTER:
                self.block_bytes, self._grow = BIG_BLOCK_BYTES, False
            while not eof and len(buf) - start < self.block_bytes:
                chunk = self._read(fh)
                eof = not chunk
                buf += chunk
            end = min(len(buf), start + self.block_bytes)
            cut = self._cut(buf, start, end, self.in_main)
            if cut is None and end < len(buf):  # one event longer than a block
                cut = self._cut(buf, start, len(buf), self.in_main)
            if cut is not None:
                block, start = cut
                if len(block):
                    self._yielded = True
                    yield block
                if len(buf) - start < self.block_bytes or not eof:
                    del buf[:start]
                    start = 0
                continue
            if not eof:
                # One event bigger than a block: read on until a boundary arrives.
                chunk = self._read(fh)
                eof = not chunk
                buf += chunk
                continue
            if not self.in_main:
                yield None  # the barrier: blocks still out may come back
                if self._pushed:
                    continue
            yield from self._tail(buf, start)
            return

    def _cut(
        self, buf: bytearray, start: int, end: int, decode: bool = True
    ) -> tuple[list[Any] | bytes, int] | None:
        """The events before the last boundary that gives valid JSON (decode), or the bytes
        before the last boundary, unchecked; and where the next block starts. None: no
        boundary."""
        size = 1 << 16  # a boundary is rarely far from the end: scan little, then more
        window = max(start, end - size)
        while True:
            matches = [m.start() for m in _BOUNDARY.finditer(buf, window, end)]
            for pos in reversed(matches):
                # One copy (bytes + bytearray would copy byte by byte: 20x slower).
                block = b"".join((b"[", memoryview(buf)[start : pos + 1], b"]"))
                nxt = buf.index(b",", pos + 1) + 1
                if not decode:
                    return block, nxt
                try:
                    return self._decoder.decode(block), nxt
                except msgspec.ValidationError as e:
                    raise self._shape_error(block, e) from None
                except msgspec.DecodeError:
                    continue  # the cut fell inside a nested object or a string
            if window == start:
                return None
            size = min(size * 4, 1 << 20)
            end, window = window + 64, max(start, window - size)

    def _tail(self, buf: bytearray, start: int) -> Iterator[list[Any]]:
        """The last event(s), the array's `]`, and the keys after it."""
        rest = bytes(buf[start:]).rstrip(_WS)
        ends = [i for i, c in enumerate(rest) if c == 0x5D][::-1]  # each `]`, last first
        if self._bare and not rest.endswith(b"]"):
            ends.insert(0, len(rest))  # Chrome allows an array without its closing `]`
        for k in ends:
            try:
                extra = self._trailer(rest[k + 1 :].strip(_WS))
                events = self._decoder.decode(b"[" + rest[:k] + b"]")
            except msgspec.ValidationError as e:
                raise self._shape_error(b"[" + rest[:k] + b"]", e) from None
            except msgspec.DecodeError:
                continue
            self.header.update(extra)
            if self._gzip_cut:
                self.warnings.append(self._cut_note(len(rest) - k))
            if events:
                yield events
            return
        yield from self._salvage(rest)

    def _salvage(self, rest: bytes) -> Iterator[list[Any]]:
        """An array that does not close (cut short, a trailing comma, damage): the events
        before the last complete one are loaded, with a warning, as catapult does."""
        body = rest.rstrip(_WS + b",")
        cuts = [len(body)] + [m.start() + 1 for m in _BOUNDARY.finditer(body)][::-1]
        for pos in cuts:
            try:
                events = self._decoder.decode(b"[" + body[:pos] + b"]")
            except msgspec.ValidationError as e:
                raise self._shape_error(b"[" + body[:pos] + b"]", e) from None
            except msgspec.DecodeError:
                continue
            self.warnings.append(self._cut_note(len(body) - pos))
            if events:
                yield events
            return
        if not self._yielded and not self._gzip_cut:
            raise self._bad("malformed or truncated JSON in or after the traceEvents array")
        self.warnings.append(self._cut_note(len(body)))

    def _cut_note(self, lost: int) -> str:
        if self._gzip_cut:
            return (
                "cut short: the gzip stream ends early; loaded the complete events in its "
                f"first {self.bytes_read} bytes"
            )
        if lost == 0:
            return "the traceEvents array is not closed (it ends with a comma): loaded every event"
        return (
            f"cut short: the last {lost} bytes are not a complete event (truncated or "
            "damaged); loaded the events before them"
        )

    def _shape_error(self, block: bytes, e: msgspec.ValidationError) -> TraceFormatError:
        """One line naming the event whose field has the wrong type."""
        m = re.search(r"\$\[(\d+)\](?:\.(\w+))?", str(e))
        what = str(e).split(" - at ")[0]
        if m:
            try:
                event = self._any.decode(block)[int(m.group(1))]
            except (msgspec.DecodeError, IndexError, TypeError):
                event = None
            if isinstance(event, dict):
                field = m.group(2) or "the event"
                value = event.get(field)
                expected = (
                    "a number of microseconds (or a numeric string)"
                    if field in ("ts", "dur")
                    else what
                )
                return TraceFormatError(
                    f"{self.path}: event {event.get('name', '?')!r} (ph={event.get('ph', '?')!r}): "
                    f"{field}={value!r}: expected {expected}"
                )
        return self._bad(f"an event of the wrong shape ({e})")

    def _trailer(self, trailer: bytes) -> dict[str, Any]:
        if self._bare:
            if trailer:
                raise msgspec.DecodeError("text after the array")
            return {}
        if trailer == b"}":
            return {}
        if not trailer.startswith(b","):
            raise msgspec.DecodeError("not a trailer")
        out = self._any.decode(b"{" + trailer[1:])
        if not isinstance(out, dict):
            raise msgspec.DecodeError("not an object")
        return out
