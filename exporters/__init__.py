"""Exporters (installed as chiptrace.exporters): OTLP to Jaeger, Jaeger JSON, Chrome/Perfetto JSON.

- `otlp.export_dirs(DIR, "http://127.0.0.1:4318")`, `otlp.OtlpSink(endpoint)`: OTLP/HTTP and
  OTLP/gRPC, encoded straight from the stored Arrow columns (`otlp_encode`).
- `jaeger.write_jaeger_json(spans, path)`; `chiptrace.importers.jaeger.read_jaeger_json(path)`
  reads it back.
- `chrome.write_chrome_json(spans, path)`: Trace Event Format for Perfetto / chrome://tracing.
  Both stream to the file (spans: a table or a SpanSource) and rename it into place.
- `source.SpanSource(DIR, SpanFilter(...))`: the filtered spans every format reads.

Submodules import lazily: `import chiptrace.exporters` loads nothing heavy.
"""

from __future__ import annotations

__all__ = ["otlp", "otlp_encode", "otlp_config", "otlp_transport", "jaeger", "chrome", "source"]
