"""The communicator: a collective launched asynchronously, its busy time recorded, and the bucket's result
built in its completion callback, so communication overlaps the rest of the backward pass."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from netsense.compression.timing import IntervalTimer


def launch(start: Callable[[], torch.futures.Future], timer: IntervalTimer,
           then: Callable[[torch.futures.Future], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
    """``start()`` launches the communication and returns its future; ``then`` turns its completion into
    the bucket's tensor. The interval between the two goes to ``timer`` (CUDA events on GPUs)."""
    token = timer.start()
    fut = start()

    def finish(f: torch.futures.Future) -> torch.Tensor:
        timer.stop(token)
        return then(f)

    return fut.then(finish)


def allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None, timer: IntervalTimer,
              then: Callable[[torch.futures.Future], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
    return launch(lambda: dist.all_reduce(tensor, group=group, async_op=True).get_future(), timer, then)


def allgather(outputs: list[torch.Tensor], packed: torch.Tensor, group: dist.ProcessGroup | None,
              timer: IntervalTimer, then: Callable[[torch.futures.Future], torch.Tensor]
              ) -> torch.futures.Future[torch.Tensor]:
    return launch(lambda: dist.all_gather(outputs, packed, group=group, async_op=True).get_future(), timer, then)
