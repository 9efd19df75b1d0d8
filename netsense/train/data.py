"""Datasets held in memory as tensors, sharded per rank like DistributedSampler.

- cifar10 / cifar100: torchvision's on-disk format under dataPath, never
  downloaded at run time (a missing directory is an error naming the field);
- digits: scikit-learn's bundled 8x8 handwritten digits (1797 real images), for
  small real convergence runs with no download;
- digits32: the same images upsampled to 32x32 and repeated on 3 channels, in
  CIFAR's shape: what a CIFAR model (ResNet18) computes per step, on a task that
  it learns within a hundred steps, to compare accuracy per step without CIFAR;
- mnist1d: MNIST-1D (Greydanus and Kobak, 2020/2024), 1-D signals of 40 points made from ten digit
  templates by random shifts, scaling, shear and noise; generated locally by the ``mnist1d`` package's
  make_dataset (its own seed: the published set), never downloaded; ``mnist1dSamples`` (default 5000)
  of which 80% train. Published test accuracy at 4,000 training samples: MLP ~68%, CNN ~94%;
- synthetic: random images whose labels come from a fixed random linear map, so
  the task is learnable (accuracy rises) yet needs no data; for throughput;
- pysource: text for a character-level language model (model gpt), shipped with Python itself: the ``.py``
  sources of the standard library of the interpreter running the trainer, a fixed selection (``pysource_text``),
  bytes as tokens (vocabulary 256); samples are windows of ``contextLength`` bytes and their next bytes, the last
  tenth of the text the validation set. Its sha256 goes into result.json (``text``): the sources differ between
  Python versions and builds, so two runs compare only on the same text.

Batches are index slices of in-memory tensors: no DataLoader worker processes,
which would steal the CPU the emulated cluster is measuring.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sysconfig
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from netsense.spec import SpecError
from netsense.spec.schema import Issue

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


@dataclass
class Dataset:
    train_x: torch.Tensor  # float, normalized, (N, C, H, W)
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: int
    augment: bool = False
    source: dict | None = None  # what a dataset made from local files was made of (pysource: its text's sha256)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def _cifar(name: str, path: str) -> Dataset:
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        train, test = cls(path, train=True, download=False), cls(path, train=False, download=False)
    except RuntimeError as e:
        raise SpecError([Issue("spec.training.dataPath", f"{path}: no {name} dataset there ({e})")]) from None

    def prep(ds) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div_(255)
        mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
        return (x - mean) / std, torch.tensor(ds.targets)

    (tx, ty), (vx, vy) = prep(train), prep(test)
    return Dataset(tx, ty, vx, vy, classes=len(train.classes), augment=True)


def _digits_array() -> np.ndarray:
    """scikit-learn's digits.csv.gz (1797 rows: 64 pixels 0-16, then the label), read straight from the
    installed package: what load_digits() returns, without importing scikit-learn and SciPy (1.5 s of CPU
    in every worker, every run)."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise SpecError([Issue("spec.training.dataset", "digits needs scikit-learn installed (pip install "
                               "scikit-learn): the images are the ones it bundles")])
    path = os.path.join(next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz")
    return np.loadtxt(path, delimiter=",", dtype=np.float32)


def _digits(seed: int) -> Dataset:
    d = torch.from_numpy(_digits_array())
    x = d[:, :64].reshape(-1, 1, 8, 8) / 16.0
    x = (x - 0.3) / 0.4
    y = d[:, 64].long()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))  # fixed split
    cut = int(len(y) * 0.8)
    return Dataset(x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]], classes=10)


def _digits32(seed: int) -> Dataset:
    d = _digits(seed)

    def up(x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
        return x.expand(-1, 3, -1, -1).contiguous()

    return Dataset(up(d.train_x), d.train_y, up(d.test_x), d.test_y, classes=d.classes)


def _mnist1d(samples: int) -> Dataset:
    """MNIST-1D as its package makes it (templates, transforms, its seed 42): (N, 1, 40) signals."""
    import random

    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise SpecError([Issue("spec.training.dataset", "mnist1d needs the mnist1d package (pip install mnist1d, "
                               "in the venv's train extras): it makes the dataset here, nothing is downloaded")]) \
            from None
    args = get_dataset_args()
    args.num_samples = samples
    state, np_state = random.getstate(), np.random.get_state()  # make_dataset seeds the global generators
    try:
        d = make_dataset(args)
    finally:
        random.setstate(state)
        np.random.set_state(np_state)

    def signals(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(x, dtype=np.float32)).unsqueeze(1)

    return Dataset(signals(d["x"]), torch.from_numpy(d["y"]).long(), signals(d["x_test"]),
                   torch.from_numpy(d["y_test"]).long(), classes=10)


def _synthetic(samples: int, classes: int, seed: int) -> Dataset:
    g = torch.Generator().manual_seed(10_000 + seed)
    shape = (3, 32, 32)
    x = torch.randn(samples + samples // 4, *shape, generator=g)
    w = torch.randn(3 * 32 * 32, classes, generator=g)
    y = (x.flatten(1) @ w).argmax(1)
    return Dataset(x[:samples], y[:samples], x[samples:], y[samples:], classes=classes)


# Not taken: third-party packages (site-packages, dist-packages: they differ between machines), the tests (Debian
# ships them in a package of their own), the encodings (generated code-page tables, not code: a tenth of the
# sources), the build's own configuration (_sysconfigdata_*, config-*: compiler flags and paths of one build).
PYSOURCE_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test",
                                "encodings"})
PYSOURCE_VALIDATION = 0.1  # the last tenth of the text (by position)
PYSOURCE_VOCAB = 256  # bytes as tokens: the same vocabulary whatever the text holds
EVAL_ORDER_SEED = 1234  # the validation windows' fixed order (see _text_windows)


def _pysource_files(root: str) -> list[str]:
    """The standard library's .py files under ``root`` (relative POSIX paths, sorted), less PYSOURCE_SKIP_DIRS."""
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in PYSOURCE_SKIP_DIRS and not d.startswith("config-")]
        rel = os.path.relpath(here, root)
        found += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in files
                  if f.endswith(".py") and not f.startswith("_sysconfigdata")]
    return sorted(found)


def pysource_text(budget: int, root: str | None = None) -> tuple[bytes, dict]:
    """The first ``budget`` bytes of the standard library's sources (``root``: this interpreter's stdlib), files
    concatenated in the order of their sorted paths (the last one cut at the budget; all of them where they hold
    less), and what they were: sha256, bytes, files, the last file, the Python version."""
    root = root or sysconfig.get_paths()["stdlib"]
    parts, size, last = [], 0, None
    for rel in _pysource_files(root):
        if size >= budget:
            break
        with open(os.path.join(root, rel), "rb") as fh:
            parts.append(fh.read(budget - size))
        size, last = size + len(parts[-1]), rel
    if not parts:
        raise SpecError([Issue("spec.training.dataset", f"pysource: no Python sources under {root} (this "
                               "interpreter's standard library)")])
    text = b"".join(parts)
    return text, {"sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text), "files": len(parts),
                  "last_file": last, "python": platform.python_version()}


def token_windows(tokens: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of ``context`` tokens side by side (inputs) and the same shifted by one (their next tokens), both
    views of ``tokens``: every token the target of one prediction, a tail shorter than a window dropped."""
    n = (len(tokens) - 1) // context
    return tokens[:n * context].view(n, context), tokens[1:n * context + 1].view(n, context)


def _text_windows(tokens: torch.Tensor, context: int) -> tuple[torch.Tensor, ...]:
    """(train x, train y, validation x, validation y): the text cut by position (the last PYSOURCE_VALIDATION of
    it validation, so no window of one holds a token of the other), each part in windows. The validation
    windows in a fixed shuffled order, so that the evaluation's first evalSamples of them span the whole
    validation text rather than its first files."""
    cut = int(len(tokens) * (1 - PYSOURCE_VALIDATION))
    train_x, train_y = token_windows(tokens[:cut], context)
    val_x, val_y = token_windows(tokens[cut:], context)
    order = torch.randperm(len(val_x), generator=torch.Generator().manual_seed(EVAL_ORDER_SEED))
    return train_x, train_y, val_x[order], val_y[order]


def _pysource(budget: int, context: int) -> Dataset:
    text, source = pysource_text(budget)
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    train_x, train_y, val_x, val_y = _text_windows(tokens, context)
    if len(val_x) == 0:
        raise SpecError([Issue("spec.training.pysourceBytes", f"{len(text)} bytes hold no validation window of "
                               f"contextLength {context} in their last tenth: take more text or a shorter context")])
    return Dataset(train_x, train_y, val_x, val_y, classes=PYSOURCE_VOCAB, source={"dataset": "pysource", **source})


def load_dataset(training: dict) -> Dataset:
    name = training["dataset"]
    if name in ("cifar10", "cifar100"):
        return _cifar(name, training["dataPath"])
    if name == "digits":
        return _digits(training["seed"])
    if name == "digits32":
        return _digits32(training["seed"])
    if name == "mnist1d":
        return _mnist1d(training["mnist1dSamples"])
    if name == "pysource":
        return _pysource(training["pysourceBytes"], training["contextLength"])
    return _synthetic(training["syntheticSamples"], training["syntheticClasses"], training["seed"])


class ShardedBatches:
    """This rank's batches of one epoch (DistributedSampler's shard, seeded by epoch)."""

    def __init__(self, data: Dataset, batch_size: int, rank: int, world: int, seed: int):
        self.data, self.batch_size = data, batch_size
        self.sampler = DistributedSampler(range(len(data.train_y)), num_replicas=world, rank=rank,
                                          shuffle=True, seed=seed, drop_last=True)
        self.augment_gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def indices(self, epoch: int) -> torch.Tensor:
        """The samples of this rank's batches in ``epoch``, in order (a batch: batch_size in a row)."""
        self.sampler.set_epoch(epoch)
        return torch.tensor(list(self.sampler))[:len(self) * self.batch_size]

    def epoch(self, epoch: int):
        idx = self.indices(epoch)
        for b in range(len(self)):
            sel = idx[b * self.batch_size:(b + 1) * self.batch_size]
            x, y = self.data.train_x[sel], self.data.train_y[sel]
            if self.data.augment:
                x = self._augment(x)
            yield x, y

    def _augment(self, x: torch.Tensor) -> torch.Tensor:
        """Random horizontal flip per sample and a random 4-pixel shift per batch."""
        flip = torch.rand(x.shape[0], generator=self.augment_gen) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
        dx, dy = (int(v) for v in torch.randint(-4, 5, (2,), generator=self.augment_gen))
        return torch.roll(x, shifts=(dy, dx), dims=(2, 3))
