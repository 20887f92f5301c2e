"""device_time=True: GPU-tagged spans that time the device, resolved off the program's thread.

The CUDA tests run where PyTorch sees a GPU and are skipped elsewhere. The extension point
itself (hold, resolve on the writer thread, attributes and the device child span) is
checked everywhere with a timer that marks the host clock in place of a stream's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import chiptrace
from chiptrace.recording import device as _device
from tests.torch.conftest import read_spans


class HostClockTimer:
    """A DeviceTimer whose "device" is the host clock; its marks resolve one writer wake
    after they are held (as a stream's events complete a little after the call)."""

    def __init__(self) -> None:
        self.held: list = []
        self.threads: set[str] = set()

    def start(self):
        return time.time_ns()

    def stop(self, token):
        return token, time.time_ns()

    def hold(self, span, token) -> None:
        self.held.append((span, token, _device.attach(self.resolve)))

    def resolve(self, final: bool) -> None:
        self.threads.add(threading.current_thread().name)
        held, self.held = self.held, []
        for span, (start, end), rec in held:
            _device.release(span, rec, (start + 1000, end + 1000), **{"device.index": 0})


@pytest.fixture
def host_timer(monkeypatch):
    timer = HostClockTimer()
    monkeypatch.setattr(_device, "_timer", timer)
    return timer


def test_device_timed_spans_carry_the_device_time_and_a_device_child(trace_dir, host_timer):
    @chiptrace.trace(name="forward", chip="gpu:0", device_time=True)
    def forward(x: int) -> int:
        return x + 1

    with chiptrace.span("step"):
        assert forward(1) == 2
        with chiptrace.span("loss", chip="gpu:0", device_time=True) as s:
            s.set_attribute("kept", True)
    deadline = time.monotonic() + 10
    while host_timer.held and time.monotonic() < deadline:  # the writer thread takes them
        time.sleep(0.01)
    assert not host_timer.held and "chiptrace-writer" in host_timer.threads
    rows = {r["name"]: r for r in read_spans(trace_dir)}
    for name in ("forward", "loss"):
        host, dev = rows[name], rows[f"{name} (device)"]
        attrs = json.loads(host["attributes"])
        assert attrs["device.start_ns"] == dev["start_ns"]
        assert attrs["device.end_ns"] == dev["end_ns"]
        # the marks were taken inside the call; the "device" runs 1 us behind them
        assert host["start_ns"] <= dev["start_ns"] - 1000 <= dev["end_ns"] - 1000 <= host["end_ns"]
        assert attrs["device.duration_ns"] == dev["end_ns"] - dev["start_ns"]
        assert dev["parent_span_id"] == host["span_id"] and dev["trace_id"] == host["trace_id"]
        assert dev["chip_id"] == "gpu:0" and host["parent_span_id"] == rows["step"]["span_id"]
    assert json.loads(rows["loss"]["attributes"])["kept"] is True


def test_spans_without_device_time_never_reach_the_timer(trace_dir, host_timer):
    @chiptrace.trace(chip="gpu:0")
    def forward() -> None:
        pass

    forward()
    with chiptrace.span("x", chip="gpu:0") as _:
        pass
    assert type(chiptrace.span("y", chip="gpu:0")) is chiptrace.span
    chiptrace.flush()
    assert not host_timer.threads and "(device)" not in str(read_spans(trace_dir))


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    head = "import logging; logging.basicConfig(format='%(message)s')\n"
    return subprocess.run(
        [sys.executable, "-c", head + code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


SPANS = """
import sys, chiptrace
chiptrace.init(sys.argv[1] if len(sys.argv) > 1 else {out!r})
@chiptrace.trace(chip="gpu:0", device_time={flag})
def fwd(): pass
@chiptrace.trace(chip="cpu:0", device_time={flag})
def a(): pass
@chiptrace.trace(chip="cpu:1", device_time={flag})
def b(): pass
fwd(); fwd(); a(); b()
with chiptrace.span("blk", chip="gpu:0", device_time={flag}): pass
chiptrace.shutdown()
print(len(chiptrace.connect({out!r}).execute("SELECT * FROM spans").fetchall()))
"""


def test_without_torch_one_line_names_the_extra_and_spans_still_record(tmp_path):
    code = "import sys; sys.modules['torch'] = None\n" + SPANS.format(
        out=str(tmp_path / "a"), flag=True
    )
    done = _run(code)
    assert done.returncode == 0 and done.stdout.strip() == "5"
    lines = done.stderr.strip().splitlines()
    assert (
        lines.count(
            "chiptrace: device_time=True: PyTorch is not installed (pip install "
            "'chiptrace[torch]'); GPU-tagged spans time the host call only"
        )
        == 1
    )
    # Asked for on spans that are not GPU-tagged: one line, for the first of them.
    not_gpu = [ln for ln in lines if "not GPU-tagged" in ln]
    assert not_gpu == [
        "chiptrace: device_time=True on span 'a', which is not GPU-tagged (chip='cpu:0'): "
        "ignored; it times a GPU's work (further such spans are ignored silently)"
    ]


def test_the_global_setting_covers_gpu_tagged_spans_only(tmp_path):
    code = "import sys; sys.modules['torch'] = None\n" + SPANS.format(
        out=str(tmp_path / "b"), flag=None
    )
    done = _run(code, CHIPTRACE_DEVICE_TIME="1")
    assert done.returncode == 0 and done.stdout.strip() == "5"
    assert "PyTorch is not installed" in done.stderr  # the GPU-tagged ones asked
    assert "not GPU-tagged" not in done.stderr  # the others were not asked for
    bad = _run(code, CHIPTRACE_DEVICE_TIME="maybe")
    assert bad.returncode == 0
    assert bad.stderr.splitlines()[0] == (
        "chiptrace: CHIPTRACE_DEVICE_TIME='maybe': expected one of 1/0, true/false, "
        "yes/no, on/off; device time is off"
    )


@pytest.mark.torch
def test_without_cuda_it_is_a_no_op_with_one_warning(tmp_path, torch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    done = _run(SPANS.format(out=str(tmp_path / "c"), flag=True))
    assert done.returncode == 0 and done.stdout.strip() == "5"
    assert done.stderr.count("device_time=True: CUDA is not available here") == 1


# ---------------------------------------------------------------- where a GPU is present


def _cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.torch
def test_cuda_device_time_is_the_kernels_not_the_launch(trace_dir, torch):
    _cuda(torch)
    torch.cuda.init()

    @chiptrace.trace(name="spin", chip="gpu:0", device_time=True)
    def spin() -> None:
        torch.cuda._sleep(200_000_000)  # a kernel that spins ~0.1 s on the device

    t0 = time.monotonic()
    spin()
    host_s = time.monotonic() - t0
    torch.cuda.synchronize()
    chiptrace.flush()
    deadline = time.monotonic() + 10
    rows = {}
    while "spin (device)" not in rows and time.monotonic() < deadline:
        time.sleep(0.05)
        chiptrace.flush()
        rows = {r["name"]: r for r in read_spans(trace_dir)}
    host, dev = rows["spin"], rows["spin (device)"]
    device_ns = dev["end_ns"] - dev["start_ns"]
    assert host_s < 0.05 < device_ns / 1e9  # the call returned long before the device ended
    assert dev["start_ns"] >= host["start_ns"] - 1_000_000  # on the host clock, to ~1 ms
    assert json.loads(host["attributes"])["device.duration_ns"] == device_ns


@pytest.mark.torch
def test_cuda_kernels_hang_under_the_span_that_launched_them(trace_dir, torch):
    _cuda(torch)
    import chiptrace.torch

    a = torch.randn(512, 512, device="cuda")
    with chiptrace.torch.profile():
        for i in range(2):
            with chiptrace.span("step", attributes={"i": i}):
                (a @ a).relu_()
        torch.cuda.synchronize()
    rows = read_spans(trace_dir)
    by_id = {r["span_id"]: r for r in rows}
    kernels = [r for r in rows if r["chip_id"] == "gpu:0" and r["op_kind"] == "compute"]
    assert kernels
    for k in kernels:
        chain = []
        parent = by_id.get(k["parent_span_id"])
        while parent is not None:
            chain.append(parent["name"])
            parent = by_id.get(parent["parent_span_id"])
        assert "step" in chain, k["name"]
