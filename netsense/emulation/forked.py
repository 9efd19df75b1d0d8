"""Workers forked from a server that imported the trainer once: one process a rank, as before, at a fraction of
the memory and start-up.

A worker started as ``python -m netsense worker`` imports torch itself, and torch's libraries (the CUDA build's
included) are relocated into each process's private memory: measured on this machine, ~310 MiB private a worker
for a 0.27M-parameter MLP (testbed/EVALUATION.md, "At scale"), so 64 workers would need ~23 GiB of the 24,
and each spends ~2 s of a core importing. Forked from one process that imported the trainer (Python's
multiprocessing forkserver, with the trainer preloaded), every worker shares those pages copy-on-write and
starts in milliseconds. ``ps`` names it ``netsense-r<RANK>`` (its command line is the server's). Each worker is still its own process, in a session of its own (killed whole by its
group, as a spawned one), with its own environment, its own stdout and stderr, over gloo as before.

Used by the simulated clock's loopback hosts (netsense.emulation.loopback); the emulated cluster still spawns
each worker inside its host's network namespace with ``ip netns exec`` (entering a namespace after a fork needs
os.setns, Python 3.12).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import IO

PRELOAD = ["netsense.train.trainer", "netsense.emulation.preloaded"]  # torch and the trainer, then gc.freeze()
READY_TIMEOUT_S = 60.0  # a fork takes milliseconds; a machine swapping hard, seconds
_lock = threading.Lock()
_context: multiprocessing.context.ForkServerContext | None = None


def _server() -> multiprocessing.context.ForkServerContext:
    """This process's fork server (started on first use, with the trainer preloaded; it exits with us)."""
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _context = ctx
        return _context


def _worker(env: dict[str, str], stdout: Connection, stderr: Connection, ready: Connection) -> None:
    """The forked child: a session of its own (said on ``ready``: until then a signal to its group would miss
    it), its streams and environment, then `netsense worker`."""
    os.setsid()
    ready.send_bytes(b"session")
    ready.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    for fd in (null, stdout.fileno(), stderr.fileno()):
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    _name(f"netsense-r{env.get('RANK', '')}")
    from netsense.cli import cmd_worker

    cmd_worker(None)  # exits the process itself (os._exit), as `python -m netsense worker` does


def _name(name: str) -> None:
    """The process's name as ps and top show it (its command line is the server's): ``netsense-r<RANK>``."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name[:15])
    except OSError:
        pass  # not Linux, or /proc read-only: a name is a convenience


class ForkedWorker:
    """A forked worker with what the runner and stop_processes ask of a subprocess.Popen: pid, poll, wait,
    returncode and, when asked for subprocess.PIPE, stdout (bytes)."""

    def __init__(self, env: dict[str, str], stdout: int | IO | None, stderr: int | IO | None):
        self.stdout: IO[bytes] | None = None
        read_end = None
        if stdout == subprocess.PIPE:
            read_end, out_fd = os.pipe()
        else:
            out_fd = _own_fd(stdout, 1)
        # Connections travel to the child (the server passes their descriptors); ours are closed once it has them
        out, err = Connection(out_fd, readable=False), Connection(_own_fd(stderr, 2), readable=False)
        ready_r, ready_w = os.pipe()
        ready, told = Connection(ready_r, writable=False), Connection(ready_w, readable=False)
        try:
            self._process = _server().Process(target=_worker, args=(env, out, err, told), daemon=True)
            self._process.start()
        finally:
            out.close()
            err.close()
            told.close()
        try:  # returns once the worker leads its own session (or died first: EOF), as Popen after the exec
            if ready.poll(READY_TIMEOUT_S):
                ready.recv_bytes()
        except EOFError:
            pass
        finally:
            ready.close()
        if read_end is not None:
            self.stdout = os.fdopen(read_end, "rb")
        self.pid = self._process.pid
        self.args = ["netsense", "worker", "(forked)"]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode


def _own_fd(stream: int | IO | None, default: int) -> int:
    """A descriptor of our own for ``stream`` (as subprocess.Popen takes it), to close once the child has it."""
    if stream is None:
        return os.dup(default)
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY)
    return os.dup(stream if isinstance(stream, int) else stream.fileno())


def fork_worker(env: dict[str, str], stdout: int | IO | None = None, stderr: int | IO | None = None) -> ForkedWorker:
    """`netsense worker` with ``env``, forked from the server (module docstring)."""
    sys.stdout.flush()
    sys.stderr.flush()
    return ForkedWorker(env, stdout, stderr)
