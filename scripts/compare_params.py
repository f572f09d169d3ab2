#!/usr/bin/env python3
"""Compares two parameter files written by `mnist_train --save-params` (RTPARAMS format: the
8 bytes 'RTPARAMS', a little-endian uint64 count, then count float32 values).

Prints one line: the count, the largest |b - a| (with its index and both values), the mean
|b - a|, ||b - a|| / ||a||, and whether the largest difference is within --max-abs. Exit
status: 0 within the tolerance, 1 over it (or a NaN on either side), 2 unreadable or
mismatched files.

  scripts/compare_params.py --max-abs 1e-3 cpu.bin gpu.bin
"""
import argparse
import math
import struct
import sys
from array import array

MAGIC = b"RTPARAMS"


def fail(message):
    print(f"compare_params: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if len(data) < 16 or data[:8] != MAGIC:
        fail(f"{path} is not an RTPARAMS file (mnist_train --save-params)")
    (count,) = struct.unpack("<Q", data[8:16])
    if len(data) != 16 + 4 * count:
        fail(f"{path} claims {count} values but holds {len(data)} bytes")
    values = array("f")
    values.frombytes(data[16:])
    if sys.byteorder != "little":
        values.byteswap()
    return values


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="reference parameters (the CPU run's)")
    p.add_argument("b", help="parameters to compare (the GPU run's)")
    p.add_argument("--max-abs", type=float, required=True,
                   help="largest |b - a| allowed for exit status 0")
    args = p.parse_args()
    a, b = load(args.a), load(args.b)
    if len(a) != len(b):
        fail(f"{args.a} holds {len(a)} values, {args.b} {len(b)}")
    worst, worst_at, total, diff_sq, ref_sq, nans = 0.0, 0, 0.0, 0.0, 0.0, 0
    for i, (x, y) in enumerate(zip(a, b)):
        if math.isnan(x) or math.isnan(y):
            nans += 1
            continue
        d = abs(y - x)
        total += d
        diff_sq += d * d
        ref_sq += x * x
        if d > worst:
            worst, worst_at = d, i
    n = len(a)
    rel = math.sqrt(diff_sq) / math.sqrt(ref_sq) if ref_sq > 0 else 0.0
    ok = nans == 0 and worst <= args.max_abs
    at = f" at [{worst_at}] ({a[worst_at]:.7g} vs {b[worst_at]:.7g})" if n else ""
    print(f"{n} parameters: max |b - a| {worst:.3g}{at}, mean {total / max(n, 1):.3g}, "
          f"||b - a|| / ||a|| {rel:.3g}{f', {nans} NaN' if nans else ''}; "
          f"{'within' if ok else 'OVER'} {args.max_abs:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
