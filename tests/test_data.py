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
