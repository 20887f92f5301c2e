"""A real OTLP receiver for tests and benchmarks, run as its own process.

    python3 otlp_receiver.py [--out FILE] [--fail-first N] [--no-parse]

Listens on 127.0.0.1 with OTLP/HTTP (POST /v1/traces, protobuf, gzip) and OTLP/gRPC
(opentelemetry-proto's generated TraceService servicer), on ephemeral ports it prints as
one JSON line: {"http": PORT, "grpc": PORT}. Every request body (decompressed) is appended
to FILE as a 4-byte little-endian length and the bytes. GET /stats returns counters and the
headers seen. `--fail-first N` answers the first N HTTP requests 503 and the first N gRPC
calls UNAVAILABLE (to test retries); `--fail-after N` fails every request after N good ones.
Stops on SIGTERM or when stdin closes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import struct
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class State:
    def __init__(self, out: str | None, fail_first: int, parse: bool, fail_after: int = -1) -> None:
        self.fail_after = fail_after
        self.lock = threading.Lock()
        self.out = open(out, "ab") if out else None  # noqa: SIM115 - held for the process
        self.fail_left = {"http": fail_first, "grpc": fail_first}
        self.parse = parse
        self.stats = {
            "requests": 0,
            "spans": 0,
            "failed": 0,
            "bytes": 0,
            "headers": [],
            "encodings": [],
        }

    def should_fail(self, kind: str) -> bool:
        with self.lock:
            if 0 <= self.fail_after <= self.stats["requests"]:
                self.stats["failed"] += 1
                return True
            if self.fail_left[kind] > 0:
                self.fail_left[kind] -= 1
                self.stats["failed"] += 1
                return True
            return False

    def take(self, body: bytes, headers: dict[str, str], encoding: str) -> None:
        spans = 0
        if self.parse:
            req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            spans = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.stats["requests"] += 1
            self.stats["spans"] += spans
            self.stats["bytes"] += len(body)
            if len(self.stats["headers"]) < 5:
                self.stats["headers"].append(headers)
                self.stats["encodings"].append(encoding)
            if self.out:
                self.out.write(struct.pack("<I", len(body)) + body)
                self.out.flush()


def http_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            with state.lock:
                data = json.dumps(state.stats).encode()
            self._reply(200, data, "application/json")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/traces":
                self._reply(404, b"not found", "text/plain")
                return
            if state.should_fail("http"):
                self._reply(503, b"try later", "text/plain")
                return
            encoding = self.headers.get("Content-Encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            state.take(body, {k.lower(): v for k, v in self.headers.items()}, encoding)
            resp = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self._reply(200, resp, "application/x-protobuf")

    return Handler


class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, state: State) -> None:
        self.state = state

    def Export(self, request, context):  # noqa: N802 - the generated servicer's name
        if self.state.should_fail("grpc"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "try later")
        headers = {k: v for k, v in context.invocation_metadata() if not k.startswith("grpc-")}
        self.state.take(request.SerializeToString(), headers, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--no-parse", action="store_true")
    ap.add_argument(
        "--fail-after", type=int, default=-1, help="503 every request after N good ones"
    )
    args = ap.parse_args()
    state = State(args.out, args.fail_first, not args.no_parse, args.fail_after)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), http_handler(state))
    httpd.daemon_threads = True
    gserver = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(state), gserver)
    gport = gserver.add_insecure_port("127.0.0.1:0")
    gserver.start()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(json.dumps({"http": httpd.server_address[1], "grpc": gport}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stop.wait()
    gserver.stop(0)
    httpd.shutdown()


if __name__ == "__main__":
    main()
