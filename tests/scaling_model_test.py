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

    def test_local_sgd_pays_one_average_every_h_steps(self):
        p = profile([(2**19, 1.0), (2**19, 2.0)])
        topo = {"kind": "flat", "link": self.link}
        got = sm.strategy_step(p, 4, "local-sgd", topo, every=8)
        self.assertEqual(got, 5.75 + 1000 * sm.ring_seconds(2**20, 4, self.link) / 8)


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
        self.assertEqual(fit["bandwidth_bytes_per_s"], float("inf"))
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
        for part in ("forward_ms", "backward_ms", "optimizer_ms"):
            self.assertGreater(p[part], 0.0)
        self.assertEqual(p["steps_used"], 8 - 3)
        # with no overlap and no communication cost the model gives the profile's compute
        self.assertAlmostEqual(sm.simulate_step(p, lambda b: 0.0, False)["step_ms"],
                               sm.compute_ms(p), delta=1e-9)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
