"""Import and report on a Dask distributed cluster (`pip install 'chiptrace[dask]'`).

chiptrace builds no cluster of its own: past one machine, `chiptrace import --dask ADDRESS`
and `chiptrace report --dask ADDRESS` run their stages as tasks on an existing Dask
scheduler (or a LocalCluster: `--dask local --workers N`), the engine Nsight Systems'
multi-report recipes use. Every task reads and writes the trace dir on storage every worker
sees; the client moves only small results (a file's facts, a span count, a rank's figures).

- `client.py`: connecting (`CHIPTRACE_DASK_SCHEDULER`), checks before any task runs (the
  workers see the store; their versions match), the dashboard's address.
- `imports.py`: the import plan of chiptrace.importers.tasks on Dask futures.
- `reports.py`: the report's per-rank and per-step stages as Dask tasks.
"""

from __future__ import annotations
