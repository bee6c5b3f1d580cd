"""Chrome / Perfetto trace JSON of a simulation (open in https://ui.perfetto.dev or chrome://tracing).

Layout: one process ("layerpipe"), one thread track per processor (`M` metadata events name and order
them), one complete (`X`) slice per op named like `F3.7`, with args task, layer (or stage), iteration and
the weight version it read (−1 when it reads none). Time unit: one cycle is shown as one microsecond (the
format's unit). Every cross-processor dependency is a flow arrow (`s` at the producer's end on its track,
`f` at the consumer's start, binding to the enclosing slice; one per producer/consumer pair) when the run
has at most `max_flows` of
them; larger runs leave the arrows out to keep the file small.

The bytes are deterministic: events in processor then program order, keys in a fixed order, no
timestamps of the run itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from layerpipe.sim._report import SimResult

#: Above this many cross-processor dependencies the trace carries no flow arrows.
MAX_FLOWS = 20_000


def trace_events(result: SimResult, max_flows: int = MAX_FLOWS) -> list[dict[str, object]]:
    """The trace's events, metadata first."""
    unit = "layer" if result.schedule.level == "layer" else "stage"
    events: list[dict[str, object]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "layerpipe"}},
    ]
    for p in range(result.num_procs):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": p, "args": {"name": f"p{p}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": p, "args": {"sort_index": p}})
    start, end, versions = result.start.tolist(), result.end.tolist(), result.versions.tolist()
    for i, op in enumerate(result.ops):
        events.append({
            "name": str(op), "cat": op.kind, "ph": "X", "pid": 0, "tid": op.proc,
            "ts": start[i], "dur": end[i] - start[i],
            "args": {"task": op.kind, unit: op.unit, "iteration": op.iteration, "version": versions[i]},
        })
    compiled = result._compiled
    if compiled is None:
        return events
    proc = np.asarray(compiled.proc, dtype=np.int64)
    producer, consumer, pair_words = compiled.pairs
    cross = np.flatnonzero(proc[producer] != proc[consumer])
    if len(cross) > max_flows:
        return events
    for flow_id, k in enumerate(cross.tolist()):
        i, j = int(producer[k]), int(consumer[k])
        words = int(pair_words[k])
        events.append({"name": "transfer", "cat": "transfer", "ph": "s", "id": flow_id, "pid": 0,
                       "tid": int(proc[i]), "ts": end[i] - 1 if end[i] > start[i] else end[i],
                       "args": {"words": words}})
        events.append({"name": "transfer", "cat": "transfer", "ph": "f", "bp": "e", "id": flow_id, "pid": 0,
                       "tid": int(proc[j]), "ts": start[j], "args": {"words": words}})
    return events


def trace_json(result: SimResult, max_flows: int = MAX_FLOWS) -> str:
    """The trace as a JSON document (deterministic text)."""
    doc = {"displayTimeUnit": "ns", "otherData": {"time_unit": "cycle", **result.config.describe()},
           "traceEvents": trace_events(result, max_flows)}
    return json.dumps(doc, separators=(",", ":")) + "\n"


def write_trace(result: SimResult, path: str | Path, max_flows: int = MAX_FLOWS) -> None:
    from layerpipe._files import write_atomic

    write_atomic(path, trace_json(result, max_flows))
