"""Models for small images: ResNet18 and VGG16 on 32x32 inputs (CIFAR), an MLP and a CNN; for MNIST-1D's
1-D signals its reference CNN (cnn1d), an all-convolutional net (allconv1d), a small transformer
(transformer1d) and a GRU (gru1d); for text (pysource), a small causal transformer (gpt).

``resnet18`` is torchvision's ResNet18 as is, with the dataset's classes and
input channels: on 32x32 images its ImageNet stem (stride-2 conv and max-pool)
makes it cheap, ~145 ms per batch of 32 on one CPU thread; that is the model the
calibration numbers (and the paper's prototype) use. ``resnet18-cifar`` swaps in
the CIFAR stem (3x3 stride-1 conv, no max-pool): more accurate, ~9x the compute.
Both have 11.2M parameters, so both put 45 MB of fp32 gradient on the wire.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The training loss of every model: a classifier's logits (N, C) against labels (N,), or a sequence model's
    next-token logits (N, T, V) against the next tokens (N, T), each position one prediction (its mean: the mean
    per token). F.cross_entropy takes a sequence's classes in dimension 1, (N, V, T); flattening the positions
    into the batch instead keeps the model's output contiguous and the classifier's path one call."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
    return F.cross_entropy(logits, targets, reduction=reduction)


def resnet18(in_channels: int, classes: int, cifar_stem: bool = False) -> nn.Module:
    from torchvision.models import resnet18 as tv_resnet18

    m = tv_resnet18(num_classes=classes)
    if cifar_stem:
        m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
    elif in_channels != 3:
        m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


class VGG16(nn.Module):
    """torchvision's VGG16-BN features with a CIFAR head (512 -> classes), 15M parameters."""

    def __init__(self, in_channels: int, classes: int):
        super().__init__()
        from torchvision.models import vgg16_bn

        features = vgg16_bn().features
        features[0] = nn.Conv2d(in_channels, 64, kernel_size=3, padding=1)
        self.features = features
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def mlp(input_shape: tuple[int, ...], classes: int, hidden: int) -> nn.Module:
    inputs = 1
    for d in input_shape:
        inputs *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def cnn(in_channels: int, classes: int, hidden: int) -> nn.Module:
    width = max(8, hidden // 16)
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, width * 2, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(width * 2 * 16, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def cnn1d(in_channels: int, length: int, classes: int, hidden: int) -> nn.Module:
    """MNIST-1D's reference CNN (Greydanus and Kobak): three strided 1-D convolutions and a linear head, with
    hidden // 16 channels (hiddenSize 400: the paper's 25; wider for a heavier gradient)."""
    width = max(4, hidden // 16)
    body = nn.Sequential(nn.Conv1d(in_channels, width, 5, stride=2, padding=1), nn.ReLU(),
                         nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
    with torch.no_grad():
        features = body(torch.zeros(1, in_channels, length)).shape[1]
    return nn.Sequential(body, nn.Linear(features, classes))


def allconv1d(in_channels: int, classes: int, hidden: int) -> nn.Module:
    """An all-convolutional 1-D net: four convolutions (kernel 5, then three of 3, the second and fourth with
    stride 2), a mean over positions and a linear head, with widths w, 2w, 2w, 4w for w = hidden // 8 (hiddenSize
    512: 64, 175k parameters). Its kernels hold 98% of its parameters, where ``cnn``'s and ``cnn1d``'s dense heads
    hold most of theirs: the model for a conv-heavy gradient (the mean over positions, not a flatten, is what keeps
    the head small)."""
    w = max(4, hidden // 8)
    return nn.Sequential(
        nn.Conv1d(in_channels, w, 5, padding=2), nn.ReLU(),
        nn.Conv1d(w, 2 * w, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv1d(2 * w, 2 * w, 3, padding=1), nn.ReLU(),
        nn.Conv1d(2 * w, 4 * w, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(4 * w, classes))


class Transformer1d(nn.Module):
    """A small pre-norm transformer encoder on a 1-D signal cut into patches (as a vision transformer cuts an
    image): ``patch`` points of every channel make a token, a linear embedding and a learned position per token,
    ``layers`` encoder layers (``heads`` heads, feed-forward 4x the width, no dropout), the tokens' mean, a
    linear head. Width hidden // 4 (hiddenSize 512: 128; 0.4M parameters on MNIST-1D's 40 points, 10 tokens).
    Pre-norm (norm_first) because it trains with plain SGD and momentum at the step sizes the other models use,
    where a post-norm encoder needs a warm-up; its weights are matrices (the attention's in- and out-projections,
    the feed-forward's two), so PowerSGD compresses nearly all of it, as it does an MLP's."""

    def __init__(self, in_channels: int, length: int, classes: int, hidden: int, patch: int = 4, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        width = max(heads * 4, hidden // 4)
        self.patch = patch
        tokens = length // patch  # a tail shorter than a patch is dropped
        self.embed = nn.Linear(in_channels * patch, width)
        self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, length = x.shape
        usable = length - length % self.patch
        tokens = x[..., :usable].reshape(n, c, usable // self.patch, self.patch).transpose(1, 2).flatten(2)
        return self.head(self.norm(self.encoder(self.embed(tokens) + self.position)).mean(1))


class GRU1d(nn.Module):
    """A GRU over MNIST-1D's signal read as a sequence: one step a point (40 steps of ``in_channels`` values), a
    hidden state of hidden // 4 (hiddenSize 512: 128; 51k parameters, three quarters of them the recurrent
    matrices), a linear head on the mean of every step's state. The mean, not the last state: with the SGD
    and momentum every job uses (lr 0.05) the last state's head stayed at chance for 600 steps of batch 32,
    where the mean's reached 0.46 (0.91 at lr 0.2; Adam at 0.003: last state 0.80, mean 0.90), the gradient
    reaching every step directly.

    MNIST-1D's published baseline (Greydanus and Kobak; the mnist1d README's table) reports a GRU at about 91%
    test accuracy, its "training takes at least 10x the walltime of the CNN". That GRU is not this one: it is
    bidirectional, of hidden size 6, its head on every step's output (notebooks/models.py, GRUBase). Reproducing
    the figure dense with this model is a registered step of the judged set (issue 66), not done here; what is
    checked here is that it learns (tests/test_tasks.py)."""

    def __init__(self, in_channels: int, classes: int, hidden: int) -> None:
        super().__init__()
        width = max(8, hidden // 4)
        self.gru = nn.GRU(in_channels, width, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(x.transpose(1, 2))  # (N, C, L) -> a sequence of L steps of C values
        return self.head(states.mean(1))


class GPT(nn.Module):
    """A small causal transformer over tokens (pysource's bytes): a token embedding and a learned position per
    place in the context, ``layers`` pre-norm encoder layers (``heads`` heads, feed-forward 4x the width, no
    dropout) under a causal mask, a final norm and the next-token logits (N, T, vocab) from the token
    embedding's own matrix (weight-tied: the output layer adds no parameters). Width hidden // 4 (hiddenSize
    512: 128; 2 layers: 0.44M parameters at a context of 64). Pre-norm, as transformer1d, so that it trains
    with the SGD and momentum every job uses without a warm-up. The mask is made in every forward pass (a
    buffer would be broadcast by DDP every step)."""

    def __init__(self, vocab: int, context: int, hidden: int, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        width = max(heads * 4, hidden // 4)
        self.embed = nn.Embedding(vocab, width)
        nn.init.normal_(self.embed.weight, std=0.02)  # small: tied, it is also the output layer (loss ~ ln vocab)
        self.position = nn.Parameter(torch.randn(1, context, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(self.embed(x) + self.position[:, :t], mask=mask, is_causal=True)
        return self.norm(h) @ self.embed.weight.t()


def build_model(name: str, input_shape: tuple[int, ...], classes: int, hidden: int = 512) -> nn.Module:
    """``input_shape``: a sample's shape (a token model's: its context length); ``classes``: the classes, or a
    token model's vocabulary."""
    if name == "gpt":
        return GPT(classes, input_shape[-1], hidden)
    channels = input_shape[0]
    if name == "gru1d":
        return GRU1d(channels, classes, hidden)
    if name == "cnn1d":
        return cnn1d(channels, input_shape[-1], classes, hidden)
    if name == "allconv1d":
        return allconv1d(channels, classes, hidden)
    if name == "transformer1d":
        return Transformer1d(channels, input_shape[-1], classes, hidden)
    if name in ("resnet18", "resnet18-cifar"):
        return resnet18(channels, classes, cifar_stem=name == "resnet18-cifar")
    if name == "vgg16":
        return VGG16(channels, classes)
    if name == "mlp":
        return mlp(input_shape, classes, hidden)
    if name == "cnn":
        return cnn(channels, classes, hidden)
    raise ValueError(f"spec.training.model: unknown model {name!r}")
