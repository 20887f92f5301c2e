"""chiptrace.init(sample_host=True): spans and host metrics in one dir and run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import chiptrace
from chiptrace import api, config
from chiptrace.errors import ConfigError
from chiptrace.store import PartWriter, read_manifests
from tests.waiting import wait_until


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch) -> None:
    for var in (
        config.ENV_SAMPLE_HOST,
        config.ENV_SAMPLE_INTERVAL,
        config.ENV_SAMPLER_PID,
        config.ENV_DIR,
    ):
        monkeypatch.delenv(var, raising=False)
    yield
    chiptrace.shutdown()


def test_init_sample_host_writes_spans_and_metrics_in_one_run(tmp_path: Path) -> None:
    chiptrace.init(tmp_path, service="svc", run_id="r1", sample_host=True, sample_interval=0.02)
    sampler = api._STATE.sampler
    assert sampler is not None and sampler.interval == 0.02
    assert sampler.wait_ready()

    @chiptrace.trace(chip="cpu:0")
    def step() -> None:
        pass

    for _ in range(20):
        step()
    wait_until(lambda: sampler.ticks >= 2, "two samples")
    chiptrace.shutdown()
    assert api._STATE.sampler is None and not sampler.running
    con = chiptrace.connect(tmp_path)
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 20
    assert con.execute("SELECT count(*) FROM metrics WHERE run_id = 'r1'").fetchone()[0] > 0
    runs = con.execute("SELECT source, run_id FROM runs ORDER BY source").fetchall()
    assert runs == [("code", "r1"), ("real", "r1")]


def test_sampling_is_off_by_default_and_on_from_the_environment(
    tmp_path: Path, monkeypatch
) -> None:
    chiptrace.init(tmp_path / "a")
    assert api._STATE.sampler is None
    monkeypatch.setenv(config.ENV_SAMPLE_HOST, "1")
    monkeypatch.setenv(config.ENV_SAMPLE_INTERVAL, "0.05")
    chiptrace.init(tmp_path / "b")
    assert api._STATE.sampler is not None and api._STATE.sampler.interval == 0.05
    # one sampler per host: processes started from here do not sample again...
    assert os.environ[config.ENV_SAMPLER_PID] == str(os.getpid())
    child = {config.ENV_SAMPLE_HOST: "1", config.ENV_SAMPLER_PID: str(os.getpid() + 1)}
    assert config.resolve_sampling(env=child) == (False, 0.1)
    assert config.resolve_sampling(True, env=child) == (True, 0.1)  # ...unless asked in code
    # ...while this process may stop and start sampling again from the same environment
    chiptrace.shutdown()
    chiptrace.init(tmp_path / "b2")
    assert api._STATE.sampler is not None
    # a new init() replaces the old sampler, as it replaces the recorder
    old = api._STATE.sampler
    chiptrace.init(tmp_path / "c", sample_host=False)
    assert api._STATE.sampler is None and not old.running


def test_bad_sampling_settings_name_the_setting(monkeypatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sample_interval"):
        chiptrace.init(tmp_path, sample_host=True, sample_interval=0)
    monkeypatch.setenv(config.ENV_SAMPLE_INTERVAL, "fast")
    with pytest.raises(ConfigError, match="CHIPTRACE_SAMPLE_INTERVAL='fast'"):
        chiptrace.init(tmp_path, sample_host=True)
    monkeypatch.setenv(config.ENV_SAMPLE_HOST, "maybe")
    with pytest.raises(ConfigError, match="CHIPTRACE_SAMPLE_HOST='maybe'"):
        config.resolve_sampling()


def test_part_writer_table_keeps_metrics_apart_from_spans(tmp_path: Path) -> None:
    import pyarrow as pa

    w = PartWriter(tmp_path, {"run_id": "x"}, table="metrics", write_options={})
    path = w.write(pa.table({"a": [1, 2, 3]}))
    assert path.parent == tmp_path / "metrics"
    assert not (tmp_path / "spans").exists()
    w.write_manifest()
    (m,) = read_manifests([tmp_path])
    assert m["table"] == "metrics" and m["rows_written"] == 3 and m["spans_written"] == 0


def test_import_and_query_stay_light(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, chiptrace\n"
        f"con = chiptrace.connect({str(tmp_path)!r}, allow_empty=True)\n"
        "con.execute('SELECT count(*) FROM metrics').fetchall()\n"
        "heavy = {'psutil', 'pynvml', 'chiptrace.host.sampler'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
