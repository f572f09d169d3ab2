#!/usr/bin/python3
"""PyTorch baseline for ringtrain's speed benchmark (scripts/bench_speed.sh).

Trains the same models as `mnist_train --model mlp|cnn` (same shapes and
parameter counts; NCHW layout) on the same data, the same way ringtrain does:
the IDX .gz files are read with gzip+numpy into uint8 tensors kept in memory,
each step indexes a shuffled permutation, converts the batch to float and
divides by 255 inside the timed region, then forward + mean softmax
cross-entropy + backward + optimizer step.  A plain Python loop, no DataLoader.

Only the training steps are timed (time.perf_counter around each step), after
--warmup untimed steps.  Then the test accuracy on the full test set.  Prints
one JSON line, like ringtrain's --metrics-out summary:
  {"event":"summary","framework":"pytorch","images_per_sec":...,...}

Run with Debian's python3-torch:  /usr/bin/python3 scripts/bench_torch.py --help
"""
import argparse
import json
import os
import sys
import time

import torch

# The IDX loading and the models are shared with scripts/bench_ddp.py; blas_info() reads
# the BLAS this process mapped (scripts/peer_blas.py).
from torch_common import blas_info, load_split, make_model, train_step


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("RINGTRAIN_DATA", "/work/shared/data/mnist"))
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=300, help="timed training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before timing starts")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-batch", type=int, default=1000)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)

    train_x, train_y = load_split(args.data_dir, "train")
    test_x, test_y = load_split(args.data_dir, "t10k")
    n = train_x.shape[0]
    if args.batch_size > n:
        sys.exit(f"--batch-size {args.batch_size} exceeds the {n} training images")
    steps_per_epoch = n // args.batch_size  # drop the last partial batch, as ringtrain does

    model = make_model(args.model)
    model.train()
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                              weight_decay=args.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    gen = torch.Generator().manual_seed(args.seed)
    perm = None
    last_loss = float("nan")
    timed_seconds = 0.0
    total = args.warmup + args.steps
    for step in range(total):
        start = time.perf_counter()
        pos = step % steps_per_epoch
        if pos == 0:
            perm = torch.randperm(n, generator=gen)  # a fresh shuffle each epoch
        idx = perm[pos * args.batch_size:(pos + 1) * args.batch_size]
        loss = train_step(model, opt, train_x, train_y, idx)
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            timed_seconds += elapsed
        if step == total - 1:
            last_loss = loss.item()

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, test_x.shape[0], args.eval_batch):
            logits = model(test_x[i:i + args.eval_batch].float().div_(255.0))
            correct += (logits.argmax(1) == test_y[i:i + args.eval_batch].long()).sum().item()
    accuracy = correct / test_x.shape[0]

    steps = args.steps
    blas = blas_info()
    summary = {
        "event": "summary",
        "framework": "pytorch",
        "model": args.model,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "optimizer": args.optimizer,
        "lr": args.lr,
        "steps": steps,
        "warmup_steps": args.warmup,
        "images_per_sec": steps * args.batch_size / timed_seconds if steps > 0 else None,
        "step_ms": timed_seconds * 1000.0 / steps if steps > 0 else None,
        "test_accuracy": accuracy,
        "last_loss": last_loss,
        "params": sum(t.numel() for t in model.parameters()),
        "torch_version": torch.__version__,
        "blas": blas["desc"],
        "blas_kind": blas["kind"],  # openblas, mkl, blis, reference, ... (scripts/peer_blas.py)
        "data_dir": args.data_dir,
    }
    print(json.dumps(summary, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
