"""What a test started, and only that: its processes (by PID and start time, never by name) and its network
namespaces (by the owner the emulated cluster records), so a test run beside a user's `netsense run` or a
benchmark never reads, signals or blames what it did not start.

    with Watched.popen([...netsense run...]) as run:     # samples the run's descendants while it lives
        ...
        run.namespaces()                                  # the namespaces that run owns now
    assert not run.leftovers()                            # its processes still alive after it ended
    assert not leaked_namespaces(before, run.pid)
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

from netsense.emulation import cluster as cl

# ---- processes ---------------------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks) of a live process; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid``: PID -> start time (a PID and its start time name one process)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))):
            children.setdefault(st[0], []).append(int(name))
            started[int(name)] = st[1]
    out, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child in started and child not in out:
                out[child] = started[child]
                todo.append(child)
    return out


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(processes: dict[int, int]) -> dict[int, int]:
    """Those of ``processes`` (PID -> start time) still running (the same process, not a reused PID)."""
    out = {}
    for pid, start in processes.items():
        st = _stat(pid)
        if st is not None and st[1] == start:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out[pid] = start
    return out


class Watched:
    """A child process and every process it starts, sampled while it lives (orphans are re-parented to init
    at its exit, so they must be seen before). Kills all of them on exit from the `with`, so a failing test
    leaves nothing running."""

    def __init__(self, proc: subprocess.Popen, every_s: float = 0.1):
        self.proc, self.pid = proc, proc.pid
        self.seen: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every_s,), daemon=True)
        self._thread.start()

    @classmethod
    def popen(cls, argv: list[str], **kwargs) -> Watched:
        return cls(subprocess.Popen(argv, **kwargs))

    def _sample(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.seen.update(descendants(self.pid))
            if self.proc.poll() is not None:
                return
            self._stop.wait(every_s)

    def processes(self) -> dict[int, int]:
        self.seen.update(descendants(self.pid))
        return alive(self.seen)

    def with_env(self, **want: str) -> list[int]:
        """Its live processes whose environment has these variables (e.g. RANK="1")."""
        return [pid for pid in self.processes() if all(environ(pid).get(k) == v for k, v in want.items())]

    def rank(self, rank: int) -> list[int]:
        """Its live processes of worker ``rank``: spawned (RANK in their environment) or forked from the
        simulated clock's server (named netsense-r<rank>: a fork keeps the server's environment block)."""
        return [pid for pid in self.processes()
                if environ(pid).get("RANK") == str(rank) or _comm(pid) == f"netsense-r{rank}"]

    def namespaces(self) -> list[str]:
        return namespaces_of(self.pid)

    def leftovers(self, grace_s: float = 2.0) -> dict[int, int]:
        """Its processes still alive ``grace_s`` after it ended."""
        deadline = time.monotonic() + grace_s
        while (left := alive(self.seen)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in alive(self.seen):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for ns in namespaces_of(self.pid):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


# ---- network namespaces --------------------------------------------------------------------------------------

def owners() -> dict[str, int]:
    """Namespace -> the PID of the emulated cluster that created it (its state file, written before any)."""
    out: dict[str, int] = {}
    if os.path.isdir(cl.STATE_DIR):
        for name in os.listdir(cl.STATE_DIR):
            try:
                with open(os.path.join(cl.STATE_DIR, name)) as fh:
                    state = json.load(fh)
            except (OSError, ValueError):
                continue
            out.update({ns: state["pid"] for ns in state.get("namespaces", [])})
    return out


def ours() -> set[str]:
    """The emulated cluster's namespaces on this machine, anyone's."""
    return {ns for ns in cl.list_namespaces() if ns.startswith(cl.PREFIX)}


def namespaces_of(pid: int) -> list[str]:
    present = ours()
    return sorted(ns for ns, owner in owners().items() if owner == pid and ns in present)


def leaked_namespaces(before: set[str], pid: int | None = None) -> set[str]:
    """Namespaces that appeared since ``before`` and are ``pid``'s (default: this process's) or have no live
    owner, a second later (another run's short-lived probe or its cluster are not ours to blame)."""
    pid = os.getpid() if pid is None else pid

    def suspects() -> set[str]:
        owned = owners()
        return {ns for ns in ours() - before
                if owned.get(ns) == pid or owned.get(ns) is None or not cl._pid_alive(owned[ns])}

    if not suspects():
        return set()
    time.sleep(1)
    return suspects()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""
