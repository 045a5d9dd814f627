"""Data the catalogued programs would download, made here in the on-disk formats they read.

Nothing is fetched: images come from scikit-learn's bundled handwritten digits (8x8, 1,797
images), scaled, shifted and lightly noised per item so that every item differs; text is drawn
from a fixed small vocabulary. Each maker is deterministic (its own seeded generator) and writes
into a cache folder once; the harness links the cache into each run's folder where the program
expects it.

Formats:

- ``mnist``: torchvision's ``MNIST/raw`` idx files, 60,000 training and 10,000 test images of
  28x28 (programs split the training set 55,000/5,000 by fixed counts, so the sizes are MNIST's).
- ``cifar10`` / ``cifar10-small``: torchvision's ``cifar-10-batches-py`` pickles, 50,000 + 10,000
  (or 1,000 + 200) colour images of 32x32. torchvision checks these files against MD5 sums of the
  real data set; the probe (``probe/sitecustomize.py``) accepts files that are present instead.
- ``wikitext2``: ``wikitext-2.txt`` as Lightning's demo ``WikiText2`` reads it (one sentence a
  line), about 150,000 words over a 400-word vocabulary.
- ``ames``: ``AmesHousing.txt``, the Ames housing table as its public copy is laid out (tab
  separated, 2,930 rows, one of them with a missing ``Total Bsmt SF``), with the columns the
  programs read; the price follows the other columns with noise.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images.astype(np.float32) / 16.0, bunch.target.astype(np.int64)


def _images(count: int, side: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` grey images ``side`` x ``side`` (uint8) and their labels 0-9."""
    images, labels = _digits()
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(images), count)
    scale = (side - 4) // 8
    out = np.zeros((count, side, side), np.float32)
    shifts = rng.integers(0, side - 8 * scale + 1, (count, 2))
    for i, j in enumerate(pick):
        big = np.kron(images[j], np.ones((scale, scale), np.float32))
        r, c = shifts[i]
        out[i, r:r + big.shape[0], c:c + big.shape[1]] = big
    out += rng.normal(0.0, 0.05, out.shape).astype(np.float32)
    return (np.clip(out, 0.0, 1.0) * 255).astype(np.uint8), labels[pick]


def _write_idx(path: Path, array: np.ndarray) -> None:
    kind = 0x08  # unsigned byte
    header = struct.pack(">HBB", 0, kind, array.ndim) + \
        b"".join(struct.pack(">I", n) for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def make_mnist(root: Path) -> Path:
    """``root/MNIST/raw/*-ubyte`` as torchvision's MNIST reads them."""
    raw = root / "MNIST" / "raw"
    if (raw / "t10k-labels-idx1-ubyte").exists():
        return root
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, seed in (("train", 60000, 1), ("t10k", 10000, 2)):
        images, labels = _images(count, 28, seed)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


def make_cifar10(root: Path, train: int = 50000, test: int = 10000) -> Path:
    """``root/cifar-10-batches-py`` as torchvision's CIFAR10 reads it (five training batches,
    one test batch, ``batches.meta``)."""
    folder = root / "cifar-10-batches-py"
    if (folder / "batches.meta").exists():
        return root
    folder.mkdir(parents=True, exist_ok=True)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": train // 5,
                     "num_vis": 3072}, f)

    def batch(name: str, count: int, seed: int) -> None:
        grey, labels = _images(count, 32, seed)
        rng = np.random.default_rng(seed + 100)
        tint = rng.uniform(0.4, 1.0, (count, 3, 1, 1)).astype(np.float32)
        colour = (grey[:, None].astype(np.float32) * tint).astype(np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": colour.reshape(count, 3072), "labels": labels.tolist(),
                         "batch_label": name, "filenames": [f"{i}.png" for i in range(count)]},
                        f)

    for k in range(5):
        batch(f"data_batch_{k + 1}", train // 5, 10 + k)
    batch("test_batch", test, 20)
    return root


def make_wikitext2(root: Path) -> Path:
    """``root/wikitext-2.txt``: lines of words from a fixed vocabulary, with a simple order
    (each word tends to follow the one before) so a language model has something to learn."""
    path = root / "wikitext-2.txt"
    if path.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(400)]
    lines = []
    words = 0
    while words < 150000:
        length = int(rng.integers(8, 30))
        start = int(rng.integers(0, len(vocab)))
        steps = rng.integers(1, 4, length)
        ids = (start + np.cumsum(steps)) % len(vocab)
        lines.append(" " + " ".join(vocab[i] for i in ids) + " ")
        words += length + 1
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    return root


def make_ames(root: Path) -> Path:
    """``root/AmesHousing.txt`` (see the module's docstring)."""
    path = root / "AmesHousing.txt"
    if path.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)
    n = 2930
    qual = rng.integers(1, 11, n)
    cond = rng.integers(1, 10, n)
    area = rng.normal(1500, 500, n).clip(400, 5000).round()
    air = rng.choice(["Y", "N"], n, p=[0.93, 0.07])
    bsmt = rng.normal(1050, 440, n).clip(0, 6000).round()
    price = 20000 * qual + 60 * area + 30 * bsmt + rng.normal(0, 20000, n)
    lines = ["Order\tOverall Qual\tOverall Cond\tGr Liv Area\tCentral Air\tTotal Bsmt SF"
             "\tSalePrice"]
    for i in range(n):
        basement = "" if i == 1341 else f"{bsmt[i]:.0f}"
        lines.append(f"{i + 1}\t{qual[i]}\t{cond[i]}\t{area[i]:.0f}\t{air[i]}\t{basement}"
                     f"\t{price[i]:.0f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    return root


MAKERS = {
    "mnist": make_mnist,
    "cifar10": make_cifar10,
    "cifar10-small": lambda root: make_cifar10(root, 1000, 200),
    "wikitext2": make_wikitext2,
    "ames": make_ames,
}


def prepare(kind: str, cache: Path) -> Path:
    """The cache folder holding data of ``kind``, made on first use."""
    return MAKERS[kind](cache / kind)
