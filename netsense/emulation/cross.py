"""Cross traffic: background TCP flows that compete with training at the shared link.

The runner starts one sender in host x0 (rack A) and one receiver in x1 (rack
B) of a shared-topology cluster (netsense.emulation.cluster). Flows follow the
job's schedule (``spec.network.crossTraffic``) on the training clock, like the
bandwidth profile: a flow sends while the clock runs and the schedule has it
on, and stands still while the trainer evaluates (the clock stands then).

    python -m netsense.emulation.cross recv PORT CLOCK OUT.csv
    python -m netsense.emulation.cross send ADDR PORT CLOCK FLOWS_JSON

The receiver writes one row per flow every 100 ms of wall time that the clock
ran: the training clock at the end of the interval, the flow, its bytes and
Mbit/s over the interval (its goodput: counted where it arrives). Rows are
flushed as written, so a killed receiver loses at most one interval.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from netsense import units
from netsense.emulation.bulk import set_congestion_control
from netsense.shaping.shaper import clock_seconds, read_clock

BIN_S = 0.1
CHUNK = 64 * 1024
NAME_BYTES = 32  # each connection opens with its flow's name, padded
FIELDS = ["t", "flow", "bytes", "mbit"]


@dataclass(frozen=True)
class Flow:
    """One TCP connection's schedule on the training clock (seconds)."""

    name: str
    start: float = 0.0
    stop: float | None = None
    on: float | None = None  # with off: an on/off cycle from start; None: always on
    off: float | None = None
    cc: str | None = None  # TCP congestion control; None: the namespace's default

    def active(self, t: float) -> bool:
        if t < self.start or (self.stop is not None and t >= self.stop):
            return False
        if self.on is None or self.off is None:
            return True
        return (t - self.start) % (self.on + self.off) < self.on


def flows_from_spec(cross_traffic: list[dict]) -> list[Flow]:
    """The spec's crossTraffic entries as one Flow per connection, named <type><entry>-<connection>."""
    out = []
    for i, entry in enumerate(cross_traffic or []):
        start, stop, on, off = (units.parse_duration(entry[k]) if entry.get(k) is not None else None
                                for k in ("start", "stop", "onFor", "offFor"))
        out += [Flow(f"{entry['type']}{i}-{k}", start or 0.0, stop, on, off, entry.get("congestionControl"))
                for k in range(entry["flows"])]
    return out


class Clock:
    """The training clock from the trainer's file, re-read at most every 10 ms."""

    def __init__(self, path: str):
        self.path, self.read_at, self.value = path, 0.0, None

    def now(self) -> tuple[float | None, bool]:
        """(seconds on the training clock or None before it starts, whether it runs)."""
        if time.monotonic() - self.read_at > 0.01:
            self.read_at, self.value = time.monotonic(), read_clock(self.path)
        if self.value is None:
            return None, False
        return clock_seconds(*self.value), self.value[1] is None


def send(addr: str, port: int, clock_path: str, flows: list[Flow], stop: threading.Event) -> None:
    """One thread per flow; each sends whenever its schedule and the running clock say so."""

    def run(flow: Flow) -> None:
        clock = Clock(clock_path)
        deadline = time.monotonic() + 30
        while True:
            try:
                sock = socket.create_connection((addr, port), timeout=1)
                break
            except OSError:
                if stop.is_set() or time.monotonic() > deadline:
                    return
                time.sleep(0.1)
        if flow.cc:
            set_congestion_control(sock, flow.cc)
        sock.sendall(flow.name.encode().ljust(NAME_BYTES, b" "))
        sock.settimeout(0.05)  # so an off period or a stop is seen within 50 ms
        buf = b"\0" * CHUNK
        with sock:
            while not stop.is_set():
                t, running = clock.now()
                if not running or not flow.active(t):
                    stop.wait(0.01)
                    continue
                try:
                    sock.send(buf)
                except TimeoutError:
                    continue
                except OSError:
                    return  # the receiver went away: the run is ending

    threads = [threading.Thread(target=run, args=(f,), daemon=True) for f in flows]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def recv(port: int, clock_path: str, out: str, stop: threading.Event) -> None:
    counts: dict[str, int] = {}
    lock = threading.Lock()
    srv = socket.create_server(("0.0.0.0", port), backlog=64)
    srv.settimeout(0.2)

    def drain(conn: socket.socket) -> None:
        with conn:
            name = b""
            while len(name) < NAME_BYTES:
                data = conn.recv(NAME_BYTES - len(name))
                if not data:
                    return
                name += data
            flow = name.decode().strip()
            with lock:
                counts.setdefault(flow, 0)
            while data := conn.recv(1 << 20):
                with lock:
                    counts[flow] += len(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    clock = Clock(clock_path)
    with open(out, "w", buffering=1) as fh:
        fh.write(",".join(FIELDS) + "\n")
        last = time.monotonic()
        while not stop.wait(BIN_S - (time.monotonic() - last) % BIN_S):
            now = time.monotonic()
            t, running = clock.now()
            with lock:
                got = dict(counts)
                counts.update((k, 0) for k in counts)
            if running and t is not None:
                for flow, n in sorted(got.items()):
                    fh.write(f"{t:.3f},{flow},{n},{n * 8 / (now - last) / 1e6:.3f}\n")
            last = now
    srv.close()


def main(argv: list[str]) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cmd, args = argv[0], argv[1:]
    if cmd == "recv":
        recv(int(args[0]), args[1], args[2], stop)
    elif cmd == "send":
        send(args[0], int(args[1]), args[2], [Flow(**f) for f in json.loads(args[3])], stop)
    else:
        print(f"unknown command {cmd!r}: recv or send", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
