"""Exporters (installed as chiptrace.exporters): OTLP to Jaeger, Jaeger JSON, Chrome/Perfetto JSON."""
