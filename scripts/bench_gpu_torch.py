#!/usr/bin/env python3
"""PyTorch eager baseline for ringtrain's GPU benchmark (scripts/gpu_check.sh).

Trains the models of `mnist_train --model mlp|cnn` (scripts/torch_common.py's definitions:
mlp 784-500-500-10 ReLU; cnn conv3x3 1->8 ReLU maxpool conv3x3 8->16 ReLU maxpool dense
784->10; mlp-wide = mlp with --hidden 4096,4096) with SGD (lr 0.01, momentum 0.9 by default,
as scripts/bench_speed.sh) on one device, in PyTorch eager mode: no torch.compile, no CUDA
graphs, no AMP, PyTorch's default precision settings (which are printed).

Data: the real MNIST training arrays (IDX .gz from --data-dir) as uint8, copied to the device
once before timing, as ringtrain's GPU path is asked to do; --synthetic uses random uint8
images and labels of the same shape instead. Each step, as scripts/torch_common.train_step:
index a batch through a per-epoch permutation made on the device, convert to float and divide
by 255, forward, mean softmax cross-entropy, backward, optimizer step. No host sync inside a
step (loss.item() is never called while timing): the best case for PyTorch.

Timing: --warmup untimed steps per configuration, then --reps timed windows of --steps steps
(or, by default, as many steps as fill --seconds / --reps, sized from a short calibration),
each window bracketed by torch.cuda.synchronize(); the median window is reported.

Output (stdout): CSV with a header line, one row per configuration; '#' lines on stderr
describe the environment. gpu_mem_mib is the device's memory in use (total - free, the CUDA
context and the training data included) after the timed windows, less --idle-mem-mib.
  scripts/bench_gpu_torch.py --device cuda --configs mlp:128,cnn:128,mlp-wide:128
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import blas_info, load_split, make_model, train_step  # noqa: E402

MODELS = {"mlp": ("mlp", (500, 500)), "cnn": ("cnn", None), "mlp-wide": ("mlp", (4096, 4096))}
DEFAULT_CONFIGS = "mlp:128,mlp:512,cnn:128,cnn:512,mlp-wide:128,mlp-wide:512"
CSV_FIELDS = ["framework", "device", "model", "batch", "data", "warmup", "steps", "reps",
              "images_per_sec", "step_ms", "min_images_per_sec", "max_images_per_sec",
              "last_loss", "params", "gpu_mem_mib"]


def parse_configs(text):
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            name, batch = item.split(":")
            batch = int(batch)
        except ValueError:
            raise SystemExit(f"--configs: {item!r} is not MODEL:BATCH") from None
        if name not in MODELS or batch <= 0:
            raise SystemExit(f"--configs: {item!r}: model must be one of {sorted(MODELS)}, "
                             "batch a positive integer")
        out.append((name, batch))
    if not out:
        raise SystemExit("--configs: nothing to run")
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(model, opt, x, y, perm_state, batch, count):
    """count training steps; perm_state = [perm, pos, generator] carries the epoch position."""
    n = x.shape[0]
    steps_per_epoch = n // batch  # the last partial batch is dropped, as ringtrain does
    loss = None
    for _ in range(count):
        if perm_state[1] % steps_per_epoch == 0:
            perm_state[0] = torch.randperm(n, device=x.device, generator=perm_state[2])
            perm_state[1] = 0
        pos = perm_state[1]
        idx = perm_state[0][pos * batch:(pos + 1) * batch]
        loss = train_step(model, opt, x, y, idx)
        perm_state[1] += 1
    return loss


def bench_one(name, batch, x, y, args, device):
    if device.type == "cuda":  # the previous configuration's cached blocks are not this one's
        torch.cuda.empty_cache()
    kind, hidden = MODELS[name]
    torch.manual_seed(args.seed)
    model = make_model(kind, hidden) if hidden else make_model(kind)
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    state = [None, 0, gen]
    run_steps(model, opt, x, y, state, batch, args.warmup)
    sync(device)
    steps = args.steps
    if steps <= 0:  # size the windows from a short calibration
        calib = 10
        t0 = time.perf_counter()
        run_steps(model, opt, x, y, state, batch, calib)
        sync(device)
        per_step = max((time.perf_counter() - t0) / calib, 1e-6)
        steps = int(min(max(args.seconds / args.reps / per_step, 20), args.max_steps))
    rates = []
    loss = None
    for _ in range(args.reps):
        sync(device)
        t0 = time.perf_counter()
        loss = run_steps(model, opt, x, y, state, batch, steps)
        sync(device)
        rates.append(steps * batch / (time.perf_counter() - t0))
    med = statistics.median(rates)
    gpu_mem = ""
    if device.type == "cuda":  # the device's memory in use now, context included, less idle
        free, total = torch.cuda.mem_get_info(device)
        gpu_mem = f"{(total - free) / 2**20 - args.idle_mem_mib:.0f}"
    return {
        "framework": "pytorch", "device": str(device), "model": name, "batch": batch,
        "data": args.data_label, "warmup": args.warmup, "steps": steps, "reps": args.reps,
        "images_per_sec": f"{med:.1f}", "step_ms": f"{batch * 1000.0 / med:.4f}",
        "min_images_per_sec": f"{min(rates):.1f}", "max_images_per_sec": f"{max(rates):.1f}",
        "last_loss": f"{loss.item():.4f}" if loss is not None else "",
        "params": sum(p.numel() for p in model.parameters()),
        "gpu_mem_mib": gpu_mem,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"MODEL:BATCH list, MODEL in mlp, cnn, mlp-wide (default {DEFAULT_CONFIGS})")
    p.add_argument("--data-dir", default=os.environ.get("RINGTRAIN_DATA", ""),
                   help="MNIST IDX .gz directory (train-images-idx3-ubyte.gz, ...)")
    p.add_argument("--synthetic", action="store_true",
                   help="random uint8 images/labels of MNIST's shape instead of --data-dir")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps per configuration")
    p.add_argument("--steps", type=int, default=0,
                   help="steps per timed window (default 0: sized to fill --seconds)")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="timed seconds per configuration, all windows together (default 2)")
    p.add_argument("--max-steps", type=int, default=200000, help="cap on steps per window")
    p.add_argument("--reps", type=int, default=3, help="timed windows per configuration")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--idle-mem-mib", type=float, default=0.0,
                   help="the device's memory in use before this program started (nvidia-smi), "
                        "subtracted from the gpu_mem_mib column")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--no-header", action="store_true", help="omit the CSV header line")
    args = p.parse_args()
    if args.reps < 1 or args.warmup < 0:
        raise SystemExit("--reps must be >= 1 and --warmup >= 0")

    configs = parse_configs(args.configs)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"# bench_gpu_torch: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 77
    torch.set_num_threads(args.threads)

    if args.synthetic:
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randint(0, 256, (60000, 1, 28, 28), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 10, (60000,), dtype=torch.uint8, generator=g)
        args.data_label = "synthetic"
    else:
        if not args.data_dir:
            raise SystemExit("--data-dir (or $RINGTRAIN_DATA) or --synthetic is required")
        x, y = load_split(args.data_dir, "train")
        args.data_label = "mnist-idx"
    x, y = x.to(device), y.to(device)  # once, before any timing
    sync(device)

    info = [f"torch {torch.__version__}", f"device {device}"]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info += [f"gpu {props.name}", f"cuda {torch.version.cuda}",
                 f"cudnn {torch.backends.cudnn.version()}",
                 f"matmul.allow_tf32 {torch.backends.cuda.matmul.allow_tf32}",
                 f"cudnn.allow_tf32 {torch.backends.cudnn.allow_tf32}",
                 f"cudnn.benchmark {torch.backends.cudnn.benchmark}"]
        try:
            info.append(f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}")
        except Exception:  # noqa: BLE001 (a build without NCCL)
            pass
    else:  # test mode only: on a GPU the CPU's BLAS is not on the timed path
        info.append(f"threads {torch.get_num_threads()}")
        info.append(f"blas {blas_info()['desc']}")
    print("# bench_gpu_torch: " + "; ".join(info), file=sys.stderr, flush=True)
    print(f"# data: {args.data_label} {tuple(x.shape)} uint8 on {device}; SGD lr {args.lr} "
          f"momentum {args.momentum}; warmup {args.warmup}; reps {args.reps}", file=sys.stderr,
          flush=True)

    if not args.no_header:
        print(",".join(CSV_FIELDS), flush=True)
    for name, batch in configs:
        row = bench_one(name, batch, x, y, args, device)
        print(",".join(str(row[f]) for f in CSV_FIELDS), flush=True)
        print(f"# {name} batch {batch}: {float(row['images_per_sec']):,.0f} img/s "
              f"({row['steps']} steps x {args.reps})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
