"""The README's two-minute quickstart, as a script: four steps, each a host-to-device copy
and a forward pass, traced into ./chiptrace-traces/<run-id>/ (or CHIPTRACE_DIR).

    python3 samples/quickstart.py && chiptrace report 'chiptrace-traces/*'

tests/analysis/test_quickstart.py checks this file still holds the README's code block and
runs it, then `chiptrace report` (text, --json, --html) and `chiptrace diff` on its output.
"""

import chiptrace


@chiptrace.trace(chip="gpu:0", precision="bf16")  # a span per call, tagged gpu:0
def forward(batch): ...


@chiptrace.trace(link="pcie5:cpu:0-gpu:0")  # a transfer over PCIe 5, cpu:0 -> gpu:0
def copy_in(batch): ...


for i in range(4):
    b = list(range(1024))
    with chiptrace.span("step") as s:  # or a block
        copy_in(b)
        forward(b)
        s.set_attribute("op.bytes", 4 << 20)
        s.set_attribute("step", i)
