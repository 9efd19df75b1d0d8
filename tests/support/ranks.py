"""Run a function on N gloo ranks on loopback (spawned processes) and collect results."""

from __future__ import annotations

import multiprocessing as mp
import traceback

from netsense.emulation.loopback import free_port


def _entry(fn, rank, world, port, queue, args):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        queue.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(fn, world: int, *args, timeout: float = 240.0) -> list:
    """fn(rank, world, *args) on each rank; returns the list of results by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, queue, args)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {timeout}s")
            if queue.empty():
                if any(p.exitcode not in (None, 0) for p in procs) and queue.empty():
                    time.sleep(0.5)
                    if queue.empty():
                        raise RuntimeError("a rank died without reporting")
                time.sleep(0.05)
                continue
            rank, status, value = queue.get()
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


# ---- what a rank trains in the compression tests (module level: rank functions are pickled) ----------------------

def in_ddp(model, config: dict | str | None = None, device: str = "cpu"):
    """``model`` under DDP as the trainer wraps it: gradient_as_bucket_view and the method's own options."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from netsense.compression import ddp_options

    model.to(device)
    return DDP(model, device_ids=[0] if device == "cuda" else None, gradient_as_bucket_view=True,
               **ddp_options(config, "gloo"))


def ddp_with_hook(model, config: dict, momentum: float = 0.0):
    """``in_ddp(model, config)`` with the method's hook registered, as the trainer does; and the hook's state."""
    from netsense.compression import register

    wrapped = in_ddp(model, config)
    return wrapped, register(wrapped, config, momentum=momentum)


def tiny_mlp(seed: int = 0, hidden: int = 64):
    """20 inputs, ``hidden`` units, 5 classes: two matrices and two biases, seeded."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 5))


def batch(rank: int, step: int, n: int = 16):
    """A rank's batch at a step for tiny_mlp: 20 normal features, labelled by the largest of the first five."""
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(n, 20, generator=g)
    return x, x[:, :5].argmax(1)
