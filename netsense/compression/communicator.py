"""The communicator: a collective launched asynchronously, its busy time recorded, and the bucket's result
built in its completion callback, so communication overlaps the rest of the backward pass.

With ``null`` (spec training.nullWire: the benchmark's contention-matched ceiling) a collective moves no bytes:
each rank's own contribution stands in for every rank's (an all_reduce's sum is world x its own tensor, an
all_gather's chunks are copies of its own), and a one-element all_reduce keeps the ranks in step. Everything
else a step does, compression, error feedback, decoding every chunk, runs as it would: what is left of a step's
time beyond such a run's is the network's."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from netsense.compression.timing import IntervalTimer


def launch(start: Callable[[], torch.futures.Future], timer: IntervalTimer,
           then: Callable[[torch.futures.Future], torch.Tensor], kind: str = "all_reduce",
           wire_bytes: float = 0.0) -> torch.futures.Future[torch.Tensor]:
    """``start()`` launches the communication and returns its future; ``then`` turns its completion into
    the bucket's tensor. The interval between the two goes to ``timer`` (CUDA events on GPUs); ``kind`` and
    ``wire_bytes`` (this rank's bytes on the wire, the algorithm counted) price it on a modeled clock."""
    token = timer.start(kind, wire_bytes)
    fut = start()

    def finish(f: torch.futures.Future) -> torch.Tensor:
        timer.stop(token)
        return then(f)

    return fut.then(finish)


def in_step(result: list[torch.Tensor], group: dist.ProcessGroup | None) -> torch.futures.Future:
    """A null collective's future: a one-element all_reduce (the ranks stay in step), whose value is ``result``,
    built locally beforehand."""
    token = torch.zeros(1, device=result[0].device)
    return dist.all_reduce(token, group=group, async_op=True).get_future().then(lambda _: result)


def _all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None, null: bool) -> torch.futures.Future:
    if null:  # the sum of world copies of this rank's own tensor
        return in_step([tensor.mul_(dist.get_world_size(group))], group)
    return dist.all_reduce(tensor, group=group, async_op=True).get_future()


def allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None, timer: IntervalTimer,
              then: Callable[[torch.futures.Future], torch.Tensor], null: bool = False, wire_bytes: float = 0.0
              ) -> torch.futures.Future[torch.Tensor]:
    return launch(lambda: _all_reduce(tensor, group, null), timer, then, "all_reduce", wire_bytes)


def allreduce_now(tensor: torch.Tensor, group: dist.ProcessGroup | None, null: bool = False) -> None:
    """A blocking all_reduce (the caller times it)."""
    _all_reduce(tensor, group, null).wait()


def allgather(outputs: list[torch.Tensor], packed: torch.Tensor, group: dist.ProcessGroup | None,
              timer: IntervalTimer, then: Callable[[torch.futures.Future], torch.Tensor], null: bool = False,
              wire_bytes: float = 0.0) -> torch.futures.Future[torch.Tensor]:
    if null:
        def copies() -> torch.futures.Future:
            for out in outputs:
                out.copy_(packed)
            return in_step(outputs, group)

        return launch(copies, timer, then, "all_gather", wire_bytes)
    return launch(lambda: dist.all_gather(outputs, packed, group=group, async_op=True).get_future(), timer, then,
                  "all_gather", wire_bytes)
