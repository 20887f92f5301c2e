"""`chiptrace demo` on a terminal: the emulation runs in a thread and shows live in the viewer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from viewer_helpers import until

from chiptrace.cli import main
from chiptrace.viewer.app import ViewerApp


def test_demo_on_a_terminal_runs_the_viewer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("chiptrace.emulator")
    seen: dict[str, object] = {}
    real_run = ViewerApp.run

    def headless_run(self: ViewerApp, **kwargs: object) -> None:
        async def pilot_fn(pilot) -> None:  # noqa: ANN001
            # the 0.3 s emulated run has ended and been ingested: the status line says so
            def ended() -> bool:
                self.refresh_dashboard()
                return self.state == "ENDED"

            await until(pilot, ended, "the demo run ENDED")
            seen["state"] = self.state
            seen["gpus"] = len(self.snapshot.chips["gpu"])
            seen["spans"] = self.model.spans_total
            self.exit()

        real_run(self, headless=True, size=(100, 32), auto_pilot=pilot_fn)

    monkeypatch.setattr(ViewerApp, "run", headless_run)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    out = tmp_path / "demo"
    assert main(["demo", "--seconds", "0.3", "--out", str(out)]) == 0
    assert seen["gpus"] == 8 and seen["spans"] > 0 and seen["state"] == "ENDED"
    assert "chiptrace view" in capsys.readouterr().out


def test_demo_no_ui_prints_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("chiptrace.emulator")
    assert (
        main(["demo", "--seconds", "0.2", "--speed", "2", "--no-ui", "--out", str(tmp_path / "d")])
        == 0
    )
    out = capsys.readouterr().out
    assert "steps" in out and "spans" in out and "next:" in out
