"""``selection: sampled`` (netsense/compression/sampled.py): the count bound and the recall against the exact top
k, fixed-size outputs, error feedback exact to the bit, the decode with padding, the spec field, the warm-up at
registration, and a simulated 2-worker job that trains with it.

Tests taking ``device`` also run on CUDA tensors where a GPU is present (pytest marker ``cuda``; testbed/gpu/check.sh
runs them); the CUDA-only ones check that the sampled path never synchronizes with the host."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.ranks import in_ddp, run_world

from netsense.compression import native, sampled, validate_config, warm
from netsense.compression.compressor import TopK
from netsense.spec import SpecError

NO_CUDA = "no CUDA device here: testbed/gpu/check.sh runs the CUDA variants on a GPU"
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)])
DEVICES = ["cpu", CUDA]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def gradient(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    """A gradient-like vector: normal, or heavy-tailed (tail index 1.5: infinite variance,
    a few entries hundreds of times the median: a symmetric Pareto), or layered (blocks whose scales span 4 decades, as a network's
    layers do), or sparse (a 0.2% of nonzeros: fewer than k at 1%, so padding)."""
    if kind == "normal":
        return torch.randn(n, generator=g)
    if kind == "heavy":
        u = torch.rand(n, generator=g).clamp_(min=1e-12)
        return torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0) * u.pow(-1 / 1.5)
    if kind == "layered":
        scales = torch.logspace(-4, 0, 16)[torch.randint(0, 16, (n // 4096 + 1,), generator=g)]
        return torch.randn(n, generator=g) * scales.repeat_interleave(4096)[:n]
    if kind == "sparse":
        x = torch.zeros(n)
        at = torch.randperm(n, generator=g)[: n // 500]
        x[at] = torch.randn(at.numel(), generator=g)
        return x
    raise ValueError(kind)


def unpack(packed: torch.Tensor, k: int, fp16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    idx = packed[:4 * k].view(torch.int32).long()
    val = packed[4 * k:].view(torch.float16 if fp16 else torch.float32).float()
    return idx, val


# ---- the bound --------------------------------------------------------------------

def test_the_margin_solves_the_stated_bound():
    for n, k in [(11_000_000, 11_000), (11_000_000, 110_000), (15_000_000, 1_500_000), (563_000, 5_630),
                 (50_000_000, 5_000)]:
        s, j, cap = sampled.plan(n, k)
        p = k / n
        eps = sampled.margin(s, p)
        assert eps * eps * s * p == pytest.approx((2 + eps) * math.log(1 / sampled.FAILURE))
        assert sampled.count_bound(n, k) == pytest.approx(2 * sampled.FAILURE)
        assert j == math.ceil(s * p * (1 + eps)) and cap == math.ceil(k * (1 + eps) ** 2)
        assert sampled.SAMPLE_MIN <= s <= sampled.SAMPLE_MAX
    s, _, cap = sampled.plan(11_000_000, 110_000)
    assert s == 102_400 and cap < 1.4 * 110_000  # s p = HITS = 1024: eps 0.171, C within [k, 1.37 k]


@pytest.mark.parametrize("kind", ["normal", "heavy", "layered"])
def test_the_count_lands_within_the_bound_and_the_selection_is_the_exact_top_k(kind, device, capsys):
    """C = #{|g| >= t} within [k, cap] in every trial (the bound allows a failure with probability 2e-6 each),
    and then the selection is the exact top k: recall 1. Reported: C/k's range and the recall."""
    g = torch.Generator().manual_seed(7)
    on_device = torch.Generator(device=device).manual_seed(7)
    n = 400_000
    report = []
    for density in (0.003, 0.01, 0.05):
        k = math.ceil(density * n)
        s, _, cap = sampled.plan(n, k)
        assert s < n  # the sampled threshold is what is tested, not the small-bucket topk
        ratios, recalls = [], []
        for _ in range(12):
            mag = gradient(kind, n, g).abs().to(device)
            t = sampled.threshold(mag, k, on_device)
            count = int((mag >= t).sum())
            idx, real = sampled.select(mag, k, on_device)
            assert idx.numel() == k and real.numel() == k
            exact = set(torch.topk(mag.cpu(), k).indices.tolist())
            recalls.append(len(exact & set(idx[real].cpu().tolist())) / k)
            ratios.append(count / k)
            assert k <= count <= cap, (kind, density, count, k, cap)
        report.append(f"{kind} d={density}: C/k in [{min(ratios):.3f}, {max(ratios):.3f}] (cap/k "
                      f"{cap / k:.3f}), recall min {min(recalls):.4f}")
        assert min(recalls) == 1.0
    with capsys.disabled():
        print("\n  " + "\n  ".join(report))


def test_the_chernoff_bound_holds_where_failures_are_frequent(monkeypatch):
    """With the failure bound raised to 0.1 a tail (a sample of 2,000, 20 hits expected) the count leaves
    [k, cap] often enough to count: no more often than the bound says (2 x 0.1)."""
    monkeypatch.setattr(sampled, "FAILURE", 0.1)
    monkeypatch.setattr(sampled, "SAMPLE_MIN", 2_000)
    monkeypatch.setattr(sampled, "SAMPLE_MAX", 2_000)
    g = torch.Generator().manual_seed(3)
    n, k = 200_000, 2_000
    _, _, cap = sampled.plan(n, k)
    mag = torch.randn(n, generator=g).abs()
    trials = 400
    out = sum(not (k <= int((mag >= sampled.threshold(mag, k, g)).sum()) <= cap) for _ in range(trials))
    assert out / trials <= sampled.count_bound(n, k) == pytest.approx(0.2)


# ---- fixed sizes, padding, error feedback ---------------------------------------------

@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("kind", ["normal", "heavy", "sparse"])
def test_fixed_size_output_and_error_feedback_exact_to_the_bit(kind, fp16, device):
    """Exactly k slots whatever was above the threshold; residual = signal - sent, bit for bit (sent entries
    removed as sent, after fp16 rounding; unsent ones untouched); padding is value 0 at a sent index."""
    g = torch.Generator().manual_seed(11)
    on_device = torch.Generator(device=device).manual_seed(11)
    n = 300_000
    for k in (1_500, 3_000, 30_000):
        signal = gradient(kind, n, g).to(device)
        before = signal.clone()
        packed = sampled.compress(signal, k, fp16, on_device)
        assert packed.numel() == k * (4 + (2 if fp16 else 4))
        idx, val = unpack(packed, k, fp16)
        sent = torch.zeros(n, device=device).index_add_(0, idx, val)
        assert torch.equal(signal, before - sent)  # bit for bit
        assert torch.equal(signal + sent, before)
        unsent = torch.ones(n, dtype=torch.bool, device=device)
        unsent[idx] = False
        assert torch.equal(signal[unsent], before[unsent])
        nonzero = int((before != 0).sum())
        padding = val == 0
        if kind == "sparse" and k > nonzero:  # fewer nonzeros than k: every one sent, the rest padding
            assert int((~padding).sum()) == nonzero
            if not fp16:  # all sent, nothing left (in fp16 the rounding stays)
                assert torch.equal(signal, torch.zeros_like(signal))
            assert set(idx[padding].tolist()) <= set(idx[~padding].tolist())  # padding at a sent index
        elif kind != "sparse":
            assert not padding.any()


def test_a_sample_that_misses_pads_and_truncates_and_still_conserves(monkeypatch):
    """Tiny samples (failure bound 0.45 a tail): the count leaves [k, cap] both ways; padding and truncation
    then show, and error feedback is still exact."""
    monkeypatch.setattr(sampled, "FAILURE", 0.45)
    monkeypatch.setattr(sampled, "SAMPLE_MIN", 200)
    monkeypatch.setattr(sampled, "SAMPLE_MAX", 200)
    g = torch.Generator().manual_seed(5)
    n, k = 100_000, 1_000
    seen = set()
    for _ in range(60):
        signal = torch.randn(n, generator=g)
        before = signal.clone()
        count = int((signal.abs() >= sampled.threshold(signal.abs(), k, torch.Generator().manual_seed(9))).sum())
        packed = sampled.compress(signal, k, False, torch.Generator().manual_seed(9))
        idx, val = unpack(packed, k, False)
        assert torch.equal(signal, before - torch.zeros(n).index_add_(0, idx, val))
        real = int((val != 0).sum())
        if count < k:
            seen.add("padded")
            assert real == count
        elif count > sampled.plan(n, k)[2]:
            seen.add("truncated")
            assert real == k
    assert seen == {"padded", "truncated"}


@pytest.mark.parametrize("path", ["native", "pytorch"])
@pytest.mark.parametrize("fp16", [False, True])
def test_decoding_every_ranks_chunk_with_padding_is_the_dense_scatter_of_the_real_entries(path, fp16, monkeypatch):
    if path == "pytorch":
        monkeypatch.setattr(native, "usable", lambda t: False)
    elif native.library() is None:
        pytest.fail("the native kernels did not build (is g++ installed?)")
    g = torch.Generator().manual_seed(2)
    n, k, world = 250_000, 2_500, 3
    chunks, want = [], torch.zeros(n, dtype=torch.float64)
    for rank in range(world):
        signal = gradient("sparse" if rank == 1 else "normal", n, g)  # rank 1 pads: 500 nonzeros for 2,500 slots
        packed = sampled.compress(signal.clone(), k, fp16, g)
        idx, val = unpack(packed, k, fp16)
        real = val != 0
        want.index_add_(0, idx[real], val[real].double())
        chunks.append(packed)
    got = TopK.decompress(torch.full((n,), float("nan")), chunks, k, fp16, world)
    torch.testing.assert_close(got, (want / world).float(), rtol=1e-6, atol=1e-7)
    assert torch.equal(got[want == 0], torch.zeros(int((want == 0).sum())))


# ---- the spec field ---------------------------------------------------------------

def test_the_selection_field_defaults_to_exact_and_refuses_bad_values_clearly():
    for method in ("topk", "dc2", "tta"):
        assert validate_config({"method": method})["selection"] == "exact"
        assert validate_config({"method": method, "selection": "sampled"})["selection"] == "sampled"
    with pytest.raises(SpecError) as e:
        validate_config({"method": "topk", "selection": "sample"})
    assert str(e.value).startswith("compression.selection: unknown value 'sample' (did you mean 'sampled'?)")
    assert "one of: exact, sampled" in str(e.value)
    with pytest.raises(SpecError) as e:
        validate_config({"method": "netsense", "selection": "sampled"})
    assert str(e.value).startswith("compression.selection: applies to method topk, dc2, tta")
    with pytest.raises(ValueError, match="selection 'fast': one of exact, sampled"):
        TopK(0, 0, "fast")


# ---- in the hook ------------------------------------------------------------------

def sampled_conservation(rank, world, steps, device="cpu"):
    """topk at 1% with selection sampled on a 300k-parameter bucket (above the sample: the threshold path): the
    ranks' summed results == their summed gradients less their residuals; and the step's sizes."""
    import torch.distributed as dist

    from netsense.compression import register

    n = 300_000
    model = torch.nn.Linear(n, 1, bias=False)
    ddp = in_ddp(model, device=device)
    state = register(ddp, {"method": "topk", "density": 0.01, "selection": "sampled", "values": "fp32"})
    assert state.topk.selection == "sampled"
    fed, received = torch.zeros(n, device=device), torch.zeros(n, device=device)
    for step in range(steps):
        ddp.zero_grad()
        x = torch.randn(1, n, generator=torch.Generator().manual_seed(step * 10 + rank)).to(device)
        ddp(x).sum().backward()
        fed += x.view(-1)
        received += model.weight.grad.view(-1)
    assert not state.topk.selectors  # the native kernels never ran
    residual = sum((r for r in state.memory.residuals.values()), torch.zeros(n, device=device))
    for t in (fed, residual):
        dist.all_reduce(t)
    return (received * world).tolist(), (fed - residual).tolist(), state.warmed


def test_the_hook_with_sampled_selection_conserves_the_gradient_sum(device):
    received, expected, warmed = run_world(sampled_conservation, 2, 4, device)[0]
    torch.testing.assert_close(torch.tensor(received), torch.tensor(expected), rtol=1e-4, atol=1e-4)
    assert bool(warmed) == (device == "cuda")  # warmed at registration on CUDA only


def test_warm_runs_every_bucket_size_and_density_and_leaves_the_runs_state_alone():
    sizes = [50_000, 300_000]
    for selection in ("exact", "sampled"):
        done = warm.warm(selection, sizes, "cpu", densities=(0.01, 0.1), fp16s=(True, False))
        assert done == [(n, math.ceil(d * n), fp16) for n in sizes for d in (0.01, 0.1) for fp16 in (True, False)]


def bucket_sizes_of(rank, world):
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 3000), torch.nn.Linear(3000, 10))
    return warm.bucket_sizes(in_ddp(model))


def test_bucket_sizes_are_ddps_now_and_after_its_rebuild():
    # Now: one bucket of all 4,034,010 (under 25 MiB); after the rebuild (reverse order, the first >= 1 MiB
    # closes it): the last two layers' 3,033,010, then the first layer's 1,001,000.
    assert run_world(bucket_sizes_of, 1)[0] == [1_001_000, 3_033_010, 4_034_010]


# ---- a simulated 2-worker job ----------------------------------------------------------

def test_a_simulated_two_worker_job_trains_with_sampled_selection(tmp_path):
    """tests/test_clock.py's simulated job on digits (an MLP of hidden 512: its 268k-parameter bucket is above
    the sample, so the sampled threshold runs), topk at 1%: with selection sampled it trains, and step for step
    as the exact selection does (the sampled one is the exact top k but with probability 2e-6 a bucket and step;
    seeded, so this is not flaky)."""
    from test_clock import SIMULATED_JOB, _run

    runs = {}
    for selection in ("exact", "sampled"):
        job = json.loads(json.dumps(SIMULATED_JOB))
        job["spec"]["training"].update(dataset="digits", hiddenSize=512, maxSteps=40)
        job["spec"]["compression"] = {"method": "topk", "density": 0.01, "selection": selection}
        result, rows = _run(tmp_path, selection, job)
        runs[selection] = [float(r["loss"]) for r in rows if r.get("loss")], result
    losses, result = runs["sampled"]
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    assert losses == runs["exact"][0]
    assert result["accuracy_curve"] == runs["exact"][1]["accuracy_curve"]


# ---- CUDA only -----------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
@pytest.mark.parametrize("fp16", [False, True])
def test_the_sampled_path_never_synchronizes_with_the_host_on_cuda(fp16):
    """torch's sync debug mode raises on any device-to-host wait: selection, packing, error feedback and the
    decode of every rank's chunk run without one (the exact path's nonzero() and int() would raise)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n, k, world = 4_000_000, 40_000, 2
    signal = torch.randn(n, device="cuda", generator=g)
    magnitude, mask = torch.empty(n, device="cuda"), torch.empty(n, dtype=torch.bool, device="cuda")
    buf = torch.empty(n, device="cuda")
    sampled.compress(signal, k, fp16, g, magnitude, mask)  # the first call may load kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        packed = sampled.compress(signal, k, fp16, g, magnitude, mask)
        TopK.decompress(buf, [packed] * world, k, fp16, world)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert packed.numel() == k * (6 if fp16 else 8)
