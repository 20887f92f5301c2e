"""Docs runner fixtures: the stores placeholders are filled from, an OTLP receiver standing in
for Jaeger, one working directory per doc. Made once per session."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from docs_runner import KINETO_FILE, DocSession, Fixtures, new_workdir  # noqa: E402
from mdblocks import ROOT  # noqa: E402


class SpanCounter:
    """The receiver's callback: counts what it acknowledged."""

    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def __call__(self, batch) -> None:  # noqa: ANN001
        with self._lock:
            self.spans += batch.num_rows


@pytest.fixture(scope="session")
def otlp_peer() -> Iterator[tuple[object, SpanCounter]]:
    """A real OTLP receiver (HTTP and gRPC) on loopback port 0: the docs' Jaeger."""
    from chiptrace.collector.receiver import OtlpReceiver

    counter = SpanCounter()
    with OtlpReceiver(counter, http="127.0.0.1:0", grpc="127.0.0.1:0") as receiver:
        yield receiver, counter


@pytest.fixture(scope="session")
def docs_fixtures(tmp_path_factory: pytest.TempPathFactory, otlp_peer) -> Fixtures:  # noqa: ANN001
    import chiptrace
    from chiptrace.emulator import emulate

    base = tmp_path_factory.mktemp("docs-fixtures")
    store = base / "emulated"
    emulate(topology="rack6", workload="mixed", steps=2, seed=1, out=store, progress=False)
    imported = base / "imported"
    chiptrace.import_trace([ROOT / KINETO_FILE], imported, workers=0)
    receiver, _ = otlp_peer
    scratch = tmp_path_factory.mktemp("docs-scratch")
    return Fixtures(
        store=store,
        run_id=store.name,
        imported=imported,
        otlp_http=f"127.0.0.1:{receiver.http_port}",
        otlp_grpc=f"127.0.0.1:{receiver.grpc_port}",
        scratch=scratch,
    )


@pytest.fixture(scope="session")
def doc_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DocSession]]:
    sessions: dict[str, DocSession] = {}

    class Sessions(dict):
        def __missing__(self, doc: str) -> DocSession:
            name = doc.replace("/", "-").removesuffix(".md")
            self[doc] = DocSession(doc, new_workdir(tmp_path_factory.mktemp(f"doc-{name}")))
            return self[doc]

    sessions = Sessions()
    yield sessions
