"""Datasets: what each promises about shape, split and labels."""

from __future__ import annotations

import torch

from netsense.train.data import load_dataset
from netsense.train.models import build_model


def test_digits32_is_the_digits_in_cifar_shape_for_cifar_models():
    small = load_dataset({"dataset": "digits", "seed": 0})
    big = load_dataset({"dataset": "digits32", "seed": 0})
    assert big.train_x.shape[1:] == (3, 32, 32) and big.test_x.shape[1:] == (3, 32, 32)
    assert torch.equal(big.train_y, small.train_y) and torch.equal(big.test_y, small.test_y)  # same split
    # The same picture, larger: shrinking it back recovers the 8x8 image closely.
    back = torch.nn.functional.avg_pool2d(big.train_x[:50, :1], 4)
    assert torch.corrcoef(torch.stack([back.flatten(), small.train_x[:50].flatten()]))[0, 1] > 0.9
    model = build_model("resnet18", big.input_shape, big.classes)
    assert model(big.train_x[:4]).shape == (4, 10)


def test_digits_are_scikit_learns_images_read_without_importing_it():
    """The CSV is read straight from the installed package (scikit-learn's import costs every worker 1.5 s);
    the images, labels and split must stay exactly those of load_digits()."""
    from sklearn.datasets import load_digits

    d = load_dataset({"dataset": "digits", "seed": 0})
    ref = load_digits()
    x = (torch.tensor(ref.images, dtype=torch.float32).unsqueeze(1) / 16.0 - 0.3) / 0.4
    y = torch.tensor(ref.target)
    both_x, both_y = torch.cat([d.train_x, d.test_x]), torch.cat([d.train_y, d.test_y])
    assert both_x.shape == x.shape and d.train_y.dtype == y.dtype
    # the same multiset of (image, label) pairs, split 80/20
    assert len(d.train_y) == int(len(y) * 0.8)
    assert _pairs(both_x, both_y) == _pairs(x, y)


def _pairs(x: torch.Tensor, y: torch.Tensor) -> list:
    return sorted(zip(x.flatten(1).tolist(), y.tolist(), strict=True))
