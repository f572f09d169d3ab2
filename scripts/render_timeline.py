#!/usr/bin/env python3
"""Draws a few steps of a mnist_train --timeline trace as a PNG: two rows per rank (compute and
communication; a GPU trace adds the compute stream), each event coloured by its kind, each
layer's backward marked inside the backward bar and each bucket's ready time marked on the
communication row, so that a reader sees the bucket allreduces overlapping backward.

Usage: scripts/render_timeline.py TRACE.json OUT.png [--first-step S] [--steps N] [--title T]
  --first-step  the first step drawn (default: the middle of the run, past the warm-up)
  --steps       how many steps (default 3)
matplotlib is a documentation-only dependency: when this python3 cannot import it, the script
runs itself again with /usr/bin/python3, first installing Debian's python3-matplotlib with
apt-get (apt-get update first) if that one cannot import it either.
"""
import argparse
import collections
import json
import os
import subprocess
import sys


SYSTEM_PYTHON = "/usr/bin/python3"  # where Debian's python3-matplotlib is importable


def system_python_has_matplotlib():
    return os.path.exists(SYSTEM_PYTHON) and subprocess.run(
        [SYSTEM_PYTHON, "-c", "import matplotlib"], capture_output=True).returncode == 0


def import_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Another python3 first on PATH (pyenv, a venv) does not see Debian's packages: run this
        # script again with the system's, installing python3-matplotlib there when needed.
        if os.environ.get("RENDER_TIMELINE_REEXEC"):
            sys.exit("render_timeline: matplotlib cannot be imported even by " + sys.executable)
        if not system_python_has_matplotlib():
            print("render_timeline: installing python3-matplotlib (apt-get)", file=sys.stderr)
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "python3-matplotlib"], check=True,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        os.execve(SYSTEM_PYTHON, [SYSTEM_PYTHON] + sys.argv,
                  dict(os.environ, RENDER_TIMELINE_REEXEC="1"))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


COLOURS = {
    "step": "#eeeeee", "data": "#9e9e9e", "forward": "#4c72b0", "backward": "#55a868",
    "layer_backward": "#2e7d32", "grad_wait": "#c44e52", "optimizer": "#8172b2",
    "allreduce": "#dd8452", "param_average": "#dd8452", "evaluation": "#64b5cd",
    "checkpoint": "#937860",
}
LABELS = {
    "data": "data (the batch)", "forward": "forward + loss", "backward": "backward",
    "layer_backward": "one layer's backward", "grad_wait": "waiting for gradients (exposed)",
    "optimizer": "optimizer", "allreduce": "bucket allreduce", "param_average": "parameter average",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--first-step", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    plt = import_matplotlib()

    with open(args.trace, encoding="utf-8") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    steps = sorted({e["args"]["step"] for e in events if e.get("cat") == "step"})
    if not steps:
        sys.exit(f"render_timeline: {args.trace} holds no step events")
    first = args.first_step if args.first_step is not None else steps[len(steps) // 2]
    window = set(range(first, first + args.steps))
    shown = [e for e in events if e["args"].get("step") in window
             and e.get("cat") not in ("evaluation", "checkpoint")]
    if not shown:
        sys.exit(f"render_timeline: no events in steps {sorted(window)}")
    begin = min(e["ts"] for e in shown)
    end = max(e["ts"] + e.get("dur", 0) for e in shown)
    to_ms = lambda us: (us - begin) / 1000.0  # noqa: E731

    rows = sorted({(e["pid"], e["tid"]) for e in shown} | {k for k in threads if k[1] in (0, 1)})
    rows = [r for r in rows if r[0] in {e["pid"] for e in shown}]
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(14, 1.1 * len(rows) + 1.6))
    used = collections.OrderedDict()
    for e in sorted(shown, key=lambda e: (e.get("cat") != "step", -e.get("dur", 0))):
        y = y_of[(e["pid"], e["tid"])]
        cat = e.get("cat", "")
        if e["ph"] == "i":  # a bucket's ready time: a tick on the same rank's communication row
            comm_y = y_of.get((e["pid"], 1), y)
            ax.plot([to_ms(e["ts"])] * 2, [comm_y - 0.42, comm_y - 0.28], color="black", lw=1)
            used["ready"] = None
            continue
        x, w = to_ms(e["ts"]), e["dur"] / 1000.0
        if cat == "step":
            ax.barh(y, w, left=x, height=0.96, color=COLOURS["step"], edgecolor="#bbbbbb", lw=0.5)
            ax.text(x + 0.005 * (to_ms(end)), y + 0.36, f"step {e['args']['step']}", fontsize=7,
                    va="center", color="#555555")
            continue
        if cat == "layer_backward":  # inside the backward bar, lower half, one block per layer
            ax.barh(y - 0.17, w, left=x, height=0.3, color=COLOURS[cat], edgecolor="white", lw=0.6)
        else:
            ax.barh(y, w, left=x, height=0.64, color=COLOURS.get(cat, "#cccccc"),
                    edgecolor="white", lw=0.4)
            if cat == "allreduce" and w > 0.04 * to_ms(end) / args.steps:
                ax.text(x + w / 2, y, str(e["args"].get("bucket", "")), fontsize=6, ha="center",
                        va="center", color="white")
        used[cat] = None
    ax.set_yticks([y_of[r] for r in rows])
    ax.set_yticklabels([f"rank {p} {threads.get((p, t), 'thread %d' % t)}" for p, t in rows])
    ax.set_xlabel("ms (rank 0's clock; other ranks aligned by the offsets in the trace)")
    ax.set_xlim(0, to_ms(end))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    handles = [Patch(color=COLOURS[c], label=LABELS.get(c, c)) for c in used if c in COLOURS]
    if "ready" in used:
        handles.append(Line2D([0], [0], color="black", lw=1, label="bucket ready (backward done)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28 if len(rows) < 4
              else -0.16), ncol=5, fontsize=8, frameon=False)
    ax.set_title(args.title or f"{os.path.basename(args.trace)}: steps {first}-{first + args.steps - 1}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"render_timeline: wrote {args.out} (steps {first}-{first + args.steps - 1}, "
          f"{len(shown)} events)")


if __name__ == "__main__":
    main()
