"""A full disk: the collector refuses (503, Retry-After) what it could not store, keeps
everything it acknowledged, and its exit line counts what is on disk.

The disk is a small tmpfs, mounted for the test (root only; skipped otherwise).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from chiptrace.collector.sink import PartitionedStoreSink
from chiptrace.collector.spool import Spool, SpoolLimits, StoreUnavailable
from chiptrace.store import PartWriter
from tests.collector.test_collect import (
    post,
    sample_request,
    start_collect,
    stored,
    stored_count_said,
)
from tests.collector.test_spool import spans, stored_ids
from tests.waiting import wait_until


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted under tmp_path."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("the full-disk tests mount a tmpfs: they need root and mount(8)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def big_request(first: int, n: int = 100) -> bytes:
    """`n` spans, each with 4 kB of incompressible attribute, so the disk fills fast."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest.FromString(sample_request(n, first))
    for span in req.resource_spans[0].scope_spans[0].spans:
        kv = span.attributes.add()
        kv.key, kv.value.string_value = "noise", os.urandom(2048).hex()
    return req.SerializeToString()


def test_full_disk_is_refused_and_every_acknowledged_span_stored(small_disk: Path) -> None:
    out = small_disk / "trace"
    proc, url = start_collect(out, "--flush-interval", "0.2", "--min-free-mb", "1")
    acked: list[int] = []
    refusals: list[tuple[str | None, str]] = []

    def client(k: int) -> None:
        first = 1 + k * 10_000_000
        deadline = time.monotonic() + 120
        while len(refusals) < 12 and time.monotonic() < deadline:
            req = urllib.request.Request(
                url, data=big_request(first), headers={"Content-Type": "application/x-protobuf"}
            )
            try:
                with urllib.request.urlopen(req, timeout=60):
                    acked.extend(range(first, first + 100))
                first += 100
            except urllib.error.HTTPError as e:
                assert e.code == 503
                refusals.append((e.headers["Retry-After"], e.read().decode()))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert len(refusals) >= 12 and len(acked) >= 1000
    assert all(after and int(after) >= 1 for after, _ in refusals)
    assert any("nearly full" in text for _, text in refusals)
    rows = stored(out)
    assert set(acked) <= {int(k, 16) for k in rows}
    assert stored_count_said(err) == len(rows)


def test_a_write_that_hits_a_full_disk_is_kept_and_retried(small_disk: Path) -> None:
    """The disk filled by someone else after the spans were taken: the write fails, the
    spans stay, new ones are refused, and once there is room they are written."""
    out = small_disk / "trace"
    writer = PartWriter(out)
    spool = Spool(PartitionedStoreSink(writer), SpoolLimits(flush_interval_s=0.05))
    filler = small_disk / "filler"
    fill(filler)
    spool.offer(spans(1, 50, attributes=["z" * 4096] * 50))
    wait_until(lambda: spool.last_error, "a write to fail")
    assert "No space left" in spool.last_error
    with pytest.raises(StoreUnavailable, match="cannot write"):
        spool.offer(spans(500, 1))
    filler.unlink()
    wait_until(lambda: spool.pending == 0, "the retry to write the spans")
    spool.offer(spans(600, 3))
    spool.close()
    assert (spool.stored, spool.unwritten) == (53, 0)
    assert stored_ids(out) == [*range(1, 51), 600, 601, 602]
    assert not list(out.rglob("*.tmp"))  # the failed write left no half part


def test_exit_says_what_could_not_be_written_and_is_nonzero(small_disk: Path) -> None:
    out = small_disk / "trace"
    proc, url = start_collect(out, "--flush-interval", "3600", "--min-free-mb", "0")
    assert post(url, sample_request(5, 1))[0] == 200  # taken while there was room
    fill(small_disk / "filler")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    assert "stored 0 spans" in err and "5 acknowledged spans could NOT be written" in err
    assert "No space left" in err


def fill(path: Path) -> None:
    """Write `path` until the disk is full."""
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError:
            pass
