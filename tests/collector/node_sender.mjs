// Sends spans with the real OpenTelemetry JS SDK; prints what it sent as JSON.
//
//   node node_sender.mjs (--http URL | --grpc HOST:PORT) [--spans N] [--gzip]
//
// Run from a folder where tests/clients/node-otel/package.json was `npm install`ed.
// NodeTracerProvider + BatchSpanProcessor + OTLPTraceExporter: HTTP/protobuf
// (exporter-trace-otlp-proto, which streams its body chunked) or gRPC
// (exporter-trace-otlp-grpc). Prints {"spans": [...], "exports": {"0": n, "1": m}}: each
// span as the SDK recorded it, and the export result codes (0 success, 1 failure).
import { NodeTracerProvider, BatchSpanProcessor, SimpleSpanProcessor, InMemorySpanExporter } from "@opentelemetry/sdk-trace-node";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { OTLPTraceExporter as HttpExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { OTLPTraceExporter as GrpcExporter } from "@opentelemetry/exporter-trace-otlp-grpc";
import { SpanKind } from "@opentelemetry/api";

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const n = Number(opt("--spans") ?? 50);
const compression = args.includes("--gzip") ? "gzip" : "none";
const inner = opt("--http")
  ? new HttpExporter({ url: opt("--http"), compression, timeoutMillis: 60000 })
  : new GrpcExporter({ url: `http://${opt("--grpc")}`, compression, timeoutMillis: 60000 });

const exports = {};
const exporter = {
  export(spans, done) {
    inner.export(spans, (result) => {
      exports[result.code] = (exports[result.code] ?? 0) + 1;
      if (result.error) process.stderr.write(`export: ${result.error}\n`);
      done(result);
    });
  },
  shutdown: () => inner.shutdown(),
  forceFlush: () => inner.forceFlush(),
};
const memory = new InMemorySpanExporter();
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ "service.name": "node-app", "host.name": "node-host" }),
  spanProcessors: [
    new BatchSpanProcessor(exporter, { maxExportBatchSize: 64, scheduledDelayMillis: 50 }),
    new SimpleSpanProcessor(memory),
  ],
});
provider.register(); // the async-hooks context manager: children get their parent
const tracer = provider.getTracer("node.lib");

tracer.startActiveSpan("request", { kind: SpanKind.SERVER }, (root) => {
  for (let i = 0; i < n - 1; i++) {
    const attributes = { "chip.id": `gpu:${i % 4}`, "op.flops": i * 1000, rank: i % 4, "user.tag": "js" };
    if (i % 5 === 0) attributes["chip.id"] = `tpu:${i % 3}`; // no chip type this names
    const span = tracer.startSpan(`op${i % 3}`, { attributes });
    if (i % 10 === 0) span.addEvent("checkpoint", { step: i });
    span.end();
  }
  root.end();
});
await provider.forceFlush();
const finished = memory.getFinishedSpans(); // shutdown empties the memory exporter
await provider.shutdown();

const ns = ([s, n]) => (BigInt(s) * 1000000000n + BigInt(n)).toString();
const spans = finished.map((s) => ({
  trace_id: s.spanContext().traceId,
  span_id: s.spanContext().spanId,
  parent: s.parentSpanContext?.spanId ?? null,
  name: s.name,
  kind: s.kind,
  start: ns(s.startTime),
  end: ns(s.endTime),
  attributes: s.attributes,
  events: s.events.map((e) => e.name),
}));
process.stdout.write(JSON.stringify({ spans, exports }));
