"""Run a function on N gloo ranks on loopback (spawned processes) and collect results."""

from __future__ import annotations

import multiprocessing as mp
import traceback

from support.net import free_port


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
