"""A minimal TCP bulk transfer for measuring a shaped link (counted at the receiver).

    python -m netsense.testbed.bulk recv PORT SECONDS   # prints JSON: bytes per 0.1 s bin
    python -m netsense.testbed.bulk send HOST PORT SECONDS

Counting at the sender would include socket buffers (~20% high at 10 Mbit), so
the receiver reports; bins let tests see when a rate change took effect.
"""

from __future__ import annotations

import json
import socket
import sys
import time

BIN_S = 0.1


def recv(port: int, seconds: float) -> dict:
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(30)
    conn, _ = srv.accept()
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


def send(host: str, port: int, seconds: float) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = b"\0" * (1 << 16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(chunk)
    sock.close()


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        print(json.dumps(recv(int(sys.argv[2]), float(sys.argv[3]))))
    else:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
