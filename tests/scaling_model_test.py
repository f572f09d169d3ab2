#!/usr/bin/env python3
"""scripts/scaling_model.py (docs/scaling-model.md): the step's events against cases worked by
hand, the algorithms' costs against their closed forms, the link fit recovering the alpha and
bandwidth its samples were made from, and a compute profile read from a real trace.

Usage: scaling_model_test.py [TRACE.json PARAMS]   (TRACE: a 2-rank mlp run with --timeline
       --overlap off; PARAMS: the model's parameter count; both given by scaling_model_test.sh)
Exact comparisons only where the arithmetic is exact in binary (the cases use values that are);
elsewhere a relative 1e-12, far above double rounding of a few operations and far below any
modelling difference.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

here = os.path.dirname(os.path.abspath(__file__))
scripts = os.path.join(here, "..", "scripts")
sys.path.insert(0, scripts)
import scaling_model as sm  # noqa: E402

TRACE = sys.argv[1] if len(sys.argv) > 2 else None
PARAMS = int(sys.argv[2]) if len(sys.argv) > 2 else None
REL = 1e-12


def profile(buckets, data=0.5, forward=1.0, backward=4.0, optimizer=0.25, other=0.0):
    return {"data_ms": data, "forward_ms": forward, "backward_ms": backward,
            "optimizer_ms": optimizer, "other_ms": other,
            "buckets": [{"bytes": b, "elements": b // 4, "ready_ms": r} for b, r in buckets]}


class StepEvents(unittest.TestCase):
    def test_no_overlap_adds_every_bucket_after_backward(self):
        p = profile([(1000, 1.0), (3000, 4.0)])
        cost = lambda b: b / 1e6  # seconds: 1 ms and 3 ms  # noqa: E731
        r = sm.simulate_step(p, cost, overlap=False)
        # 0.5 + 1 + 4 (backward) + 1 + 3 (buckets) + 0.25
        self.assertEqual(r["step_ms"], 9.75)
        self.assertEqual(r["exposed_ms"], 4.0)
        self.assertEqual(r["buckets"], [(5.5, 5.5, 6.5), (5.5, 6.5, 9.5)])

    def test_overlap_hides_what_backward_outlasts(self):
        # buckets ready 1 ms and 2 ms into a 4 ms backward, 0.5 ms each: all hidden
        p = profile([(500, 1.0), (500, 2.0)])
        r = sm.simulate_step(p, lambda b: b / 1e6, overlap=True)
        self.assertEqual(r["step_ms"], 0.5 + 1 + 4 + 0.25)
        self.assertEqual(r["exposed_ms"], 0.0)
        self.assertEqual(r["buckets"], [(2.5, 2.5, 3.0), (3.5, 3.5, 4.0)])

    def test_the_engine_takes_buckets_in_order_and_queues(self):
        # 2 ms each: bucket 1 is ready at 3.5 but waits for bucket 0 until 4.5; done at 6.5,
        # one ms after backward's end at 5.5
        p = profile([(2000, 1.0), (2000, 2.0)])
        r = sm.simulate_step(p, lambda b: b / 1e6, overlap=True)
        self.assertEqual(r["buckets"], [(2.5, 2.5, 4.5), (3.5, 4.5, 6.5)])
        self.assertEqual(r["exposed_ms"], 1.0)
        self.assertEqual(r["step_ms"], 6.5 + 0.25)

    def test_one_rank_is_compute(self):
        p = profile([(4096, 1.0)], other=0.125)
        topo = {"kind": "flat", "link": {"alpha_s": 1e-3, "bandwidth_bytes_per_s": 1e6}}
        for strategy in ("ring", "ps", "local-sgd"):
            self.assertEqual(sm.strategy_step(p, 1, strategy, topo), 0.5 + 1 + 4 + 0.25 + 0.125)


    def test_no_core_for_the_overlap_thread_serialises(self):
        self.assertTrue(sm.overlap_runs(True, 2, 2))
        self.assertFalse(sm.overlap_runs(True, 3, 2))
        self.assertFalse(sm.overlap_runs(False, 1, 64))


class Costs(unittest.TestCase):
    link = {"alpha_s": 2.0**-10, "bandwidth_bytes_per_s": 2.0**20, "reduce_bytes_per_s": None}

    def test_ring_closed_form(self):
        # N = 4, 2^20 bytes: 6 alpha + 6/4 x 1 s
        self.assertEqual(sm.ring_seconds(2**20, 4, self.link), 6 * 2.0**-10 + 1.5)
        self.assertEqual(sm.ring_seconds(2**20, 1, self.link), 0.0)
        with_reduce = dict(self.link, reduce_bytes_per_s=2.0**21)
        self.assertEqual(sm.ring_seconds(2**20, 4, with_reduce), 6 * 2.0**-10 + 1.5 + 0.75 * 0.5)

    def test_two_level_of_one_gpu_per_node_is_the_flat_ring(self):
        for n in (2, 3, 8, 100):
            flat = sm.ring_seconds(3e6, n, self.link)
            self.assertAlmostEqual(sm.two_level_seconds(3e6, n, 1, self.link, self.link), flat,
                                   delta=REL * flat)

    def test_two_level_closed_form(self):
        intra = {"alpha_s": 1e-6, "bandwidth_bytes_per_s": 1e11}
        inter = {"alpha_s": 1e-5, "bandwidth_bytes_per_s": 1e10}
        n, g, m = 8e6, 8, 4
        want = 2 * (7 * 1e-6 + 7 / 8 * n / 1e11) + 2 * 3 * 1e-5 + 2 * 3 / 4 * (n / 8) / 1e10
        got = sm.allreduce_seconds(n, g * m, {"kind": "two-level", "per_node": g,
                                              "intra": intra, "inter": inter})
        self.assertAlmostEqual(got, want, delta=REL * want)
        # within one node it is the node's ring
        got = sm.allreduce_seconds(n, 8, {"kind": "two-level", "per_node": g, "intra": intra,
                                          "inter": inter})
        self.assertEqual(got, sm.ring_seconds(n, 8, intra))

    def test_parameter_servers(self):
        # 8 workers, 2 servers: each server's link carries 4 gradients each way
        self.assertEqual(sm.ps_seconds(2**20, 8, 2, self.link), 2 * 2.0**-10 + 2 * 4.0)
        # more servers than workers: a worker's own link is the limit
        self.assertEqual(sm.ps_seconds(2**20, 2, 4, self.link), 2 * 2.0**-10 + 2 * 1.0)
        # a server adds its workers' shards: 8 x 2^20 / 2 bytes at 2^22 bytes/s = 1 s
        with_reduce = dict(self.link, reduce_bytes_per_s=2.0**22)
        self.assertEqual(sm.ps_seconds(2**20, 8, 2, with_reduce), 2 * 2.0**-10 + 2 * 4.0 + 1.0)

    def test_local_sgd_pays_one_average_every_h_steps(self):
        p = profile([(2**19, 1.0), (2**19, 2.0)])
        topo = {"kind": "flat", "link": self.link}
        got = sm.strategy_step(p, 4, "local-sgd", topo, every=8)
        self.assertEqual(got, 5.75 + 1000 * sm.ring_seconds(2**20, 4, self.link) / 8)
        # with momentum the state is averaged too: twice the bytes
        got = sm.strategy_step(p, 4, "local-sgd", topo, every=8, averaged_copies=2)
        self.assertEqual(got, 5.75 + 1000 * sm.ring_seconds(2**21, 4, self.link) / 8)


class LinkFit(unittest.TestCase):
    def test_recovers_alpha_and_bandwidth(self):
        truth = {"alpha_s": 37e-6, "bandwidth_bytes_per_s": 1.1e9}
        samples = [(n, b, sm.ring_seconds(b, n, truth)) for n in (2, 3, 4)
                   for b in (65536, 262144, 1 << 20, 1 << 22, 1 << 24)]
        fit = sm.fit_link(samples)
        self.assertAlmostEqual(fit["alpha_s"], truth["alpha_s"], delta=1e-9 * truth["alpha_s"])
        self.assertAlmostEqual(fit["bandwidth_bytes_per_s"], truth["bandwidth_bytes_per_s"],
                               delta=1e-9 * truth["bandwidth_bytes_per_s"])
        self.assertLess(fit["max_fit_error"], 1e-9)

    def test_min_bytes_leaves_small_rows_out(self):
        truth = {"alpha_s": 0.0, "bandwidth_bytes_per_s": 1e8}
        samples = [(2, b, sm.ring_seconds(b, 2, truth)) for b in (1 << 20, 1 << 22, 1 << 24)]
        samples.append((2, 4096, 1.0))  # a wild small row
        fit = sm.fit_link(samples, min_bytes=1 << 20)
        self.assertEqual(fit["rows"], 3)
        self.assertAlmostEqual(fit["bandwidth_bytes_per_s"], 1e8, delta=1e-3)

    def test_a_time_that_falls_with_size_is_fitted_as_latency_alone(self):
        # the free minimum has a negative bandwidth term; the non-negative fit is the flat line
        samples = [(3, 16384, 3e-3), (3, 32768, 2e-3), (3, 65536, 1e-3)]
        fit = sm.fit_link(samples)
        self.assertIsNone(fit["bandwidth_bytes_per_s"])  # no bandwidth term
        self.assertGreater(fit["alpha_s"], 0.0)
        # the weighted least-squares constant of 1/t weights: sum(1/t) / sum(1/t^2), over 4 steps
        ts = [t for _, _, t in samples]
        want = sum(1 / t for t in ts) / sum(1 / (t * t) for t in ts) / 4
        self.assertAlmostEqual(fit["alpha_s"], want, delta=REL * want)

    def test_fit_around_the_buckets_uses_the_sizes_nearby(self):
        truth = {"alpha_s": 1e-5, "bandwidth_bytes_per_s": 1e8}
        samples = [(2, 1 << k, sm.ring_seconds(1 << k, 2, truth)) for k in range(12, 26)]
        samples.append((2, 1 << 12, 1.0))  # wild, but far from the buckets
        fit = sm.fit_link_for_buckets(samples, [1 << 20, 3 << 20])
        self.assertEqual(fit["sizes"], [1 << 19, 1 << 20, 1 << 21, 1 << 22])  # 512 KiB to 6 MiB
        self.assertAlmostEqual(fit["alpha_s"], 1e-5, delta=1e-9 * 1e-5)
        # one bucket: widened to three sizes, the nearest in ratio
        fit = sm.fit_link_for_buckets(samples, [1 << 24])
        self.assertEqual(len(fit["sizes"]), 3)
        self.assertIn(1 << 24, fit["sizes"])

    def test_too_few_rows_are_refused(self):
        with self.assertRaises(sm.InputError):
            sm.fit_link([(2, 4096, 1e-3)])


def span(pid, cat, ts, dur, step, tid=0, **args):
    return {"name": cat, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "ph": "X", "dur": dur,
            "args": dict(step=step, **args)}


def ready(pid, ts, step, bucket, elements, tid=0):
    return {"name": "ready", "cat": "bucket_ready", "pid": pid, "tid": tid, "ts": ts, "ph": "i",
            "args": {"step": step, "bucket": bucket, "elements": elements}}


def cpu_step(pid, step, t0, backward_us):
    """One CPU step in microseconds: data 100, forward 1000, backward, grad_wait 500,
    optimizer 200; bucket 0 ready a quarter into backward."""
    b0 = t0 + 1100
    end = b0 + backward_us + 500 + 200
    return [span(pid, "step", t0, end - t0, step), span(pid, "data", t0, 100, step),
            span(pid, "forward", t0 + 100, 1000, step), span(pid, "backward", b0, backward_us, step),
            ready(pid, b0 + backward_us / 4, step, 0, 1000),
            span(pid, "grad_wait", b0 + backward_us, 500, step),
            span(pid, "optimizer", b0 + backward_us + 500, 200, step)]


class Traces(unittest.TestCase):
    def test_slowest_rank_is_the_one_whose_backward_ends_last(self):
        events = []
        for step in range(5):
            t0 = step * 10000
            # rank 1's backward is longer in odd steps only
            events += cpu_step(0, step, t0, 2000)
            events += cpu_step(1, step, t0, 4000 if step % 2 else 2000)
        trace = {"traceEvents": events}
        p0 = sm.profile_from_trace(trace, "t", skip=0, rank=0)
        self.assertEqual(p0["backward_ms"], 2.0)
        slow = sm.profile_from_trace(trace, "t", skip=0, rank=sm.SLOWEST)
        # steps 0..4: backward 2, 4, 2, 4, 2 ms: median 2; skip 1 leaves 4, 2, 4, 2: median 3
        self.assertEqual(slow["backward_ms"], 2.0)
        self.assertEqual(sm.profile_from_trace(trace, "t", skip=1, rank=sm.SLOWEST)["backward_ms"], 3.0)
        self.assertEqual(slow["buckets"], [{"elements": 1000, "bytes": 4000, "ready_ms": 0.5}])
        self.assertEqual((slow["data_ms"], slow["forward_ms"], slow["optimizer_ms"]), (0.1, 1.0, 0.2))

    def test_skip_counts_from_the_traces_first_step(self):
        # a resumed run's trace starts at step 100
        trace = {"traceEvents": sum((cpu_step(0, s, s * 10000, 1000 * (s - 99)) for s in range(100, 104)), [])}
        p = sm.profile_from_trace(trace, "t", skip=3)
        self.assertEqual(p["steps_used"], 1)
        self.assertEqual(p["backward_ms"], 4.0)

    def test_several_traces_pool_their_steps(self):
        a = {"traceEvents": sum((cpu_step(0, s, s * 10000, 1000) for s in range(4)), [])}
        b = {"traceEvents": sum((cpu_step(0, s, s * 10000, 3000) for s in range(6)), [])}
        p = sm.profile_from_traces([(a, "a"), (b, "b")], skip=3)
        self.assertEqual(p["steps_used"], 1 + 3)
        self.assertEqual(p["backward_ms"], 3.0)
        self.assertEqual(sm.measured_step_ms([(a, "a"), (b, "b")]), 1.1 + 3.0 + 0.7)

    def test_a_gpu_step_takes_the_compute_streams_phases(self):
        events = []
        for step in range(4):
            t0 = step * 10000
            events.append(span(0, "step", t0, 5000, step))
            # the host lane: queueing the batch, and the next batch prefetched meanwhile
            events.append(span(0, "data", t0, 50, step))
            events.append(span(0, "data", t0 + 100, 2000, step))
            # the compute stream (tid 2): the step's phases from CUDA events
            events += [span(0, "data", t0 + 60, 40, step, tid=2),
                       span(0, "forward", t0 + 100, 300, step, tid=2),
                       span(0, "backward", t0 + 400, 600, step, tid=2),
                       ready(0, t0 + 700, step, 0, 5000, tid=2),
                       span(0, "grad_wait", t0 + 1000, 100, step, tid=2),
                       span(0, "optimizer", t0 + 1100, 50, step, tid=2)]
        p = sm.profile_from_trace({"traceEvents": events}, "gpu", skip=1)
        self.assertEqual((p["data_ms"], p["forward_ms"], p["backward_ms"], p["optimizer_ms"]),
                         (0.04, 0.3, 0.6, 0.05))
        self.assertEqual(p["buckets"][0]["ready_ms"], 0.3)

    def test_a_trace_that_dropped_events_is_refused(self):
        trace = {"traceEvents": cpu_step(0, 0, 0, 1000),
                 "otherData": {"clock_alignment": [{"rank": 1, "dropped_events": 7}]}}
        with self.assertRaisesRegex(sm.InputError, "rank 1 dropped 7"):
            sm.profile_from_trace(trace, "t", skip=0)


class Cli(unittest.TestCase):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, os.path.join(scripts, "scaling_model.py"), *args],
                              capture_output=True, text=True)

    def test_refuses_a_file_that_is_not_a_trace_naming_it(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"not": "a trace"}, f)
        try:
            r = self.run_cli("profile", f.name)
            self.assertEqual(r.returncode, 3)
            self.assertIn(f.name, r.stderr)
            self.assertIn("traceEvents", r.stderr)
        finally:
            os.remove(f.name)

    def test_predict_refuses_a_profile_without_its_parts_naming_it(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"alpha_s": 1e-5, "bandwidth_bytes_per_s": 1e9}, f)
        try:
            r = self.run_cli("predict", f.name, f.name, "--ranks", "2")
            self.assertEqual(r.returncode, 3)
            self.assertIn(f"{f.name}: not a profile", r.stderr)
        finally:
            os.remove(f.name)

    def test_refuses_a_csv_that_is_not_a_bench_naming_it(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("a,b\n1,2\n")
        try:
            r = self.run_cli("fit-link", f.name)
            self.assertEqual(r.returncode, 3)
            self.assertIn(f.name, r.stderr)
        finally:
            os.remove(f.name)


@unittest.skipIf(TRACE is None, "no trace given (scaling_model_test.sh gives one)")
class RealTrace(unittest.TestCase):
    def test_profile_of_a_real_run(self):
        with open(TRACE) as f:
            p = sm.profile_from_trace(json.load(f), TRACE, skip=3)
        # every parameter is in exactly one bucket
        self.assertEqual(sum(b["elements"] for b in p["buckets"]), PARAMS)
        self.assertEqual(sum(b["bytes"] for b in p["buckets"]), 4 * PARAMS)
        # buckets become ready in order, inside backward
        ready = [b["ready_ms"] for b in p["buckets"]]
        self.assertEqual(ready, sorted(ready))
        self.assertGreaterEqual(ready[0], 0.0)
        self.assertLessEqual(ready[-1], p["backward_ms"] * 1.5)  # medians of separate steps
        # the mlp: two buckets, the last two dense layers (500x500 + 500x10 and biases) first
        self.assertEqual([b["elements"] for b in p["buckets"]],
                         [500 * 500 + 500 + 500 * 10 + 10, 784 * 500 + 500])
        for part in ("forward_ms", "backward_ms", "optimizer_ms"):
            self.assertGreater(p[part], 0.0)
        self.assertEqual(p["steps_used"], 8 - 3)
        # the parts named fit in the step measured (medians of separate parts, so with slack)
        named = p["data_ms"] + p["forward_ms"] + p["backward_ms"] + p["optimizer_ms"]
        self.assertLessEqual(named, p["measured_step_ms"] * 1.5)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
