"""Shared parts of the PyTorch baselines (scripts/bench_torch.py, scripts/bench_ddp.py).

MNIST IDX reading into uint8 tensors, the models of `mnist_train --model mlp|cnn`
(same shapes and parameter counts; NCHW layout), and a description of the BLAS in use
(scripts/peer_blas.py).
"""
import gzip
import os
import struct

import numpy as np
import torch
import torch.nn as nn

from peer_blas import blas_report

DEFAULT_HIDDEN = (500, 500)


def read_idx(path):
    """An IDX file (.gz or plain) as a uint8 numpy array of its declared shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return data.reshape(dims)


def find_idx(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{stem}(.gz) not found in {data_dir}")


def load_split(data_dir, prefix):
    images = read_idx(find_idx(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find_idx(data_dir, f"{prefix}-labels-idx1-ubyte"))
    # uint8 tensors, NCHW with one channel: [N, 1, 28, 28]
    x = torch.from_numpy(images.copy()).unsqueeze(1)
    y = torch.from_numpy(labels.copy())
    return x, y


def parse_hidden(text):
    """'4096,4096' -> (4096, 4096); None or '' -> the default (500, 500)."""
    if text is None or text == "":
        return DEFAULT_HIDDEN
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"--hidden {text!r}: expected comma-separated positive integers") from None
    if not widths or any(w <= 0 for w in widths):
        raise ValueError(f"--hidden {text!r}: expected comma-separated positive integers")
    return widths


def make_model(name, hidden=DEFAULT_HIDDEN):
    if name == "mlp":
        # flatten, dense 784->500, relu, dense 500->500, relu, dense 500->10 (648,010 params);
        # `hidden` overrides the widths (e.g. (4096, 4096), as mnist_train --hidden)
        layers = [nn.Flatten()]
        width = 784
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 10))
        return nn.Sequential(*layers)
    if name == "cnn":
        # conv3x3 same 1->8, relu, pool, conv3x3 same 8->16, relu, pool, dense 784->10 (9,098 params)
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(784, 10))
    raise ValueError(f"unknown model {name}")


def train_step(model, opt, train_x, train_y, idx):
    """One timed step, as ringtrain's: bytes -> [0, 1] floats, forward, loss, backward, update."""
    x = train_x[idx].float().div_(255.0)
    y = train_y[idx].long()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def blas_info():
    """The BLAS this process runs on (scripts/peer_blas.py, after a matmul): a dict with kind
    (openblas, mkl, blis, reference, ...), libs (real path: kind) and desc (one line, with the
    threads and torch's BLAS_INFO)."""
    return blas_report(torch)
