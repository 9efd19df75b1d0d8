"""The compression hooks on real gloo process groups (2 and 3 ranks on loopback).

Tests taking ``device`` also run on CUDA tensors where a GPU is present (gloo
moves CUDA tensors too, so several ranks can share one GPU, which NCCL refuses):
the same selection and the same error-feedback conservation as on the CPU."""

from __future__ import annotations

import math

import pytest
import torch
from support.ranks import batch, in_ddp, run_world, tiny_mlp

from netsense.compression import validate_config
from netsense.compression.selection import Workspace, topk_indices
from netsense.spec import SpecError

METHODS = ["allreduce", "fp16", "powersgd", "topk", "netsense", "dc2", "tta"]
NO_CUDA = "no CUDA device here: testbed/gpu/check.sh runs the CUDA variants on a GPU"
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda,
                                              pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)])]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


# ---- rank functions (module level: they are pickled into spawned processes) --------

def grads_after_one_step(rank, world, config, device="cpu"):
    """Returns the averaged gradient of step 1."""
    from netsense.compression import register

    model = in_ddp(tiny_mlp(), device=device)
    register(model, config)
    out = []
    for step in range(2):
        model.zero_grad()
        x, y = batch(rank, step)
        torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
        out = [p.grad.view(-1).tolist() for p in model.parameters()]
    return out


def colliding(rank, world, device="cpu"):
    from netsense.compression import register

    model = torch.nn.Linear(4, 1, bias=False)
    ddp = in_ddp(model, device=device)
    register(ddp, {"method": "topk", "density": 0.25})  # k = 1 of 4
    x = {0: [5.0, 0.0, 0.0, -1.0], 1: [-3.0, 0.0, 0.5, 2.0]}[rank]
    ddp(torch.tensor([x], device=device)).sum().backward()  # d/dw = x; step 0 is compressed like any other
    return model.weight.grad.view(-1).tolist()


def conservation(rank, world, steps, device="cpu"):
    """Sum of averaged results * world == sum of all ranks' gradients - residuals."""
    import torch.distributed as dist

    from netsense.compression import register

    model = torch.nn.Linear(50, 1, bias=False)
    ddp = in_ddp(model, device=device)
    state = register(ddp, {"method": "topk", "density": 0.1})
    fed = torch.zeros(50, device=device)
    received = torch.zeros(50, device=device)
    for step in range(steps):
        ddp.zero_grad()
        x = torch.randn(1, 50, generator=torch.Generator().manual_seed(step * 10 + rank)).to(device)
        ddp(x).sum().backward()
        fed += x.view(-1)
        received += model.weight.grad.view(-1)
    residual = sum((r for r in state.memory.residuals.values()), torch.zeros(50, device=device))
    total_fed = fed.clone()
    dist.all_reduce(total_fed)
    total_residual = residual.clone()
    dist.all_reduce(total_residual)
    return (received * world).tolist(), (total_fed - total_residual).tolist()


def train_method(rank, world, method, steps, extra, device="cpu", hidden=64, lr=0.1, momentum=0.9):
    import torch.distributed as dist

    from netsense.compression import register

    model = in_ddp(tiny_mlp(hidden=hidden), {"method": method, **extra}, device)
    state = register(model, {"method": method, **extra})
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for step in range(steps):
        x, y = batch(rank, step, n=32)
        if method in ("netsense", "tta"):
            # Uneven, rank-dependent compute: raw timings differ across ranks, decisions must not.
            import time

            time.sleep(0.002 * (rank + 1) * (1 + step % 3))
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    state.finish()  # the last step's record, and its agreement drained
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    decisions = [(h["density"], h["fp16"], h["dense"]) for h in state.history]
    # final loss on a common held-out batch
    x, y = batch(99, 0, n=256)
    with torch.no_grad():
        held_out = float(torch.nn.functional.cross_entropy(model.module(x.to(device)), y.to(device)))
    dist.barrier()
    return flat.tolist(), decisions, held_out


def train_on_path(rank, world, native_ranks, steps, config):
    """train_method with the fused kernels on the ranks in native_ranks, PyTorch elsewhere."""
    import os

    from netsense.compression import native

    os.environ["NETSENSE_NATIVE"] = "1" if rank in native_ranks else "0"
    native.library.cache_clear()
    assert (native.library() is not None) == (rank in native_ranks)
    return train_method(rank, world, config.pop("method"), steps, config)


def sgd_run(rank, world, config, steps, momentum, weight_decay, device="cpu"):
    """Parameters after ``steps`` SGD steps, the optimizer built as the trainer builds it; and the hook's
    bucket layouts after step 0 and at the end (DDP rebuilds its buckets after step 0)."""
    from netsense.compression import register

    model = in_ddp(tiny_mlp(), device=device)
    state = register(model, config, momentum=momentum, weight_decay=weight_decay)
    m, wd = state.optimizer_terms(momentum, weight_decay)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=m, weight_decay=wd)
    layouts = []
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
        opt.step()
        local = getattr(state, "momentum", None)
        if local is not None and step in (0, steps - 1):
            layouts.append(sorted(local.layout.layouts.values()))
    state.finish()
    return [p.detach().view(-1).tolist() for p in model.parameters()], (m, wd), layouts


def corrected_conservation(rank, world, steps, masking, device="cpu"):
    """Momentum correction on sparse steps: what was received (x world) + the ranks' residuals == the sum of
    the ranks' velocities u_t = m u_{t-1} + g_t; and with
    masking, a sent coordinate's velocity is zero afterwards."""
    import torch.distributed as dist

    from netsense.compression import register

    model = torch.nn.Linear(50, 1, bias=False)
    ddp = in_ddp(model, device=device)
    # fp32 values: a sent coordinate's residual is then exactly 0 (at fp16 it holds the rounding)
    state = register(ddp, {"method": "topk", "density": 0.1, "values": "fp32", "momentumMasking": masking},
                     momentum=0.9)
    u = torch.zeros(50, device=device)
    velocities = torch.zeros(50, device=device)
    received = torch.zeros(50, device=device)
    masked_ok = True
    for step in range(steps):
        ddp.zero_grad()
        x = torch.randn(1, 50, generator=torch.Generator().manual_seed(step * 10 + rank)).to(device)
        ddp(x).sum().backward()  # d/dw = x (lr 0: no optimizer here)
        u = 0.9 * u + x.view(-1)
        velocities += u
        got = model.weight.grad.view(-1)
        received += got
        if masking:  # every step is sparse, step 0 too
            kept = next(iter(state.momentum.velocities.values()))
            sent_here = state.memory.residuals[0] == 0  # fp32: a sent coordinate's residual is exactly 0
            masked_ok = masked_ok and bool((kept[sent_here] == 0).all())
            u = kept.clone()  # the hook's u after masking, so the sum below follows it
    residual = state.memory.residuals[0].clone()
    for t in (velocities, residual):
        dist.all_reduce(t)
    return (received * world).tolist(), (velocities - residual).tolist(), masked_ok


# ---- tests ------------------------------------------------------------------------

def test_topk_at_density_one_equals_allreduce(device):
    dense = run_world(grads_after_one_step, 2, {"method": "allreduce"}, device)
    topk = run_world(grads_after_one_step, 2, {"method": "topk", "density": 1.0, "values": "fp32"}, device)
    for rank in range(2):
        for a, b in zip(dense[rank], topk[rank], strict=True):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


def test_colliding_indices_are_summed_with_signs(device):
    # rank 0 sends index 0 (+5), rank 1 sends index 0 (-3): (5 - 3) / 2 = 1.
    # Overwrite would give 5/2 or -3/2; |g| would give 4.
    results = run_world(colliding, 2, device)
    for r in results:
        assert r == pytest.approx([1.0, 0.0, 0.0, 0.0])


def test_error_feedback_conserves_the_gradient_sum(device):
    received, expected = run_world(conservation, 2, 7, device)[0]
    torch.testing.assert_close(torch.tensor(received), torch.tensor(expected), rtol=1e-4, atol=1e-4)


def test_momentum_correction_on_dense_steps_is_momentum_sgd(device):
    # topk's warm-up steps are dense: the hook's momentum and weight decay must reproduce the optimizer's,
    # across DDP laying its bucket out again after step 0 (here: the same parameters, in reverse order).
    plain = run_world(sgd_run, 2, {"method": "allreduce"}, 5, 0.9, 5e-3, device)
    owned = run_world(sgd_run, 2, {"method": "topk", "warmupSteps": 10}, 5, 0.9, 5e-3, device)
    assert plain[0][1] == (0.9, 5e-3) and owned[0][1] == (0.0, 0.0)  # the optimizer is told not to apply them
    after_step0, at_end = owned[0][2]
    assert after_step0 != at_end, "DDP's rebuilt layout was to move the velocities"
    for a, b in zip(plain[0][0], owned[0][0], strict=True):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-5, atol=1e-6)
    off = run_world(sgd_run, 2, {"method": "topk", "warmupSteps": 10, "momentumCorrection": False}, 5, 0.9, 5e-3,
                    device)
    assert off[0][1] == (0.9, 5e-3)


@pytest.mark.parametrize("masking", [False, True])
def test_momentum_correction_sends_the_velocities(device, masking):
    received, expected, masked_ok = run_world(corrected_conservation, 2, 7, masking, device)[0]
    torch.testing.assert_close(torch.tensor(received), torch.tensor(expected), rtol=1e-4, atol=1e-4)
    assert masked_ok


# Settings under which every compressing method compresses within 8 steps of the tiny MLP on loopback. At
# their defaults whether tta and dc2 compress at all there depends on the machine's load (seen: every step
# dense for both; dc2 sparse only from step 5), and where they do not the agreement check compares the dense
# all-reduce with itself.
AGREEMENT_SETTINGS = {
    "powersgd": {"startIter": 2},
    "tta": {"kneeDensity": 1e-4},  # TopK costs (almost) no extra steps: any saving on the wire makes it sparse
    "dc2": {"delayTarget": 1e-4},  # a delay budget of 1e-4 x the compute: the density falls at its first update
}
# On a GPU even that leaves tta dense after step 0 (seen on an H200: a TopK selection's kernel launches cost
# more than the whole tiny model on loopback, so dense is the right choice). A model over the first probe's
# 64 KB makes step 0 a sparse probe on any machine; on the CPU tta must also choose a sparse step from its
# measurements (on a GPU its measured choices agree, dense).
AGREEMENT_HIDDEN = {"tta": 1024}
ALWAYS_DENSE = {"allreduce", "fp16"}


def test_every_method_keeps_ranks_identical_and_decisions_agree(device):
    """Every rank ends with the same weights and recorded the same decisions, and every compressing method
    did compress (a step not sent dense): ranks agree on sparse steps too, where k, the fp16 gate and the
    collective follow from measurements each rank took on its own."""
    for method in METHODS:
        results = run_world(train_method, 3, method, 8, AGREEMENT_SETTINGS.get(method, {}), device,
                            AGREEMENT_HIDDEN.get(method, 64))
        params = [torch.tensor(r[0]) for r in results]
        for p in params[1:]:
            torch.testing.assert_close(p, params[0], rtol=0, atol=0, msg=f"{method}: ranks diverged")
        decisions = [r[1] for r in results]
        assert decisions[1:] == decisions[:1] * 2, f"{method}: ranks decided differently"
        compressed = sum(not dense for _, _, dense in decisions[0])
        if method in ALWAYS_DENSE:
            assert compressed == 0, f"{method}: {decisions[0]}"
        else:
            assert compressed >= 1, f"{method} never compressed in 8 steps: the agreement check tested nothing"
        if method == "tta" and device == "cpu":  # a sparse step chosen from measurements, not only step 0's probe
            assert any(not dense for _, _, dense in decisions[0][1:]), f"tta: {decisions[0]}"


# Plain SGD (no momentum), so that what a step does not send is missing from the model: with the optimizer's
# momentum 0.9 TopK without error feedback ended where TopK with it did (0.214 against 0.210 held-out loss at
# 20%) and the bound passed it. Each method's settings pin what would otherwise follow loopback timing, which
# differs from machine to machine: the paper's netsense (no error feedback) at a 20% ratio runs its whole
# pipeline (pruning, TopK, no residual) the same everywhere; dc2 and tta choose their densities from it, at 1%
# or more (dc2 at its 0.1% floor ended at 1.47x allreduce's loss on one seed of five: 2 of 1669 values a step).
TRAINING_SETTINGS = {
    "topk": {"density": 0.01},
    "netsense": {"initialRatio": 0.2, "minRatio": 0.2, "maxRatio": 0.2},
    "dc2": {"minDensity": 0.01},
    "tta": {"minDensity": 0.01},
}
# Held-out loss after 60 steps (lr 0.5), measured on seeds 0-4 (seed 0 is this test's; the others varied the
# initial weights and the batches): allreduce 0.263, 0.293, 0.303, 0.267, 0.292, fp16 the same to 3 decimals.
# Over allreduce's: with error feedback PowerSGD rank 1 1.02-1.10, TopK 1% 0.97-1.10 (without it 2.58-3.13),
# dc2 0.93-1.08 (seeds 0-6), tta 0.99-1.03; the paper's netsense without it 1.10-1.19.
ERROR_FEEDBACK = {"powersgd", "topk", "dc2", "tta"}


def test_methods_train_about_as_well_as_allreduce():
    """Each method's held-out loss after the same 60 steps, against allreduce's: fp16 the same; a method with
    error feedback within 1.2x + 0.05 (what it did not send yet is sent later; TopK without it ends near 3x);
    the paper's netsense, which drops what it does not send, within 1.3x + 0.05."""
    steps = 60
    held_out = {}
    for method in METHODS:
        held_out[method] = run_world(train_method, 2, method, steps, TRAINING_SETTINGS.get(method, {}), "cpu", 64,
                                     0.5, 0.0)[0][2]
    base = held_out["allreduce"]
    assert base < 0.5, f"allreduce itself did not train: held-out loss {base:.3f}"
    assert abs(held_out["fp16"] - base) <= 0.01, f"fp16: held-out loss {held_out['fp16']:.3f} vs allreduce {base:.3f}"
    for method, loss in held_out.items():
        bound = base * 1.2 + 0.05 if method in ERROR_FEEDBACK else base * 1.3 + 0.05
        assert loss <= bound, f"{method}: held-out loss {loss:.3f} vs allreduce {base:.3f} (bound {bound:.3f})"


def test_world_size_one_works_for_every_method():
    """A single worker (a laptop, a smoke test) trains under every method: a record per step, finite
    weights, and a held-out loss that falls from the untrained model's."""
    x, y = batch(99, 0, n=256)
    with torch.no_grad():
        untrained = float(torch.nn.functional.cross_entropy(tiny_mlp()(x), y))
    for method in METHODS:
        (flat, decisions, held_out), = run_world(train_method, 1, method, 20,
                                                 {"startIter": 2} if method == "powersgd" else {})
        assert len(decisions) == 20, method
        assert all(math.isfinite(v) for v in flat), method
        # The paper's netsense runs without error feedback: it drops the ~98% of each step it does not send, so
        # in 20 steps it falls least (1.45 from 1.61 here); every other method by a tenth or more.
        bar = untrained if method == "netsense" else 0.9 * untrained
        assert held_out < bar, f"{method}: {held_out:.3f} vs untrained {untrained:.3f}"


def aimd_after_the_warm_up(rank, world):
    """The paper's policy after a dense warm-up step (warmupSteps: 1) and two compressed steps, on a real gang."""
    from netsense.compression import register

    model = in_ddp(tiny_mlp())
    state = register(model, {"method": "netsense", "quantize": False, "warmupSteps": 1})
    for step in range(3):
        x, y = batch(rank, step)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
    state.finish()
    return state.policy.in_startup, state.policy.ratio


def test_the_paper_policy_senses_the_dense_warm_up_step_without_reacting_to_it():
    """A dense warm-up step (asked for) is not the AIMD's choice: after it the start-up doubles the initial 1%
    (on loopback the small payloads stay far below the BDP) rather than halving it at once."""
    for in_startup, ratio in run_world(aimd_after_the_warm_up, 2):
        assert in_startup and ratio == pytest.approx(0.02)


def test_netsense_payload_shrinks_on_a_slow_measurement():
    from netsense.control.aimd import PaperAIMD
    from netsense.control.decision import StepMeasurement

    p = PaperAIMD(initial=0.5, startup=False, quantize=False)
    p.update(StepMeasurement(1e6, 1e6, 0.1, 0.1, 1.0))
    assert p.ratio == pytest.approx(0.25)  # payload == BDP > 0.9 BDP: x alpha


@pytest.mark.parametrize("bad, field", [
    ({"method": "zip"}, "compression.method"),
    ({"method": "topk", "density": 0}, "compression.density"),
    ({"method": "topk", "density": 1.5}, "compression.density"),
    ({"method": "netsense", "alpha": -0.5}, "compression.alpha"),
    ({"method": "netsense", "beta": "fast"}, "compression.beta"),
    ({"method": "netsense", "initialRatio": 0.0001, "minRatio": 0.01}, "compression.initialRatio"),
    ({"method": "topk", "densty": 0.1}, "compression.densty"),
])
def test_bad_configuration_fails_naming_the_field(bad, field):
    with pytest.raises(SpecError) as e:
        validate_config(bad)
    assert str(e.value).startswith(field + ":")


def test_fast_topk_selects_exactly_the_largest(device):
    g = torch.Generator().manual_seed(0)
    on_device = torch.Generator(device=device).manual_seed(0)
    for n, k in [(1_000_000, 10_000), (1_000_003, 10_000), (1_000_000, 100_000), (300_000, 3), (1000, 10),
                 (100_000, 100_000), (2_000_000, 500_000)]:
        x = torch.randn(n, generator=g).abs()
        got = set(topk_indices(x.to(device), k, on_device, Workspace()).tolist())
        want = set(torch.topk(x, k).indices.tolist())
        assert len(got) == k
        assert got == want


def powersgd_two_buckets(rank, world):
    """Rank-1 PowerSGD (dense before step 2) on a model of two 1 MB layers, which DDP puts in two buckets. Per
    step, the matrix rank of each weight's received gradient; the buckets the hook kept a residual for; the
    largest difference of this rank's received gradients from rank 0's; and of world x everything received
    from everything the ranks fed in less the residuals they hold (relative to the largest entry fed in)."""
    import copy

    import torch.distributed as dist

    from netsense.compression import register

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))  # > 1 MB
    local = copy.deepcopy(model)  # the same weights (nothing steps them): each rank's own gradient, uncompressed
    # fp32 factors: at fp16 the all_reduce sums them in fp16, and that rounding is held by no rank (nothing lost
    # beyond it: test_powersgd's fp16 test)
    config = {"method": "powersgd", "startIter": 2, "values": "fp32"}
    ddp = in_ddp(model, config)
    state = register(ddp, config)
    params, local_params = list(model.parameters()), list(local.parameters())
    received = [torch.zeros_like(p) for p in params]
    fed = [torch.zeros_like(p) for p in params]
    matrix_ranks = []
    for step in range(5):
        ddp.zero_grad()
        local.zero_grad()
        x = torch.randn(8, 512, generator=torch.Generator().manual_seed(step * 10 + rank))
        ddp(x).pow(2).mean().backward()
        local(x).pow(2).mean().backward()
        for got, sent, p, q in zip(received, fed, params, local_params, strict=True):
            got += p.grad
            sent += q.grad
        matrix_ranks.append([int(torch.linalg.matrix_rank(p.grad)) for p in params if p.dim() == 2])
    state.finish()
    flat = torch.cat([g.view(-1) for g in received])
    first = flat.clone()
    dist.broadcast(first, 0)
    held = torch.cat([state.memory.layout.by_param[id(p)].view(-1) for p in params])
    totals = torch.stack([torch.cat([f.view(-1) for f in fed]), held])
    dist.all_reduce(totals)
    lost = float((world * flat - (totals[0] - totals[1])).abs().max() / totals[0].abs().max())
    return matrix_ranks, sorted(state.memory.residuals), float((flat - first).abs().max()), lost


def test_powersgd_with_several_buckets_agrees_across_ranks_and_keeps_what_it_did_not_send():
    """On gloo, with the model in several buckets (which torch's own hook could not run without a deadlock):
    every rank receives the same gradients; the dense steps before startIter are of full rank and the
    compressed ones of rank 1; and with error feedback nothing is lost, weights and biases alike: world x
    what was received == what the ranks fed in - what they still hold."""
    results = run_world(powersgd_two_buckets, 2, timeout=120)
    for matrix_ranks, buckets, apart, lost in results:
        assert len(buckets) >= 2, f"the model was to take several buckets: {buckets}"
        assert [min(r) for r in matrix_ranks[:2]] == [16, 16] and [max(r) for r in matrix_ranks[2:]] == [1, 1, 1], \
            matrix_ranks  # the mean of 2 ranks' batches of 8: rank 16
        assert apart == 0, f"the ranks received different gradients (by {apart})"
        assert lost < 1e-5, f"PowerSGD lost {lost:.2e} of the gradient"


def _native():
    from netsense.compression import native

    if native.library() is None:
        pytest.fail("the native kernels did not build (is g++ installed?)")
    return native


@pytest.mark.parametrize("fp16", [False, True])
def test_native_selection_is_exact_and_keeps_what_it_did_not_send(fp16):
    native = _native()
    g = torch.Generator().manual_seed(1)
    cases = [(1_000_000, 10_000), (1_000_003, 100_000), (300_000, 3), (1000, 10), (5000, 5000), (64, 63)]
    for n, k in cases:
        residual = torch.randn(n, generator=g)
        grad = torch.randn(n, generator=g)
        if n == 1_000_003:  # heavy ties: magnitudes on a coarse grid
            residual.zero_()
            grad = grad.mul(4).round()
        signal = residual + grad
        packed = native.Selector().select(residual, grad, k, fp16, True, g)
        idx = packed[:4 * k].view(torch.int32).long()
        val = packed[4 * k:].view(torch.float16 if fp16 else torch.float32).float()
        assert idx.numel() == k and bool((idx[1:] > idx[:-1]).all()), f"n={n}: not k ascending indices"
        want = torch.topk(signal.abs(), k).values.sort().values
        torch.testing.assert_close(signal.abs()[idx].sort().values, want, rtol=0, atol=0)
        torch.testing.assert_close(val, signal[idx].half().float() if fp16 else signal[idx], rtol=0, atol=0)
        # error feedback: what is left plus what was sent is the whole signal
        torch.testing.assert_close(residual.index_add(0, idx, val), signal, rtol=0, atol=1e-6)


def test_native_selection_is_one_pass_on_a_periodic_gradient():
    # A 3x3 conv on 1x1 feature maps (ResNet18's last block on 32x32 images) has
    # gradient only in each kernel's centre tap: every 9th element. The threshold
    # sample must not fall in step with that period (a stride of 18 here would
    # sample only zeros or only centre taps, and rescan the bucket every step).
    native = _native()
    g = torch.Generator().manual_seed(4)
    n = 65_536 * 18
    selector = native.Selector()
    residual = torch.zeros(n)
    for _ in range(5):
        grad = torch.zeros(n)
        grad[4::9] = torch.randn(len(range(4, n, 9)), generator=g)
        packed = selector.select(residual, grad, n // 100, True, True, g)
        assert packed.numel() == n // 100 * 6
    assert selector.retries == 0


def test_fast_topk_is_exact_on_a_periodic_gradient():
    g = torch.Generator().manual_seed(5)
    n, k = 65_536 * 18, 10_000
    x = torch.zeros(n)
    x[4::9] = torch.randn(len(range(4, n, 9)), generator=g).abs()
    assert set(topk_indices(x, k, g, Workspace()).tolist()) == set(torch.topk(x, k).indices.tolist())


def test_native_selection_fails_clearly_on_nan_instead_of_spinning():
    native = _native()
    signal = torch.full((1000,), float("nan"))
    signal[:5] = 1.0
    with pytest.raises(FloatingPointError, match="NaN"):
        native.Selector().select(signal, None, 10, False, False, torch.Generator())


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_the_prune_threshold_leaves_the_asked_fraction_below_it(fraction):
    """The paper's pruning zeroes the smallest-|weight| fraction: the sampled threshold puts that
    fraction below it within 1%, on weights of uneven scale by layer (the stratified sample sees each)."""
    from netsense.compression.selection import prune_threshold

    g = torch.Generator().manual_seed(0)
    weights = torch.cat([torch.randn(800_000, generator=g) * 0.01, torch.randn(300_000, generator=g)])
    t = prune_threshold(weights, fraction, torch.Generator().manual_seed(1))
    assert float((weights.abs() < t).float().mean()) == pytest.approx(fraction, abs=0.01)


def test_native_selection_skips_pruned_entries():
    native = _native()
    g = torch.Generator().manual_seed(2)
    n, k = 200_000, 2_000
    signal = torch.randn(n, generator=g)
    weights = torch.randn(n, generator=g)
    packed = native.Selector().select(signal.clone(), None, k, False, False, g, weights, prune_below=0.5)
    idx = packed[:4 * k].view(torch.int32).long()
    eligible = signal.abs().masked_fill(weights.abs() < 0.5, -1)
    assert bool((weights.abs()[idx] >= 0.5).all())
    assert set(idx.tolist()) == set(torch.topk(eligible, k).indices.tolist())


@pytest.mark.parametrize("k", [30, 3_000])  # scattered, merged
def test_native_decode_sums_every_rank_like_index_add(k):
    native = _native()
    g = torch.Generator().manual_seed(3)
    n, world = 100_000, 3
    chunks = [native.Selector().select(torch.randn(n, generator=g), None, k, True, False, g).clone()
              for _ in range(world)]
    # Entries 0 and 1 swapped (indices and values): not ascending, as from the PyTorch path.
    shuffled = chunks[1].clone()
    shuffled[:4 * k].view(torch.int32)[:2] = chunks[1][:4 * k].view(torch.int32)[:2].flip(0)
    shuffled[4 * k:].view(torch.float16)[:2] = chunks[1][4 * k:].view(torch.float16)[:2].flip(0)
    for case in (chunks, [chunks[0], shuffled, chunks[2]]):
        want = torch.zeros(n)
        for c in case:
            want.index_add_(0, c[:4 * k].view(torch.int32).long(), c[4 * k:].view(torch.float16).float() / world)
        got = torch.full((n,), float("nan"))
        native.decode(got, case, k, True, world)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_decode_reads_only_the_selection_of_a_padded_chunk(path, monkeypatch):
    """A padded probe's chunk holds k + pad indices, then k + pad values; only the first k of each are the
    selection, and only they are decoded (decoding the padding is work no step needs). The padding here is not
    zeros, so reading it would show."""
    from netsense.compression import native
    from netsense.compression.compressor import TopK
    if path == "native":
        _native()
    else:
        monkeypatch.setattr(native, "usable", lambda t: False)
    g = torch.Generator().manual_seed(4)
    n, world, k, pad = 50_000, 2, 40, 400
    chunks, padded = [], []
    for _ in range(world):
        idx = torch.randperm(n, generator=g)[:k].sort().values.to(torch.int32)
        values = torch.randn(k, generator=g).half()
        chunks.append(torch.cat([idx.view(torch.uint8), values.view(torch.uint8)]))
        junk_idx = torch.randint(0, n, (pad,), generator=g, dtype=torch.int32)
        junk = torch.ones(pad).half()
        padded.append(torch.cat([idx.view(torch.uint8), junk_idx.view(torch.uint8),
                                 values.view(torch.uint8), junk.view(torch.uint8)]))
    want = TopK.decompress(torch.full((n,), float("nan")), chunks, k, True, world)
    got = TopK.decompress(torch.full((n,), float("nan")), padded, k, True, world, k + pad)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_native_and_pytorch_paths_train_identically_even_mixed():
    config = {"method": "topk", "density": 0.05}
    runs = {name: run_world(train_on_path, 2, ranks, 6, dict(config))
            for name, ranks in [("native", [0, 1]), ("pytorch", []), ("mixed", [1])]}
    base = torch.tensor(runs["native"][0][0])
    for name, results in runs.items():
        for rank, r in enumerate(results):
            torch.testing.assert_close(torch.tensor(r[0]), base, rtol=0, atol=1e-7,
                                       msg=f"{name} rank {rank} differs from the native run")

