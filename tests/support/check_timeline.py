#!/usr/bin/env python3
"""Checks a mnist_train --timeline file as Perfetto and chrome://tracing read it.

Usage: check_timeline.py TRACE.json RANKS NAME...
  - the file is JSON: {"traceEvents": [...], "displayTimeUnit": "ms"};
  - one process per rank 0..RANKS-1, named "rank r", with its threads named;
  - every "X" event has ts and dur; the X events of one thread nest (none overlaps another
    partially);
  - every bucket appears once per step on every rank, as "bucket k ready" (an "i" event) and
    "allreduce bucket k" (an "X" event), with ready <= started <= done;
  - every NAME is the name of an event of every rank.
Prints one line per finding and exits 1 if there was any, else prints a summary and exits 0.
"""
import collections
import json
import sys

# ts and dur are microseconds with three decimals: compare to the nanosecond.
TOLERANCE_US = 0.0015


def main():
    path, ranks, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    problems = []
    if trace.get("displayTimeUnit") != "ms":
        problems.append("displayTimeUnit is not ms")
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in range(ranks):
        if processes.get(rank) != f"rank {rank}":
            problems.append(f"no process named 'rank {rank}' (pid {rank}): {processes}")
    spans = collections.defaultdict(list)  # (pid, tid) -> [(begin, end, name)]
    named = collections.defaultdict(set)   # pid -> names
    ready = collections.defaultdict(list)  # (pid, step, bucket) -> [ts]
    reduce = collections.defaultdict(list)  # (pid, step, bucket) -> [(begin, end)]
    for e in events:
        if e["ph"] == "M":
            continue
        named[e["pid"]].add(e["name"])
        if (e["pid"], e["tid"]) not in threads:
            problems.append(f"event {e['name']} on an unnamed thread {e['pid']}/{e['tid']}")
        if e["ph"] == "X":
            spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] != "i":
            problems.append(f"unexpected phase {e['ph']}")
        key = (e["pid"], e["args"].get("step"), e["args"].get("bucket"))
        if e.get("cat") == "bucket_ready":
            ready[key].append(e["ts"])
        if e.get("cat") == "allreduce":
            reduce[key].append((e["ts"], e["ts"] + e["dur"]))
    for thread, items in spans.items():
        items.sort(key=lambda s: (s[0], -s[1]))
        open_spans = []
        for begin, end, name in items:
            while open_spans and begin >= open_spans[-1][1] - TOLERANCE_US:
                open_spans.pop()
            if open_spans and end > open_spans[-1][1] + TOLERANCE_US:
                problems.append(f"thread {thread}: {name} [{begin}, {end}) overlaps "
                                f"{open_spans[-1][2]} [{open_spans[-1][0]}, {open_spans[-1][1]}) "
                                "partially")
            open_spans.append((begin, end, name))
    for key in sorted(set(ready) | set(reduce), key=str):
        r, a = ready.get(key, []), reduce.get(key, [])
        if len(r) != 1 or len(a) != 1:
            problems.append(f"rank/step/bucket {key}: {len(r)} ready and {len(a)} allreduce events")
            continue
        if not r[0] <= a[0][0] + TOLERANCE_US <= a[0][1] + 2 * TOLERANCE_US:
            problems.append(f"rank/step/bucket {key}: ready {r[0]}, started {a[0][0]}, "
                            f"done {a[0][1]}: out of order")
    for rank in range(ranks):
        for name in names:
            if name not in named[rank]:
                problems.append(f"rank {rank} has no event named '{name}'")
    for problem in problems[:20]:
        print("timeline:", problem)
    if problems:
        return 1
    print(f"timeline ok: {len(events)} events, {len(processes)} processes, "
          f"{len(reduce)} bucket allreduces")
    return 0


if __name__ == "__main__":
    sys.exit(main())
