"""Recording: a span from the program's call to the writer's Arrow batches, in one place.

The path a span takes, module by module (the public surface stays `chiptrace.api`,
`chiptrace.lifecycle` and `chiptrace.recorder`; these modules are their internals):

1. tags (`sites.tags`): a decorator's or `span()`'s chip, link, op and precision, checked
   once and interned by value, so the same four strings are the same `Tags` object.
2. site (`sites.site`): (name, tags, kind) numbered once; a span's constant part is then a
   small int.
3. span while it runs: a `with span(...)` block's `Span` (`spans`), a decorated call's
   `Live` tuple (`live`) made by a wrapper compiled for its function (`wrappers`), a
   GPU-timed one (`device`); the ids, the context, the span limits.
4. row, when it ends: a plain row of ints `(site, trace hi, trace lo, span id, parent,
   start, end)`, a site row (the same, then the attributes flat: keys, then values), or a general row
   (events, links, a status; `rows`). One list append into the recorder's chunk.
5. writer (`chiptrace.recorder` buffers the chunks and runs the writer thread): `fastrows`
   turns plain and site rows into Arrow a slice at a time, `rows` checks general rows per
   span, `writer` hands the batches to the sinks (the store first), `sink_queue` runs every
   other sink on its own thread, `otel_sinks` adapts OpenTelemetry SpanExporters, and
   `exit_hooks` keeps exit and SIGTERM meaning what they mean.

`traceparent` reads the parent process's W3C context, which a root span here continues.

Loading the package binds the compiled wrappers to what they read and call: the process
state `spans` keeps current and `live`'s functions (`wrappers.bind`, once, here). Only
`spans`, `live`, `wrappers` and `sites` load with `import chiptrace`; NumPy and pyarrow load
with `fastrows`, `rows` and `writer`, on the writer's side.
"""

from __future__ import annotations

from chiptrace.recording import live, spans, wrappers

# The one binding: the compiled @trace wrappers' globals are the state spans keeps
# current, plus the functions live gives them to call.
wrappers.bind(spans.WRAPPER_GLOBALS, **live.bindings())
spans.on_globals_change(wrappers.refresh)
