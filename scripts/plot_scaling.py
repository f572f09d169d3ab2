#!/usr/bin/env python3
"""plot_scaling.py: the scaling benchmark's figure (docs/benchmarks-scaling.png) from its CSV
(docs/benchmarks-scaling.csv, written by scripts/bench_scaling.sh).

Usage: scripts/plot_scaling.py CSV OUT.png

One panel per model in the CSV (mlp batch 32, mlp batch 128, cnn batch 128, the wide mlp), on a
grid of two columns, all with the same x ticks (the rank counts in the CSV) and the same y range.
Y is the speedup: images/s at N ranks divided by the images/s of ringtrain on shared memory at
1 rank (its default, --overlap auto) of that model. The series of each panel:
  - ringtrain on shared memory, its default (--overlap auto);
  - PyTorch DDP on shared memory, against DDP's own 1-rank images/s (each framework's scaling);
  - ringtrain across each emulated network in the CSV (transport net-<rate>, --overlap auto),
    against the same shared-memory 1-rank baseline, starting from that point at 1 rank;
  - the ideal speedup, y = N (dashed grey).
Oversubscribed rank counts (the CSV's oversubscribed column is yes: more ranks than cores) are
shaded and their points drawn hollow. One legend below the panels.

The PNG is written to a temporary file in its folder and renamed over OUT.png, so a failed draw
leaves an older figure whole. matplotlib's font cache goes to a temporary folder removed at exit
(unless MPLCONFIGDIR names one). A CSV that is missing, empty, lacks a needed column or holds a
bad number is refused with a message naming it (exit 2), writing nothing.

matplotlib: Debian's python3-matplotlib. When this python3 cannot import it (pyenv, a venv), the
script runs itself again with /usr/bin/python3 if that one can; otherwise it says how to install
it and exits 3, writing nothing.
"""
import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile

SYSTEM_PYTHON = "/usr/bin/python3"  # where Debian's python3-matplotlib is importable
NO_MATPLOTLIB = 3  # the exit status when no python3 here can import matplotlib
BAD_INPUT = 2
PROG = "plot_scaling.py"

NEEDED = ("transport", "framework", "model", "ranks", "oversubscribed", "overlap",
          "images_per_sec")
NAMES = {"mlp32": "mlp, batch 32", "mlp128": "mlp, batch 128", "cnn128": "cnn, batch 128",
         "wide128": "mlp 4096,4096, batch 128"}
ORDER = list(NAMES)


def refuse(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(BAD_INPUT)


def can_import_matplotlib(python):
    # Found, not imported: importing it would make its config folder in HOME.
    return os.path.exists(python) and subprocess.run(
        [python, "-c", "import importlib.util, sys; "
         "sys.exit(importlib.util.find_spec('matplotlib') is None)"],
        capture_output=True).returncode == 0


def ensure_matplotlib(prog=PROG, reexec_flag="PLOT_SCALING_REEXEC"):
    """Runs this script (the one running, sys.argv) again under /usr/bin/python3 when this
    python3 has no matplotlib (and that one has), before any scratch folder is made; exits 3
    when none has it. reexec_flag: the environment variable that marks the second run."""
    import importlib.util
    if importlib.util.find_spec("matplotlib") is not None:
        return
    # Another python3 first on PATH does not see Debian's packages: try the system's.
    if not os.environ.get(reexec_flag) and can_import_matplotlib(SYSTEM_PYTHON):
        os.execve(SYSTEM_PYTHON, [SYSTEM_PYTHON] + sys.argv, dict(os.environ, **{reexec_flag: "1"}))
    print(f"{prog}: matplotlib cannot be imported by " + sys.executable +
          (" nor " + SYSTEM_PYTHON if sys.executable != SYSTEM_PYTHON else "") +
          ": install Debian's python3-matplotlib (apt-get install python3-matplotlib) "
          "and run this again", file=sys.stderr)
    sys.exit(NO_MATPLOTLIB)


def import_pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def read_rows(path):
    """The CSV's rows, with ranks as int and images_per_sec as float (None when empty)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames
            if not header:
                refuse(f"{path} is empty: expected the CSV of scripts/bench_scaling.sh "
                       f"(a header with {', '.join(NEEDED)})")
            missing = [c for c in NEEDED if c not in header]
            if missing:
                refuse(f"{path} lacks the column(s) {', '.join(missing)} (it has "
                       f"{', '.join(h for h in header if h) or 'none'}): is this the CSV of "
                       "scripts/bench_scaling.sh?")
            rows = []
            for r in reader:
                line = reader.line_num
                if not any((v or "").strip() for v in r.values() if isinstance(v, str)):
                    continue
                try:
                    r["ranks"] = int(r["ranks"])
                    value = (r["images_per_sec"] or "").strip()
                    r["images_per_sec"] = float(value) if value else None
                except (TypeError, ValueError):
                    refuse(f"{path}:{line}: ranks '{r['ranks']}' or images_per_sec "
                           f"'{r['images_per_sec']}' is not a number")
                if r["ranks"] < 1 or (r["images_per_sec"] is not None and
                                      not (math.isfinite(r["images_per_sec"]) and
                                           r["images_per_sec"] > 0)):
                    refuse(f"{path}:{line}: ranks {r['ranks']} or images_per_sec "
                           f"{r['images_per_sec']} out of range")
                rows.append(r)
    except OSError as error:
        refuse(f"{path}: {error.strerror or error}")
    except (csv.Error, UnicodeDecodeError) as error:
        refuse(f"{path}: not a readable CSV ({error})")
    if not rows:
        refuse(f"{path} holds a header but no rows: nothing to plot")
    return rows


def series_of(rows):
    """Per model: (title, baseline images/s or None, [(label, style, [(n, speedup, over)])])."""
    def ips(transport, framework, model, n, overlap):
        for r in rows:
            if (r["transport"], r["framework"], r["model"], r["ranks"], r["overlap"]) == \
                    (transport, framework, model, n, overlap):
                return r["images_per_sec"], r["oversubscribed"].strip() == "yes"
        return None, False

    models = [m for m in ORDER if any(r["model"] == m for r in rows)]
    models += sorted({r["model"] for r in rows} - set(models))
    ranks = sorted({r["ranks"] for r in rows})
    nets = sorted({r["transport"] for r in rows if r["transport"].startswith("net-")})
    panels = []
    for m in models:
        base, _ = ips("shm", "ringtrain", m, 1, "auto")
        ddp_base, _ = ips("shm", "pytorch-ddp", m, 1, "n/a")
        lines = []

        def points(transport, framework, overlap, reference):
            out = []
            for n in ranks:
                v, over = ips(transport, framework, m, n, overlap)
                if v is not None and reference:
                    out.append((n, v / reference, over))
            return out

        if base:
            lines.append(("ringtrain, shared memory (default: --overlap auto)", "rt",
                          points("shm", "ringtrain", "auto", base)))
        if ddp_base:
            lines.append(("PyTorch DDP, shared memory (vs its own 1 rank)", "ddp",
                          points("shm", "pytorch-ddp", "n/a", ddp_base)))
        if base:
            for net in nets:
                pts = [p for p in points(net, "ringtrain", "auto", base) if p[0] != 1]
                if pts:
                    pts = [(1, 1.0, False)] + pts  # from the shared-memory 1-rank point
                    lines.append((f"ringtrain, emulated network {net[4:]} (--overlap auto; 1 rank "
                                  "= shared memory's)", net, pts))
        lines = [line for line in lines if line[2]]
        panels.append((NAMES.get(m, m), base, lines))
    return ranks, panels


def draw(plt, csv_path, output):
    rows = read_rows(csv_path)
    ranks, panels = series_of(rows)
    if not any(lines for _, _, lines in panels):
        refuse(f"{csv_path}: no model has a 1-rank baseline (ringtrain on shm, overlap auto, "
               "or PyTorch DDP on shm at 1 rank): no speedup to plot")
    over_ranks = sorted({r["ranks"] for r in rows if r["oversubscribed"].strip() == "yes"})
    fitting = [n for n in ranks if n not in over_ranks]

    count = len(panels)
    columns = 1 if count == 1 else 2
    grid_rows = math.ceil(count / columns)
    # The legend below the panels: its entries (the series, the ideal line, the shading), in
    # two columns beside two panels, one below a single panel; its height reserved in inches.
    entries = len({label for _, _, lines in panels for label, _, _ in lines}) + 1 + \
        (1 if over_ranks else 0)
    legend_columns = 2 if columns == 2 else 1
    legend_rows = math.ceil(entries / legend_columns)
    legend_inches = 0.2 * legend_rows + 0.15
    width, height = max(5.6 * columns, 6.4), 3.6 * grid_rows + 1.0 + legend_inches
    fig, axes = plt.subplots(grid_rows, columns, figsize=(width, height),
                             sharex=True, sharey=True, squeeze=False)
    styles = {"rt": dict(color="#1f77b4", marker="o"), "ddp": dict(color="#d62728", marker="s")}
    net_colours = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
    top = max([max(ranks)] + [p[1] for _, _, lines in panels for _, _, pts in lines for p in pts])
    left, right = min(ranks) - 0.25, max(ranks) + 0.25
    handles = {}
    for index, (title, base, lines) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        if over_ranks:
            start = (max(n for n in fitting if n < min(over_ranks)) + min(over_ranks)) / 2 \
                if any(n < min(over_ranks) for n in fitting) else left
            shade = ax.axvspan(start, right + 0.5, color="0.85", alpha=0.6, lw=0, zorder=0)
            ax.text(start + 0.08, top * 1.08 * 0.97, "oversubscribed", ha="left", va="top",
                    fontsize=8, color="0.35", zorder=2)
            handles.setdefault("over", (shade, "oversubscribed: more ranks than cores "
                                        "(shaded, hollow markers)"))
        ideal, = ax.plot(ranks, ranks, linestyle="--", color="0.5", lw=1.2, zorder=1)
        handles.setdefault("ideal", (ideal, "ideal: speedup = ranks"))
        ends = []  # each series' last point, labelled with its speedup
        for label, key, pts in lines:
            if key.startswith("net-"):
                nets = sorted(k for k in {line[1] for _, _, ls in panels for line in ls}
                              if k.startswith("net-"))
                style = dict(color=net_colours[nets.index(key) % len(net_colours)], marker="^")
            else:
                style = styles[key]
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.8, ms=0,
                            color=style["color"], zorder=3)
            for n, y, over in pts:
                ax.plot([n], [y], linestyle="none", marker=style["marker"], ms=7, mew=1.6,
                        color=style["color"], markerfacecolor="white" if over else style["color"],
                        zorder=4)
            ends.append((pts[-1][1], pts[-1][0], style["color"]))
            if label not in handles:
                handles[label] = (plt.Line2D([], [], color=style["color"], marker=style["marker"],
                                             lw=1.8, ms=7), label)
        # The labels apart by at least a line of text, in the order of their points.
        gap, placed = top * 1.08 * 0.06, []
        for y, n, colour in sorted(ends):
            at = max([y] + [p + gap for p, m in placed if m == n])
            placed.append((at, n))
            ax.annotate(f"{y:.2f}x", (n, y), xytext=(n + 0.1, at), textcoords="data",
                        va="center", fontsize=8, color=colour)
        subtitle = f"1 rank: {base:,.0f} images/s" if base else "no ringtrain 1-rank baseline"
        ax.set_title(f"{title}  ({subtitle})", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left, right + 0.35)  # room for the last point's label
        ax.set_ylim(0, top * 1.08)
        ax.set_xticks(ranks)
        ax.tick_params(labelbottom=True)
    for index in range(count, grid_rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("ranks (one thread each)")
    for row in axes:
        row[0].set_ylabel("speedup vs ringtrain,\nshared memory, 1 rank")
    explained = ["speedup = images/s at N ranks / ringtrain's images/s at 1 rank",
                 "on shared memory (--overlap auto); PyTorch DDP: against its own 1 rank"]
    fig.suptitle("ringtrain scaling: speedup against ranks, per model\n" +
                 (" ".join(explained) if columns == 2 else "\n".join(explained)), fontsize=11)
    order = [k for k in handles if k not in ("ideal", "over")] + \
        [k for k in ("ideal", "over") if k in handles]
    fig.legend([handles[k][0] for k in order], [handles[k][1] for k in order],
               loc="lower center", ncol=legend_columns, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, legend_inches / height, 1, 1))

    write_atomically(output, lambda out: fig.savefig(out, format="png", dpi=100))
    plt.close(fig)
    return len(panels), sum(len(lines) for _, _, lines in panels)


def write_atomically(output, write):
    """write(binary file) into a fresh temporary beside output, then renamed over it: a link at
    output is replaced, not written through, and a failed write leaves the old file whole. The
    file gets the mode a plain open() would have given it."""
    folder, name = os.path.split(os.path.abspath(output))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.tmp-")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(temporary, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(temporary, output)
    except BaseException:
        os.unlink(temporary)
        raise


def main(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="the CSV of scripts/bench_scaling.sh")
    parser.add_argument("output", help="the PNG to write")
    args = parser.parse_args(argv)
    folder = os.path.dirname(os.path.abspath(args.output))
    if os.path.isdir(args.output):
        parser.error(f"{args.output} is a folder: name the PNG file to write")
    if not os.path.isdir(folder):
        parser.error(f"{args.output}: the folder {folder} does not exist")
    read_rows(args.csv)  # refuse a bad CSV before matplotlib is looked for
    ensure_matplotlib()
    scratch = None
    if not os.environ.get("MPLCONFIGDIR"):
        scratch = tempfile.mkdtemp(prefix="plot_scaling-")
        os.environ["MPLCONFIGDIR"] = scratch
    try:
        plt = import_pyplot()
        panels, lines = draw(plt, args.csv, args.output)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{PROG}: {args.output}: {panels} panel(s), {lines} series from {args.csv}")


if __name__ == "__main__":
    main(sys.argv[1:])
