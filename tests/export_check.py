#!/usr/bin/env python3
"""Checks mnist_train's exported model against ringtrain's own test-set logits.

  export_check.py onnx LOGITS MODEL.onnx DATA_DIR
      OpenCV's DNN module (cv2.dnn.readNetFromONNX, a runtime that shares no code with
      ringtrain or ONNX's library) runs the file on the whole test set: its argmax must equal
      ringtrain's on at least 99.9% of the images and every logit must be within 1e-4.
  export_check.py safetensors LOGITS MODEL.safetensors DATA_DIR MODEL [HIDDEN] [ACCURACY]
      PyTorch builds the model with its own modules (fc1, conv1, ... as docs/usage.md names
      them), loads the tensors with the reader below (json + numpy: the safetensors package is
      not a Debian package) under load_state_dict(strict=True): every logit within 1e-4 of
      ringtrain's, and ringtrain's prediction on every test image but a tie (top two logits
      within twice the largest logit difference, which either program may break its own way);
      ringtrain's logits must give ACCURACY, ringtrain's reported test accuracy, and PyTorch's
      accuracy must equal it up to the ties.

LOGITS: the file of mnist_train --test-dump-logits (float32 [count, 10], little-endian).
The input is what the export documents: bytes * float32(1/255), [N, 1, 28, 28]. Prints one
line of figures; exits 0 on agreement, 1 otherwise.
"""
import json
import os
import struct
import sys

import numpy as np

# ringtrain's kPixelScale (data.h): it multiplies by the rounded reciprocal, not divides by 255.
PIXEL_SCALE = np.float32(1.0) / np.float32(255.0)


def read_idx(path):
    import gzip
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    _, _, ndim = struct.unpack(">HBB", raw[:4])
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def test_pixels(data_dir):
    """The test images as the exported model takes them: float32 [N, 1, H, W] in [0, 1]."""
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            images = read_idx(path)
            return (images.astype(np.float32) * PIXEL_SCALE)[:, None, :, :]
    raise FileNotFoundError(f"no t10k-images-idx3-ubyte(.gz) in {data_dir}")


def ringtrain_logits(path, count):
    logits = np.fromfile(path, dtype="<f4")
    if logits.size % count != 0:
        raise ValueError(f"{path}: {logits.size} floats for {count} images")
    return logits.reshape(count, -1)


def read_safetensors(path):
    """name -> float32 array, and the metadata; checks the layout as it reads."""
    with open(path, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    if (8 + length) % 8 != 0:
        raise ValueError(f"{path}: header of {length} bytes leaves the data unaligned")
    header = json.loads(raw[8:8 + length].decode("utf-8"))
    data = raw[8 + length:]
    metadata = header.pop("__metadata__", {})
    tensors, covered = {}, 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, end = entry["data_offsets"]
        if entry["dtype"] != "F32" or begin != covered:
            raise ValueError(f"{path}: {name}: {entry} (expected F32 starting at {covered})")
        values = np.frombuffer(data[begin:end], dtype="<f4")
        tensors[name] = values.reshape(entry["shape"])
        covered = end
    if covered != len(data):
        raise ValueError(f"{path}: tensors cover {covered} of {len(data)} data bytes")
    return tensors, metadata


def check_onnx(logits_path, model_path, data_dir):
    import cv2
    pixels = test_pixels(data_dir)
    ours = ringtrain_logits(logits_path, len(pixels))
    net = cv2.dnn.readNetFromONNX(model_path)
    theirs = np.concatenate([forward_cv2(net, pixels[i:i + 500]) for i in range(0, len(pixels), 500)])
    agree = float(np.mean(theirs.argmax(1) == ours.argmax(1)))
    worst = float(np.abs(theirs - ours).max())
    print(f"onnx (OpenCV {cv2.__version__}): argmax agreement {agree * 100:.2f}% of {len(pixels)}, "
          f"max |logit difference| {worst:.3g}")
    return agree >= 0.999 and worst <= 1e-4


def forward_cv2(net, batch):
    net.setInput(batch)
    return net.forward("logits")


def torch_model(name, hidden):
    import torch.nn as nn

    class Mlp(nn.Module):
        def __init__(self, widths):
            super().__init__()
            sizes = [784] + list(widths) + [10]
            for k in range(len(sizes) - 1):
                setattr(self, f"fc{k + 1}", nn.Linear(sizes[k], sizes[k + 1]))
            self.count = len(sizes) - 1

        def forward(self, x):
            x = x.flatten(1)
            for k in range(1, self.count + 1):
                x = getattr(self, f"fc{k}")(x)
                if k < self.count:
                    x = x.relu()
            return x

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
            self.fc1 = nn.Linear(784, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(self.conv1(x).relu(), 2)
            x = nn.functional.max_pool2d(self.conv2(x).relu(), 2)
            return self.fc1(x.flatten(1))

    if name == "mlp":
        return Mlp([int(w) for w in hidden.split(",")] if hidden else [500, 500])
    if name == "cnn":
        return Cnn()
    raise ValueError(f"unknown model {name}")


def check_safetensors(logits_path, model_path, data_dir, name, hidden, accuracy):
    import torch
    torch.set_num_threads(1)
    pixels = test_pixels(data_dir)
    ours = ringtrain_logits(logits_path, len(pixels))
    tensors, metadata = read_safetensors(model_path)
    model = torch_model(name, hidden)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, strict=True)
    model.eval()
    with torch.no_grad():
        theirs = model(torch.from_numpy(pixels)).numpy()
    predictions = theirs.argmax(1)
    same = int(np.sum(predictions == ours.argmax(1)))
    worst = float(np.abs(theirs - ours).max())
    # Two float programs sum in other orders, so each logit may differ by up to `worst`; an
    # image whose top two logits are within 2 * worst of each other is a tie either may break
    # its own way. Every other image must get ringtrain's prediction.
    top_two = np.sort(ours, axis=1)[:, -2:]
    ties = (top_two[:, 1] - top_two[:, 0]) <= 2 * worst
    untied_disagreements = int(np.sum((predictions != ours.argmax(1)) & ~ties))
    labels = read_idx(next(os.path.join(data_dir, n) for n in
                           ("t10k-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte")
                           if os.path.exists(os.path.join(data_dir, n))))
    torch_accuracy = float(np.mean(predictions == labels))
    ringtrain_accuracy = float(np.mean(ours.argmax(1) == labels))
    print(f"safetensors (PyTorch {torch.__version__}, {metadata.get('ringtrain.weights')} weights): "
          f"same prediction on {same} of {len(pixels)} ({int(ties.sum())} ties within "
          f"2 x the logit difference), max |logit difference| {worst:.3g}, "
          f"test accuracy {torch_accuracy:.4f} (ringtrain's logits {ringtrain_accuracy:.4f}"
          + (f", ringtrain's summary {accuracy}" if accuracy else "") + ")")
    # The accuracy may move by the ties alone (none in every run seen so far).
    slack = float(ties.sum()) / len(pixels)
    ok = (untied_disagreements == 0 and worst <= 1e-4
          and abs(torch_accuracy - ringtrain_accuracy) <= slack)
    if accuracy:
        ok = ok and abs(ringtrain_accuracy - float(accuracy)) <= 0.5e-4
    return ok


def main(argv):
    if len(argv) >= 5 and argv[1] == "onnx":
        return 0 if check_onnx(argv[2], argv[3], argv[4]) else 1
    if len(argv) >= 6 and argv[1] == "safetensors":
        hidden = argv[6] if len(argv) > 6 else ""
        accuracy = argv[7] if len(argv) > 7 else ""
        return 0 if check_safetensors(argv[2], argv[3], argv[4], argv[5], hidden, accuracy) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
