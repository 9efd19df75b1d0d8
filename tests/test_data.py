"""Datasets: what each promises about shape, split and labels."""

from __future__ import annotations

import pytest
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


def test_mnist1d_is_the_published_set_made_here_and_its_models_fit():
    """MNIST-1D as its package makes it (4,000 training and 1,000 test signals of 40 points, ten classes,
    balanced), the same on every call (its own seed), without touching the process's random generators; the
    reference CNN (25 channels at hiddenSize 400) and the MLP take it, the image models are refused by name."""
    import random

    import numpy as np

    from netsense.spec import SpecError, parse_spec
    from netsense.train.data import load_dataset
    from netsense.train.models import build_model

    random.seed(7)
    np.random.seed(7)
    before = (random.random(), np.random.rand())
    random.seed(7)
    np.random.seed(7)
    d = load_dataset({"dataset": "mnist1d", "mnist1dSamples": 5000, "seed": 3})
    assert (random.random(), np.random.rand()) == before, "loading the dataset moved the global generators"
    assert d.train_x.shape == (4000, 1, 40) and d.test_x.shape == (1000, 1, 40) and d.classes == 10
    assert torch.bincount(torch.cat([d.train_y, d.test_y])).tolist() == [500] * 10
    again = load_dataset({"dataset": "mnist1d", "mnist1dSamples": 5000, "seed": 0})
    assert torch.equal(d.train_x, again.train_x) and torch.equal(d.test_y, again.test_y)
    cnn = build_model("cnn1d", d.input_shape, 10, 400)
    assert cnn[0][0].out_channels == 25 and cnn(d.train_x[:4]).shape == (4, 10)
    assert build_model("mlp", d.input_shape, 10, 100)(d.train_x[:4]).shape == (4, 10)
    with pytest.raises(SpecError, match="spec.training.model: mnist1d's 1-D signals take model mlp or cnn1d"):
        parse_spec({"training": {"model": "cnn", "dataset": "mnist1d"}})


def _fixed_batch_losses(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> tuple[float, float]:
    """The loss on one batch before and after ``steps`` SGD steps on it (lr 0.05, momentum 0.9: every job's)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    first = torch.nn.functional.cross_entropy(net(x), y).item()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return first, torch.nn.functional.cross_entropy(net(x), y).item()


def test_transformer1d_reads_mnist1d_as_patch_tokens_and_trains_with_the_jobs_sgd():
    from netsense.spec import SpecError, parse_spec

    torch.manual_seed(0)
    d = load_dataset({"dataset": "mnist1d", "mnist1dSamples": 500, "seed": 0})
    net = build_model("transformer1d", d.input_shape, 10, 512)
    assert net.embed.in_features == 4 and net.position.shape == (1, 10, 128)  # 40 points: 10 tokens of 4
    x, y = d.train_x[:64], d.train_y[:64]
    # Pre-norm trains with the SGD and momentum every job uses (lr 0.05), no warm-up: the loss on a fixed batch
    # falls by a third in 30 steps.
    first, last = _fixed_batch_losses(net, x, y, 30)
    assert last < 0.67 * first
    with pytest.raises(SpecError, match="spec.training.model: transformer1d takes 1-D signals"):
        parse_spec({"training": {"model": "transformer1d", "dataset": "digits32"}})


def test_allconv1d_keeps_its_parameters_in_kernels():
    from netsense.spec import SpecError, parse_spec

    torch.manual_seed(0)
    d = load_dataset({"dataset": "mnist1d", "mnist1dSamples": 500, "seed": 0})
    net = build_model("allconv1d", d.input_shape, 10, 512)
    total = sum(p.numel() for p in net.parameters())
    kernels = sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Conv1d))
    assert kernels > 0.95 * total  # what the grid registers it for: a conv-heavy gradient
    x, y = d.train_x[:64], d.train_y[:64]
    assert net(x).shape == (64, 10)
    first, last = _fixed_batch_losses(net, x, y, 60)  # slower off the mark than the transformer: near chance
    assert last < 0.75 * first  # for ~20 steps
    with pytest.raises(SpecError, match="spec.training.model: allconv1d takes 1-D signals"):
        parse_spec({"training": {"model": "allconv1d", "dataset": "digits32"}})
