#!/usr/bin/python3
"""PyTorch DistributedDataParallel baseline for ringtrain's scaling benchmark.

`--nproc N` spawns N processes itself (torch.multiprocessing.spawn; gloo backend on
127.0.0.1 with a free port), each with one thread (OMP_NUM_THREADS=1,
torch.set_num_threads(1)).  They train the same models as `mnist_train --model mlp|cnn`
(scripts/torch_common.py, shared with scripts/bench_torch.py) the way ringtrain's
data-parallel training does:

  * every rank holds the whole training set as uint8 tensors and draws the same shuffled
    permutation for each epoch from (seed, epoch); step s of an epoch takes the global
    indices [s*N*b, (s+1)*N*b) of it and rank r takes its b-slice [r*b, (r+1)*b)
    (the last partial global batch of an epoch is dropped);
  * each step: index, convert to float and divide by 255, forward, mean softmax
    cross-entropy, backward (DDP averages the gradients across ranks, overlapping the
    bucketed all-reduces with the backward pass), SGD with momentum;
  * DDP with its default settings (bucket_cap_mb 25) unless --bucket-cap-mb is given.

Only the --steps training steps after --warmup untimed steps are timed (time.perf_counter
around each step, summed per rank).  The time is the slowest rank's (an all_reduce MAX),
images/s = N*b*steps/time.  Rank 0 prints one JSON line:
  {"event":"summary","framework":"pytorch-ddp","backend":"gloo","world_size":N,...}

--check trains --check-steps steps with N ranks, then the same steps in one process with
batch N*b on the same samples, compares rank 0's final parameters with that reference
(max over tensors of max|ddp-ref|/max|ref| must be below 1e-4) and prints PASS or FAIL
(exit status 0 or 1).

Run with Debian's python3-torch:  /usr/bin/python3 scripts/bench_ddp.py --help
"""
import os

# One thread per rank; set before torch (and its OpenMP runtime) is loaded.  The spawned
# ranks inherit the environment.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Single machine: let gloo use the loopback device rather than whatever the host name
# resolves to.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from torch_common import (blas_info, find_idx, load_split, make_model, parse_hidden,  # noqa: E402
                          train_step)

CHECK_TOLERANCE = 1e-4
INIT_TIMEOUT_S = 120


def epoch_permutation(n, seed, epoch):
    """The order of one epoch: a permutation of range(n) that depends only on (seed, epoch),
    the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen)


class Sampler:
    """Global batch N*b per step from the epoch's permutation; `rank` takes its b-slice."""

    def __init__(self, n, seed, world_size, batch_size):
        self.n, self.seed, self.world, self.b = n, seed, world_size, batch_size
        self.global_batch = world_size * batch_size
        self.steps_per_epoch = n // self.global_batch
        self._epoch, self._perm = None, None

    def global_indices(self, step):
        epoch, pos = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, epoch_permutation(self.n, self.seed, epoch)
        return self._perm[pos * self.global_batch:(pos + 1) * self.global_batch]

    def rank_indices(self, step, rank):
        return self.global_indices(step)[rank * self.b:(rank + 1) * self.b]


def make_optimizer(params, args):
    return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bucket_sizes(ddp_model):
    """DDP's gradient bucket sizes in bytes, as its logger reports them (after the rebuild
    that follows the first iteration), or None if this torch does not say."""
    try:
        data = ddp_model._get_ddp_logging_data()
    except Exception:  # a prototype interface; absent or different in other versions
        return None
    text = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if not text:
        return None
    try:
        return [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        return str(text)


def die_with_parent(parent_pid):
    """Have the kernel send this rank SIGTERM if the launching process dies (even by SIGKILL),
    so no rank is left behind training or waiting in a collective."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: spawn's own clean-up still covers a failing rank
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(f"bench_ddp: the launching process {parent_pid} is gone")


def worker(rank, args, world_size, out_dir, parent_pid):
    die_with_parent(parent_pid)
    try:
        run_rank(rank, args, world_size, out_dir)
    except Exception as e:
        print(f"bench_ddp: rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_rank(rank, args, world_size, out_dir):
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=INIT_TIMEOUT_S))

    train_x, train_y = load_split(args.data_dir, "train")
    n = train_x.shape[0]
    sampler = Sampler(n, args.seed, world_size, args.batch_size)

    torch.manual_seed(args.seed)  # the same initial parameters everywhere (DDP also broadcasts rank 0's)
    net = make_model(args.model, args.hidden)
    net.train()
    if args.first_bucket_mb is not None:
        # DDP caps the first bucket (the gradients ready first) at this, 1 MB by default,
        # whatever bucket_cap_mb is; read by the DDP constructor.
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.first_bucket_mb * 1024 * 1024)
    ddp_kwargs = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    model = DDP(net, **ddp_kwargs)
    opt = make_optimizer(model.parameters(), args)

    if args.check:
        for step in range(args.check_steps):
            train_step(model, opt, train_x, train_y, sampler.rank_indices(step, rank))
        if rank == 0:
            state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
            torch.save({"state": state, "buckets": bucket_sizes(model)},
                       os.path.join(out_dir, "ddp_rank0.pt"))
        dist.barrier()
        return

    timed_seconds = 0.0
    last_loss = float("nan")
    total = args.warmup + args.steps
    dist.barrier()
    for step in range(total):
        if step == args.warmup:
            dist.barrier()  # start the timed steps together
        start = time.perf_counter()
        loss = train_step(model, opt, train_x, train_y, sampler.rank_indices(step, rank))
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            timed_seconds += elapsed
        if step == total - 1:
            last_loss = loss.item()

    times = torch.tensor([timed_seconds], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    slowest = times.item()
    fastest_t = torch.tensor([timed_seconds], dtype=torch.float64)
    dist.all_reduce(fastest_t, op=dist.ReduceOp.MIN)

    if rank == 0:
        steps = args.steps
        images = world_size * args.batch_size * steps
        blas = blas_info()  # what rank 0 mapped, after its timed steps
        summary = {
            "event": "summary",
            "framework": "pytorch-ddp",
            "backend": "gloo",
            "world_size": world_size,
            "model": args.model,
            "hidden": list(args.hidden) if args.model == "mlp" else None,
            "batch_size": args.batch_size,
            "global_batch": world_size * args.batch_size,
            "steps": steps,
            "warmup_steps": args.warmup,
            "images_per_sec": images / slowest if steps > 0 and slowest > 0 else None,
            "step_ms": slowest * 1000.0 / steps if steps > 0 else None,
            "fastest_rank_step_ms": fastest_t.item() * 1000.0 / steps if steps > 0 else None,
            "bucket_cap_mb": args.bucket_cap_mb if args.bucket_cap_mb is not None else 25,
            "first_bucket_mb": (args.first_bucket_mb if args.first_bucket_mb is not None
                                else dist._DEFAULT_FIRST_BUCKET_BYTES / (1024 * 1024)),
            "bucket_sizes_bytes": bucket_sizes(model),
            "threads_per_rank": 1,
            "optimizer": "sgd",
            "lr": args.lr,
            "momentum": args.momentum,
            "seed": args.seed,
            "last_loss": last_loss,
            "params": sum(t.numel() for t in model.parameters()),
            "torch_version": torch.__version__,
            "blas": blas["desc"],
            "blas_kind": blas["kind"],  # openblas, mkl, blis, reference, ... (scripts/peer_blas.py)
        }
        print(json.dumps(summary, separators=(",", ":")), flush=True)


def reference_params(args, world_size):
    """One process, batch N*b, the same samples and steps as the DDP check run."""
    torch.set_num_threads(1)
    train_x, train_y = load_split(args.data_dir, "train")
    sampler = Sampler(train_x.shape[0], args.seed, world_size, args.batch_size)
    torch.manual_seed(args.seed)
    model = make_model(args.model, args.hidden)
    model.train()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = make_optimizer(model.parameters(), args)
    for step in range(args.check_steps):
        train_step(model, opt, train_x, train_y, sampler.global_indices(step))
    return init, model.state_dict()


def run_check(args, world_size, out_dir):
    saved = torch.load(os.path.join(out_dir, "ddp_rank0.pt"))
    ddp_state = saved["state"]
    init, ref = reference_params(args, world_size)
    worst, worst_name, moved = 0.0, None, 0.0
    for name, r in ref.items():
        d = ddp_state[name]
        scale = r.abs().max().item() or 1.0
        rel = (d - r).abs().max().item() / scale
        moved = max(moved, (r - init[name]).abs().max().item() / scale)
        if rel > worst or worst_name is None:
            worst, worst_name = rel, name
    ok = worst < CHECK_TOLERANCE and moved > 0.0
    print(f"check: {args.model} hidden={','.join(map(str, args.hidden))} world_size={world_size} "
          f"batch {args.batch_size}/rank (global {world_size * args.batch_size}) "
          f"{args.check_steps} steps, DDP buckets (bytes) {saved['buckets']}: "
          f"max relative difference of rank 0's parameters vs one process = {worst:.3g} "
          f"(in {worst_name}; tolerance {CHECK_TOLERANCE:g}); "
          f"parameters moved by up to {moved:.3g} (relative) from their initial values", flush=True)
    print("PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data-dir", default=os.environ.get("RINGTRAIN_DATA", "/work/shared/data/mnist"))
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", default=None, help="MLP hidden widths, e.g. 4096,4096 (default 500,500)")
    p.add_argument("--batch-size", type=int, default=128, help="per-rank batch b")
    p.add_argument("--steps", type=int, default=200, help="timed training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before timing starts")
    p.add_argument("--nproc", type=int, default=2, help="number of ranks (processes) N")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket_cap_mb (default: DDP's own, 25)")
    p.add_argument("--first-bucket-mb", type=float, default=None,
                   help="DDP's cap on its first bucket, torch.distributed._DEFAULT_FIRST_BUCKET_BYTES "
                        "(default: DDP's own, 1 MB); the first bucket takes gradients until it "
                        "reaches this, so with the 500,500 MLP it takes all of them (2.59 MB) "
                        "whatever --bucket-cap-mb is")
    p.add_argument("--check", action="store_true",
                   help="compare rank 0's parameters after --check-steps steps with one process "
                        "at batch N*b on the same samples; prints PASS or FAIL")
    p.add_argument("--check-steps", type=int, default=10)
    args = p.parse_args()

    try:
        args.hidden = parse_hidden(args.hidden)
    except ValueError as e:
        p.error(str(e))
    for flag, value, least in (("--nproc", args.nproc, 1), ("--batch-size", args.batch_size, 1),
                               ("--steps", args.steps, 0), ("--warmup", args.warmup, 0),
                               ("--check-steps", args.check_steps, 1)):
        if value < least:
            p.error(f"{flag} must be at least {least} (got {value})")
    for flag, value in (("--bucket-cap-mb", args.bucket_cap_mb), ("--first-bucket-mb", args.first_bucket_mb)):
        if value is not None and value <= 0:
            p.error(f"{flag} must be positive (got {value})")

    # Fail here, clearly, rather than in every rank.
    if not os.path.isdir(args.data_dir):
        print(f"bench_ddp: error: the data directory {args.data_dir} does not exist "
              f"(set --data-dir or RINGTRAIN_DATA; scripts/download_mnist.sh fetches MNIST)",
              file=sys.stderr)
        return 2
    try:
        for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
            find_idx(args.data_dir, stem)
    except FileNotFoundError as e:
        print(f"bench_ddp: error: {e}", file=sys.stderr)
        return 2
    if args.nproc * args.batch_size > 60000:
        print(f"bench_ddp: error: the global batch {args.nproc}*{args.batch_size} exceeds the "
              f"60000 training images", file=sys.stderr)
        return 2

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    out_dir = tempfile.mkdtemp(prefix="bench_ddp.")
    try:
        try:
            # join=True: if a rank raises or dies, spawn terminates the others and raises here.
            mp.spawn(worker, args=(args, args.nproc, out_dir, os.getpid()), nprocs=args.nproc, join=True)
        except mp.ProcessRaisedException as e:
            print(f"bench_ddp: error: a rank failed (the others were terminated):\n{e}", file=sys.stderr)
            return 1
        except mp.ProcessExitedException as e:
            print(f"bench_ddp: error: {e} (the others were terminated)", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("bench_ddp: interrupted", file=sys.stderr)
            return 130
        if args.check:
            return run_check(args, args.nproc, out_dir)
        return 0
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
