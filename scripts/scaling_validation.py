#!/usr/bin/env python3
"""The rows and the report of scripts/validate_scaling_model.sh (which documents the files).

  scaling_validation.py rows WORK RATE DELAY "RANKS" "MODELS"      CSV rows on stdout
  scaling_validation.py report CSV STAMP DATA SKIPPED      markdown on stdout
  (STAMP: when and at which commit the run was; SKIPPED: one line per configuration not run)

WORK holds prof-RATE-DELAY-MODEL-N.profile (compute profiles), bench-RATE-DELAY-N-spinS.csv
(allreduce_bench sweeps) and meas-RATE-DELAY-MODEL-N-OVERLAP-rK.json (the measured runs'
timelines, one per round K).
"""
import csv
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_model as sm  # noqa: E402

TARGET = 0.15  # the bound on every row's relative error
NAMES = {"mlp": "mlp 784-500-500-10", "cnn": "cnn", "wide": "mlp 784-4096-4096-10"}


def rows(work, rate, delay, ranks, models):
    """One CSV row per N, model and overlap: measured and predicted step."""
    out = csv.writer(sys.stdout)
    ranks = [int(r) for r in ranks.split()]

    def sweep(n, spin):
        return sm.read_bench_csv(os.path.join(work, f"bench-{rate}-{delay}-{n}-spin{spin}.csv"))
    for n in ranks:
        for model in models.split():
            profile = json.load(open(os.path.join(work, f"prof-{rate}-{delay}-{model}-{n}.profile")))
            sizes = [b["bytes"] for b in profile["buckets"]]
            for overlap in ("on", "off"):
                # the link as the engine that runs the buckets waits: its own thread's short
                # spin while overlapping, the main thread's default otherwise
                spin = 50 if overlap == "on" else 1000
                own = sm.fit_link_for_buckets(sweep(n, spin), sizes)
                every = sm.fit_link_for_buckets(sum((sweep(m, spin) for m in ranks), []), sizes)
                paths = sorted(glob.glob(os.path.join(
                    work, f"meas-{rate}-{delay}-{model}-{n}-{overlap}-r*.json")))
                measured = sm.measured_step_ms([(json.load(open(p)), p) for p in paths])

                # every rank on this one machine
                overlapped = sm.overlap_runs(overlap == "on", n, len(os.sched_getaffinity(0)))

                def predict(link):
                    return sm.simulate_step(profile, lambda b: sm.ring_seconds(b, n, link),
                                            overlapped)["step_ms"]
                p_own, p_every = predict(own), predict(every)
                out.writerow([rate, delay, n, model, overlap, f"{measured:.3f}",
                              f"{sm.compute_ms(profile):.3f}", f"{p_own:.3f}",
                              f"{(p_own - measured) / measured:.4f}", f"{p_every:.3f}",
                              f"{(p_every - measured) / measured:.4f}",
                              f"{own['alpha_s'] * 1e6:.1f}",
                              f"{own['bandwidth_bytes_per_s'] / 1e9:.4f}",
                              f"{own['sizes'][0]}-{own['sizes'][-1]}",
                              f"{own['max_fit_error']:.3f}"])


def comm_cells(row):
    """The part of the step the model predicted (step less the profile's compute), measured
    and predicted, and its relative error ("-" where the measured part is under 5% of the step:
    noise in the compute, not communication)."""
    measured = float(row["measured_ms"]) - float(row["compute_ms"])
    predicted = float(row["predicted_ms"]) - float(row["compute_ms"])
    cells = f"{measured:.2f} / {predicted:.2f}"
    if measured < 0.05 * float(row["measured_ms"]):
        return cells + " | -"
    return cells + f" | {(predicted - measured) / measured * 100:+.0f}%"


def size_range(text):
    lo, hi = (int(x) for x in text.split("-"))
    return f"{human(lo)}-{human(hi)}"


def human(nbytes):
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def report(csv_path, stamp, data, skipped):
    table = list(csv.DictReader(open(csv_path)))
    md = ["## The step model against the emulated cluster\n",
          f"- Run: {stamp}; data `{data}`; {len(os.sched_getaffinity(0))} cores",
          "- Command: `scripts/validate_scaling_model.sh` (as root); one thread per rank, "
          "per-rank batch 128, SGD momentum 0.9",
          "- Measured: the median step of rank 0's `--timeline` (steps 3 and later of every "
          "run; rounds alternate the overlap-on and -off runs) on the emulated cluster (`scripts/netns_cluster.sh`, one namespace per rank, Open MPI over TCP)",
          "- Predicted: `scripts/scaling_model.py` from two measured inputs only, both taken "
          "on the same cluster: the compute profile (data, forward, backward, each bucket's "
          "ready time, optimizer; medians of steps 3 and later, each step's slowest rank) of the "
          "same model at the same N from the `--overlap off` runs, whose communication (the "
          "wait for the gradients) is not used, so that an overlap-off row tests the "
          "communication's model and an overlap-on row the whole event model; and the link "
          "(alpha per ring step, bandwidth) fitted to an `allreduce_bench` sweep (16 KiB to "
          "16 MiB, 3 repeats) on the sizes around the model's buckets, the sweep waiting as the "
          "engine that runs the buckets waits (`--spin-us 50`, the overlap thread's, for "
          "overlap on; the library's 1 ms for overlap off). The last two columns fit one link "
          "to the sweeps of every N of the rate at once.",
          "- Since an overlap-off row's compute is the profile's own, its step error is the "
          "communication's error diluted by compute; the columns `communication ms` give the "
          "part the model had to predict (step less the profile's compute: the exposed "
          "communication, and what the model adds) and its own error.",
          "- Compute sharing the 2 cores: with N ranks on 2 cores each rank computes on a share "
          "of them (N = 3, 4 oversubscribe). The profile is measured with the same N ranks "
          "computing at once on the same cluster, so it carries that sharing as measured; the "
          "model adds no factor of its own. With more ranks than cores (N = 3, 4 here) every core "
          "runs some rank's backward while backward lasts, so the overlap thread gets a core "
          "only when backward's threads wait: the model then starts the buckets after backward, "
          "at the overlap thread's link cost (`scaling_model.overlap_runs`; a rule added after "
          "a first run here showed overlap gaining nothing at N = 3 and 4). So only the N = 2 "
          "overlap-on rows test the overlap itself. What no input carries is the "
          "communication's own CPU work (TCP in the kernel) taking cycles from backward.\n"]
    md.append("### Steps\n")
    md.append("| rate | delay | ranks | model | overlap | measured ms | profile's compute ms | "
              "link of this N: alpha, bandwidth (sizes fitted, worst row) | predicted ms | error | "
              "communication ms, measured / predicted | its error | "
              "predicted ms, one link for every N | error |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = worst_joint = 0.0
    for r in table:
        err, err_joint = float(r["error"]), float(r["error_one_link"])
        worst = max(worst, abs(err))
        worst_joint = max(worst_joint, abs(err_joint))
        md.append(f"| {r['rate']} | {r['delay']} | {r['ranks']} | {NAMES.get(r['model'], r['model'])} | "
                  f"{r['overlap']} | {float(r['measured_ms']):.2f} | {float(r['compute_ms']):.2f} | "
                  f"{float(r['alpha_us']):.0f} us, {float(r['bandwidth_gbps']):.3f} GB/s "
                  f"({size_range(r['fit_rows'])}, {float(r['fit_error']) * 100:.0f}%) | "
                  f"{float(r['predicted_ms']):.2f} | {err * 100:+.1f}% | "
                  f"{comm_cells(r)} | "
                  f"{float(r['predicted_one_link_ms']):.2f} | {err_joint * 100:+.1f}% |")
    md.append("")
    for line in (s for s in skipped.splitlines() if s.strip()):
        md.append(f"- Not measured: {line}")
    md.append("")
    over = [r for r in table if abs(float(r["error"])) > TARGET]
    if table:
        md.append(f"Rows above {TARGET * 100:.0f}%: " + ("; ".join(
            f"{r['rate']} {r['ranks']} ranks {r['model']} overlap {r['overlap']} "
            f"({float(r['error']) * 100:+.1f}%)" for r in over) if over else "none") + ".\n")
        md.append(f"With one link fitted over every N: max relative error {worst_joint * 100:.1f}%.\n")
        md.append(f"max relative error {worst * 100:.1f}% ({len(table)} rows, link of each N)")
    else:
        md.append("max relative error: no rows measured")
    print("\n".join(md))


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "rows":
        rows(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "report":
        report(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
