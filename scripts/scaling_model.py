#!/usr/bin/env python3
"""The step model: what one data-parallel step costs at N ranks, from measured parts.

Inputs (docs/scaling-model.md lists where each comes from):
  - a compute profile: one step's data, forward, backward and optimizer times and, for each
    gradient bucket, its size and when backward completed it (ms after backward began), read
    from a `mnist_train --timeline` trace (`profile`), or written by hand for a model not run;
  - a link: per-message latency alpha (s) and bandwidth (bytes/s), fitted to an
    `allreduce_bench --csv` sweep (`fit-link`) or stated (then labelled assumed);
  - the reduction's speed (bytes/s of one operand added), when it is not already inside the
    fitted bandwidth.

The step, event by event (simulate_step): data and forward; backward begins; bucket k becomes
ready at its time; one communication engine takes the buckets strictly in order, each as soon
as it is ready and the one before it is done (overlap), or all after backward (no overlap); the
optimizer starts when backward and the last bucket are both done. Each allreduce costs what its
algorithm costs (allreduce_seconds): the ring 2(N-1) latencies plus 2(N-1)/N of the bytes at
link bandwidth plus (N-1)/N of them through the reduction; two-level (nodes x GPUs per node)
a reduce-scatter and an allgather inside the node around a ring across nodes of 1/G of the
bytes; parameter servers with S servers and local SGD every H steps beside it (strategy_step).

Usage:
  scaling_model.py profile TRACE.json [TRACE.json ...] [--skip 3] [--rank 0|slowest] > PROFILE.json
  scaling_model.py fit-link BENCH.csv [BENCH.csv ...] [--min-bytes 65536] > LINK.json
  scaling_model.py predict PROFILE.json LINK.json --ranks 2 [--overlap on|off]
"""
import argparse
import json
import math
import statistics
import sys


class InputError(Exception):
    """Bad input: the message names the file and what to do."""


# ---------------------------------------------------------------- compute profile (timeline)

def step_parts(trace, source="trace", skip=3, rank=0):
    """Each kept step of a timeline: {part: ms} and its buckets' ready times (ms from the step's
    backward start) and sizes. skip: the first steps of the trace left out (the first touches
    every page; the next ones warm caches), counted from the trace's first step, so that a
    resumed run's trace is treated alike. rank: whose steps; SLOWEST: in each step, the rank
    whose backward ended last (the ranks' clocks are aligned in the trace), the one every ring
    waits for. A GPU step's phases are the compute stream's (tid 2), timed by CUDA events; the
    host lane's spans of such a rank (the batch's upload queued, the next batch prefetched while
    the GPU computes) are then not the step's parts."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise InputError(f"{source}: not a Chrome trace (no traceEvents list); "
                         "pass the file mnist_train --timeline wrote")
    for rank_info in (trace.get("otherData") or {}).get("clock_alignment", []):
        if rank_info.get("dropped_events"):
            raise InputError(f"{source}: rank {rank_info.get('rank')} dropped "
                             f"{rank_info['dropped_events']} events (the timeline's store was "
                             "full): trace fewer --steps")
    steps = {}  # step -> rank -> events
    for e in events:
        if e.get("ph") not in ("X", "i") or not isinstance(e.get("pid"), int):
            continue
        if rank != SLOWEST and e["pid"] != rank:
            continue
        step = (e.get("args") or {}).get("step", -1)
        if step is None or step < 0:
            continue
        steps.setdefault(step, {}).setdefault(e["pid"], []).append(e)
    kept = []
    for s in sorted(steps)[skip:]:
        candidates = []
        for events_of_rank in steps[s].values():
            on_device = any(e.get("tid") == GPU_COMPUTE_STREAM for e in events_of_rank)
            by_cat = {}
            for e in events_of_rank:
                if on_device and e.get("cat") in PHASES and e.get("tid") != GPU_COMPUTE_STREAM:
                    continue
                by_cat.setdefault(e.get("cat"), []).append(e)
            if "step" not in by_cat or "backward" not in by_cat:
                continue
            parts = {k: sum(e.get("dur", 0.0) for e in by_cat.get(k, [])) / 1000.0 for k in PARTS}
            # The last backward: under --accumulate-steps the buckets become ready in the last
            # pass.
            last_backward = max(by_cat["backward"], key=lambda e: e["ts"])
            backward_begin = last_backward["ts"]
            try:
                buckets = {e["args"]["bucket"]: ((e["ts"] - backward_begin) / 1000.0,
                                                 e["args"]["elements"])
                           for e in by_cat.get("bucket_ready", [])}
            except (KeyError, TypeError):
                raise InputError(f"{source}: a bucket_ready event without args.bucket and "
                                 "args.elements; pass a trace mnist_train --timeline wrote")
            backward_end = last_backward["ts"] + last_backward.get("dur", 0.0)
            candidates.append((backward_end, parts, buckets))
        if candidates:
            _, parts, buckets = max(candidates, key=lambda c: c[0])
            kept.append((parts, buckets))
    if not kept:
        who = "any rank" if rank == SLOWEST else f"rank {rank}"
        raise InputError(f"{source}: {who} has no complete step (step and backward spans) "
                         f"after the first {skip}; run more --steps")
    return kept


GPU_COMPUTE_STREAM = 2  # TraceLane::kComputeStream
PHASES = ("data", "forward", "backward", "grad_wait", "optimizer")
SLOWEST = "slowest"
PARTS = ("step", "data", "forward", "backward", "optimizer", "grad_wait")


def profile_from_traces(traces, skip=3, rank=0):
    """The median step of one rank's timelines (a list of (trace, source)), as the model's
    compute profile: each part the median over every kept step of every trace, separately, so
    that one slow step or run moves nothing. A trace without bucket instants (one rank:
    nothing to average) gives no buckets, and the caller must supply them."""
    steps = []
    for trace, source in traces:
        steps += step_parts(trace, source, skip, rank)
    med = {k: statistics.median(parts[k] for parts, _ in steps) for k in PARTS}
    # What the step spends outside the parts named (the step's own bookkeeping, the NaN guard
    # ...): kept as measured, since it recurs every step.
    other = max(0.0, med["step"] - med["data"] - med["forward"] - med["backward"]
                - med["grad_wait"] - med["optimizer"])
    layout = steps[0][1]
    buckets = []
    for b in sorted(layout):
        elements = layout[b][1]
        ready = [bk[b][0] for _, bk in steps if b in bk]
        buckets.append({"elements": elements, "bytes": 4 * elements,
                        "ready_ms": statistics.median(ready)})
    return {
        "source": ", ".join(source for _, source in traces),
        "rank": rank,
        "steps_used": len(steps),
        "measured_step_ms": med["step"],
        "data_ms": med["data"],
        "forward_ms": med["forward"],
        "backward_ms": med["backward"],
        "optimizer_ms": med["optimizer"],
        "other_ms": other,
        "measured_grad_wait_ms": med["grad_wait"],
        "buckets": buckets,
    }


def profile_from_trace(trace, source="trace", skip=3, rank=0):
    return profile_from_traces([(trace, source)], skip, rank)


def measured_step_ms(traces, skip=3, rank=0):
    """The median step time over every kept step of the traces ((trace, source) pairs), the
    steps left out as in the profile."""
    return statistics.median(parts["step"] for trace, source in traces
                             for parts, _ in step_parts(trace, source, skip, rank))


# ---------------------------------------------------------------- link (allreduce_bench)

def read_bench_csv(path, backend="ring"):
    import csv
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror}); pass an allreduce_bench --csv file")
    need = {"size_bytes", "ranks", "time_us", "backend"}
    if not rows or not need <= set(rows[0]):
        raise InputError(f"{path}: not an allreduce_bench --csv file (need columns "
                         f"{', '.join(sorted(need))})")
    return [(int(r["ranks"]), int(r["size_bytes"]), float(r["time_us"]) * 1e-6)
            for r in rows if r["backend"] == backend]


def fit_link(samples, min_bytes=0, reduce_bytes_per_s=None):
    """Least-squares alpha (s) and bandwidth (bytes/s) of the ring's cost over (N, bytes, s).

    The ring's time is 2(N-1) alpha + 2(N-1)/N bytes / bandwidth [+ (N-1)/N bytes / reduce];
    with reduce_bytes_per_s None the reduction is inside the fitted bandwidth (allreduce_bench
    times both together). Samples under min_bytes are left out. Each residual is divided by
    its row's time, so that the fit is good in relative terms at every size (an unweighted fit
    would serve only the largest).
    """
    rows = [(n, b, t) for n, b, t in samples if n > 1 and b >= min_bytes]
    if len(rows) < 2:
        raise InputError("fit-link: need at least two rows with ranks > 1 (run allreduce_bench "
                         "over several sizes)")
    # minimise sum ((x1 a + x2 c - y) / t)^2, a = alpha, c = 1/bandwidth
    s11 = s12 = s22 = s1y = s2y = 0.0
    targets = []  # (x1, x2, y, t)
    for n, b, t in rows:
        y = t
        if reduce_bytes_per_s:
            y -= (n - 1) / n * b / reduce_bytes_per_s
        w = 1.0 / (t * t)
        x1, x2 = 2.0 * (n - 1), 2.0 * (n - 1) / n * b
        s11 += w * x1 * x1
        s12 += w * x1 * x2
        s22 += w * x2 * x2
        s1y += w * x1 * y
        s2y += w * x2 * y
        targets.append((x1, x2, y, t))
    det = s11 * s22 - s12 * s12
    if det <= 1e-12 * s11 * s22:  # collinear: one size and one N, or nearly
        raise InputError("fit-link: the sizes do not separate latency from bandwidth; "
                         "sweep sizes over at least a factor of 4")
    # Non-negative least squares in two unknowns: the free minimum if both are >= 0, else the
    # better of the two edges (no latency; no bandwidth term: a link whose time does not grow
    # with size over the rows fitted, as Open MPI's TCP path at small sizes can be).
    candidates = []
    alpha = (s22 * s1y - s12 * s2y) / det
    inv_bw = (s11 * s2y - s12 * s1y) / det
    if alpha >= 0 and inv_bw > 0:
        candidates.append((alpha, inv_bw))
    else:
        if s2y > 0:
            candidates.append((0.0, s2y / s22))
        if s1y > 0:
            candidates.append((s1y / s11, 0.0))

    def weighted_error(cand):
        return sum((x1 * cand[0] + x2 * cand[1] - y) ** 2 / (t * t) for x1, x2, y, t in targets)
    if not candidates:
        raise InputError("fit-link: the rows give neither a positive latency nor a positive "
                         "bandwidth; the sweep is too noisy or too small")
    alpha, inv_bw = min(candidates, key=weighted_error)
    # None: no bandwidth term (JSON has no infinity)
    link = {"alpha_s": alpha, "bandwidth_bytes_per_s": 1.0 / inv_bw if inv_bw > 0 else None,
            "reduce_bytes_per_s": reduce_bytes_per_s, "rows": len(rows)}
    link["max_fit_error"] = max(abs(ring_seconds(b, n, link) - t) / t for n, b, t in rows)
    return link


def fit_link_for_buckets(samples, bucket_bytes, min_sizes=3):
    """fit_link on the sweep rows around the sizes the buckets have: from half the smallest to
    twice the largest, widened to the nearest sizes (in ratio) until min_sizes sizes take part.

    A link is rarely latency plus bytes over bandwidth over three orders of magnitude (Open
    MPI's TCP path on one machine is not: docs/scaling-model.md); fitted where the buckets are,
    the line is the link's cost where the model uses it.
    """
    if not bucket_bytes:
        raise InputError("fit-link: no buckets to fit around")
    lo, hi = min(bucket_bytes) / 2, 2 * max(bucket_bytes)
    sizes = sorted({b for _, b, _ in samples})
    chosen = {b for b in sizes if lo <= b <= hi}

    def distance(b):
        return math.log(lo / b) if b < lo else math.log(b / hi)
    for b in sorted((b for b in sizes if b not in chosen), key=distance):
        if len(chosen) >= min_sizes:
            break
        chosen.add(b)
    link = fit_link([row for row in samples if row[1] in chosen])
    link["sizes"] = sorted(chosen)
    return link


# ---------------------------------------------------------------- algorithms' costs

def ring_seconds(nbytes, n, link):
    """One ring allreduce of nbytes over n ranks: scatter-reduce then allgather."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    t = 2 * (n - 1) * link["alpha_s"]
    if link["bandwidth_bytes_per_s"]:  # None: a link without a bandwidth term (fit_link)
        t += 2 * (n - 1) / n * nbytes / link["bandwidth_bytes_per_s"]
    if link.get("reduce_bytes_per_s"):
        t += (n - 1) / n * nbytes / link["reduce_bytes_per_s"]
    return t


def two_level_seconds(nbytes, nodes, per_node, intra, inter):
    """Reduce-scatter inside each node (ring over its per_node GPUs), a ring across nodes of
    each GPU's 1/per_node shard (every GPU through its own NIC, as on an 8-NIC H200 node), an
    allgather inside the node. Half a ring inside = (G-1) alpha + (G-1)/G bytes / bw."""
    g = per_node
    t = 0.0
    if g > 1:
        half = (g - 1) * intra["alpha_s"] + (g - 1) / g * nbytes / intra["bandwidth_bytes_per_s"]
        t += 2 * half
        if intra.get("reduce_bytes_per_s"):
            t += (g - 1) / g * nbytes / intra["reduce_bytes_per_s"]
    t += ring_seconds(nbytes / g, nodes, inter)
    return t


def allreduce_seconds(nbytes, n, topology):
    """topology: {"kind": "flat", "link": L}, {"kind": "flat-over-nodes", ...} (one ring over
    every rank of nodes of G: the intra link up to G ranks, the inter link above) or
    {"kind": "two-level", "per_node": G, "intra": L, "inter": L}. Two-level: up to G ranks are one node's ring; above, ceil(N / G)
    nodes, each costed as a full node of G."""
    if topology["kind"] == "flat":
        return ring_seconds(nbytes, n, topology["link"])
    g = topology["per_node"]
    if n <= g:
        return ring_seconds(nbytes, n, topology["intra"])
    if topology["kind"] == "flat-over-nodes":
        # one ring over every rank: each step waits for its slowest hops, those between nodes
        return ring_seconds(nbytes, n, topology["inter"])
    nodes = math.ceil(n / g)
    return two_level_seconds(nbytes, nodes, g, topology["intra"], topology["inter"])


def ps_seconds(nbytes, workers, servers, link):
    """Synchronous parameter servers: every worker pushes its gradient (1/S to each server)
    and pulls the new parameters back; a server's link carries workers x nbytes / S each way,
    a worker's nbytes each way. The slower of the two sets the time (full duplex links); a
    worker's S pushes (and pulls) are in flight at once, so one latency each way; a server
    adds the workers' shards (workers x nbytes / S through the reduction)."""
    if workers <= 0:
        return 0.0
    per_link = max(nbytes, workers * nbytes / servers)
    t = 2 * link["alpha_s"]
    if link["bandwidth_bytes_per_s"]:
        t += 2 * per_link / link["bandwidth_bytes_per_s"]
    if link.get("reduce_bytes_per_s"):
        t += workers * nbytes / servers / link["reduce_bytes_per_s"]
    return t


# ---------------------------------------------------------------- one step, event by event

def simulate_step(profile, comm_seconds, overlap=True):
    """The step's time in ms and its timeline of buckets.

    comm_seconds(bytes): one bucket's allreduce. Returns {"step_ms", "comm_ms", "exposed_ms",
    "buckets": [(ready, start, end) ms from the step's start]}.
    """
    t_backward = profile["data_ms"] + profile["forward_ms"]
    t_backward_end = t_backward + profile["backward_ms"]
    engine_free = t_backward if overlap else t_backward_end
    timeline = []
    comm_ms = 0.0
    for b in profile["buckets"]:
        ready = t_backward + b["ready_ms"] if overlap else t_backward_end
        start = max(ready, engine_free)
        cost = 1000.0 * comm_seconds(b["bytes"])
        end = start + cost
        timeline.append((ready, start, end))
        comm_ms += cost
        engine_free = end
    grads_done = max(t_backward_end, engine_free)
    exposed = grads_done - t_backward_end
    step = grads_done + profile["optimizer_ms"] + profile["other_ms"]
    return {"step_ms": step, "comm_ms": comm_ms, "exposed_ms": exposed, "buckets": timeline}


def overlap_runs(overlap, ranks_on_machine, cores):
    """Whether the overlap engine's buckets can start while backward runs. With more ranks on
    a machine than it has cores, every core is busy with some rank's backward while backward
    lasts, and a communication thread gets one only when backward's threads wait: the model
    then starts the buckets after backward (still at the overlap thread's link cost)."""
    return overlap and ranks_on_machine <= cores


def compute_ms(profile):
    return (profile["data_ms"] + profile["forward_ms"] + profile["backward_ms"]
            + profile["optimizer_ms"] + profile["other_ms"])


def strategy_step(profile, n, strategy, topology, overlap=True, servers=1, every=1,
                  averaged_copies=1):
    """Step ms at n ranks: strategy "ring" (buckets over the allreduce, overlapped or not),
    "ps" (S parameter servers, synchronous: push and pull after backward, as ringtrain's ps
    does), "local-sgd" (no gradient averaging; the parameters and the optimizer's state,
    averaged_copies times the parameters' bytes in all (2 for SGD with momentum, 3 for Adam:
    LocalSgd::average averages every state buffer), averaged by one allreduce every `every`
    steps after the optimizer, so 1/every of it per step)."""
    if n <= 1:
        return compute_ms(profile)
    total = sum(b["bytes"] for b in profile["buckets"])
    if strategy == "ring":
        return simulate_step(profile, lambda nb: allreduce_seconds(nb, n, topology), overlap)["step_ms"]
    link = topology["link"] if topology["kind"] == "flat" else topology["inter"]  # servers' NICs
    if strategy == "ps":
        return compute_ms(profile) + 1000.0 * ps_seconds(total, n, servers, link)
    if strategy == "local-sgd":
        averaged = averaged_copies * total
        return compute_ms(profile) + 1000.0 * allreduce_seconds(averaged, n, topology) / every
    raise ValueError(f"unknown strategy {strategy}")


# ---------------------------------------------------------------- command line

def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as err:
        raise InputError(f"{path}: cannot read {what} ({err.strerror})")
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err}); pass the {what} this script wrote")


PROFILE_KEYS = ("data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms", "buckets")


def require(obj, path, what, keys):
    missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
    if missing:
        raise InputError(f"{path}: not a {what} (lacks {', '.join(missing)}); write one with "
                         f"scaling_model.py {'profile' if what == 'profile' else 'fit-link'}")


def rank_arg(text):
    if text == SLOWEST:
        return SLOWEST
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank number or '{SLOWEST}', got '{text}'")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile", help="a compute profile from a mnist_train --timeline trace")
    p.add_argument("trace", nargs="+")
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--rank", default=0, type=rank_arg,
                   help="whose steps: a rank, or 'slowest' (each step, the rank the ring waits "
                        "for: the longest data + forward + backward)")
    f = sub.add_parser("fit-link", help="latency and bandwidth from allreduce_bench --csv files")
    f.add_argument("csv", nargs="+")
    f.add_argument("--min-bytes", type=int, default=0)
    f.add_argument("--backend", default="ring")
    q = sub.add_parser("predict", help="one step's time at --ranks")
    q.add_argument("profile")
    q.add_argument("link")
    q.add_argument("--ranks", type=int, required=True)
    q.add_argument("--overlap", choices=["on", "off"], default="on")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "profile":
            out = profile_from_traces([(load_json(t, "trace"), t) for t in a.trace], a.skip, a.rank)
        elif a.cmd == "fit-link":
            samples = []
            for path in a.csv:
                samples += read_bench_csv(path, a.backend)
            out = fit_link(samples, a.min_bytes)
        else:
            prof = load_json(a.profile, "profile")
            link = load_json(a.link, "link")
            require(prof, a.profile, "profile", PROFILE_KEYS)
            require(link, a.link, "link", ("alpha_s", "bandwidth_bytes_per_s"))
            out = simulate_step(prof, lambda nb: ring_seconds(nb, a.ranks, link), a.overlap == "on")
    except InputError as err:
        print(f"scaling_model.py: {err}", file=sys.stderr)
        return 3
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
