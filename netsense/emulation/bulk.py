"""Minimal TCP transfers for measuring a shaped link (counted at the receiver).

    python -m netsense.emulation.bulk recv PORT SECONDS   # prints JSON: bytes per 0.1 s bin
    python -m netsense.emulation.bulk send HOST PORT SECONDS [CONGESTION_CONTROL]
    python -m netsense.emulation.bulk recv-payloads PORT SIZE...           # prints JSON: completion times
    python -m netsense.emulation.bulk send-payloads HOST PORT GAP SIZE...  # prints JSON: start times

Bulk: counting at the sender would include socket buffers (~20% high at 10
Mbit), so the receiver reports; bins let tests see when a rate change took effect.

Payloads: what a training step sends. After GAP seconds of idle link the sender
writes one payload; the receiver notes the moment it holds all of it and answers
one byte, which paces the next payload. Both sides read CLOCK_MONOTONIC, which
network namespaces share, so ``done - start`` is the payload's time on the link
as the receiver sees it, and ``size / (done - start)`` its apparent rate. A
shaper whose bucket holds a burst lets a short payload through faster than the
rate; this is how that shows.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

BIN_S = 0.1


def _accept(port: int) -> tuple[socket.socket, socket.socket]:
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(30)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return srv, conn


def _connect(host: str, port: int) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def recv(port: int, seconds: float) -> dict:
    srv, conn = _accept(port)
    conn.settimeout(max(5.0, seconds))
    start = time.monotonic()
    bins: list[int] = []
    total = 0
    while True:
        try:
            data = conn.recv(1 << 20)
        except TimeoutError:
            break
        if not data:
            break
        idx = int((time.monotonic() - start) / BIN_S)
        bins.extend([0] * (idx + 1 - len(bins)))
        bins[idx] += len(data)
        total += len(data)
    elapsed = time.monotonic() - start
    conn.close()
    srv.close()
    return {"bytes": total, "seconds": elapsed, "start": time.time() - elapsed, "bin_s": BIN_S, "bins": bins}


def send(host: str, port: int, seconds: float, cc: str | None = None) -> None:
    sock = _connect(host, port)
    if cc:
        set_congestion_control(sock, cc)
    chunk = b"\0" * (1 << 16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(chunk)
    sock.close()


def set_congestion_control(sock: socket.socket, name: str) -> None:
    """This connection's TCP congestion control (root may pick any the kernel has, not only the allowed)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    except OSError as e:
        raise OSError(e.errno, f"TCP congestion control {name!r}: {e.strerror} (available: "
                               f"{available_congestion_control()})") from None


def available_congestion_control() -> str:
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as fh:
        return fh.read().strip()


def recv_payloads(port: int, sizes: list[int]) -> dict:
    srv, conn = _accept(port)
    done = []
    buf = bytearray(1 << 20)
    for size in sizes:
        got = 0
        while got < size:
            n = conn.recv_into(buf, min(len(buf), size - got))
            if n == 0:
                raise ConnectionError(f"sender closed after {got} of {size} bytes")
            got += n
        done.append(time.monotonic())
        conn.sendall(b"k")
    conn.close()
    srv.close()
    return {"sizes": sizes, "done": done}


def send_payloads(host: str, port: int, gap_s: float, sizes: list[int]) -> dict:
    sock = _connect(host, port)
    started = []
    for size in sizes:
        time.sleep(gap_s)
        payload = bytes(size)
        started.append(time.monotonic())
        sock.sendall(payload)
        if sock.recv(1) != b"k":
            raise ConnectionError("receiver went away")
    sock.close()
    return {"sizes": sizes, "started": started}


def start_bulk(cluster, seconds: float, src: int = 0, dst: int = 1, port: int = 5001, cc: str | None = None):
    """A bulk TCP flow from host src to host dst of a LocalCluster for ``seconds``; several may run at once
    (give each its own port); ``cc``: its congestion control (default: the namespace's). Returns a handle for
    bulk_result."""
    me = [sys.executable, "-m", "netsense.emulation.bulk"]
    recv = cluster.spawn(dst, [*me, "recv", str(port), str(seconds + 10)], stdout=subprocess.PIPE)
    time.sleep(0.3)
    send = cluster.spawn(src, [*me, "send", cluster.address(dst), str(port), str(seconds), *([cc] if cc else [])])
    return recv, send, seconds


def bulk_result(handle) -> dict:
    """What the receiver counted (recv's JSON: bytes per BIN_S bin since it started)."""
    recv, send, seconds = handle
    out = json.loads(recv.communicate(timeout=seconds + 30)[0])
    send.wait(timeout=10)
    return out


def rate_between(out: dict, t0: float, t1: float) -> float:
    """bits/s received between t0 and t1 (seconds since the receiver's start); bins after the last byte
    arrived count as empty (a stalled link reads 0, not an error)."""
    first, last = int(t0 / out["bin_s"]), int(t1 / out["bin_s"])
    return sum(out["bins"][first:last]) * 8 / (max(1, last - first) * out["bin_s"])


def best_second(out: dict, t0: float, t1: float) -> float:
    """The fastest one-second window between t0 and t1: a shaper may never exceed its rate over a second (its
    bucket is well under a millisecond of it), while a busy machine only ever slows the sender."""
    n = round(1 / out["bin_s"])
    return max(rate_between(out, t0 + i * out["bin_s"], t0 + (i + n) * out["bin_s"])
               for i in range(int((t1 - t0) / out["bin_s"]) - n + 1))


def payload_bounds(bps: float) -> tuple[int, float, float]:
    """What a faithful link holds a payload sent after an idle gap to: (from which size, lowest, highest) apparent
    rate as a multiple of ``bps``. Smaller payloads may gain up to the bucket; at 1 Gbit and above this VM's CPU
    shares the bound (a payload reads lower, so the floor is lower and starts at a larger size). The tests and
    testbed/link.py hold the emulated link to these."""
    return (300_000, 0.8, 1.15) if bps > 200e6 else (47_000, 0.85, 1.15)


def payload_rates(cluster, sizes: list[int], reps: int = 3, gap_s: float = 0.1, port: int = 5002,
                  fastest: bool = False) -> dict[int, float]:
    """Each size's apparent rate (bits/s) from host 0 to host 1 of a LocalCluster, after gap_s idle: the median of
    reps, or with fastest the fastest rep. Scheduling noise on a busy machine only ever slows a payload, so the
    fastest rep is the closest reading of the shaper, and the strictest test of a payload outrunning it."""
    sizes = [s for s in sizes for _ in range(reps)]
    me = [sys.executable, "-m", "netsense.emulation.bulk"]
    recv = cluster.spawn(1, [*me, "recv-payloads", str(port), *map(str, sizes)], stdout=subprocess.PIPE)
    time.sleep(0.3)
    send = cluster.spawn(0, [*me, "send-payloads", cluster.address(1), str(port), str(gap_s), *map(str, sizes)],
                         stdout=subprocess.PIPE)
    started = json.loads(send.communicate(timeout=300)[0])["started"]
    done = json.loads(recv.communicate(timeout=30)[0])["done"]
    rates: dict[int, list[float]] = {}
    for size, t0, t1 in zip(sizes, started, done, strict=True):
        rates.setdefault(size, []).append(size * 8 / (t1 - t0))
    return {size: max(r) if fastest else sorted(r)[len(r) // 2] for size, r in rates.items()}


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "recv":
        print(json.dumps(recv(int(args[0]), float(args[1]))))
    elif cmd == "send":
        send(args[0], int(args[1]), float(args[2]), args[3] if len(args) > 3 else None)
    elif cmd == "recv-payloads":
        print(json.dumps(recv_payloads(int(args[0]), [int(s) for s in args[1:]])))
    elif cmd == "send-payloads":
        print(json.dumps(send_payloads(args[0], int(args[1]), float(args[2]), [int(s) for s in args[3:]])))
    else:
        raise SystemExit(f"unknown command {cmd!r}: recv, send, recv-payloads or send-payloads")
