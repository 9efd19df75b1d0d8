"""The operator's Prometheus metrics, in the text exposition format, on ``/metrics``.

- ``netsense_jobs{phase}``: jobs this operator holds, by phase;
- ``netsense_gang_restarts_total``: gangs restarted after a worker failed;
- ``netsense_jobs_finished_total{phase,reason}``: jobs that ended, and why;
- ``netsense_reconcile_seconds``: how long a reconcile pass takes (histogram).

Small on purpose (no client library): a few numbers a dashboard or an alert
on restarts and reconcile latency needs. Served, unauthenticated, on
``--metrics-addr`` (NETSENSE_METRICS_ADDR; default 127.0.0.1:9090, off: no
endpoint). The Deployment binds the pod's own IP and ships a NetworkPolicy
that admits only the monitoring namespace.
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phases: dict[str, str] = {}  # job uid -> phase
        self.restarts = 0
        self.finished: Counter[tuple[str, str]] = Counter()
        self.reconcile_buckets = [0] * len(BUCKETS)
        self.reconcile_count = 0
        self.reconcile_sum = 0.0

    def job_phase(self, uid: str, phase: str | None) -> None:
        with self.lock:
            if phase is None:
                self.phases.pop(uid, None)
            else:
                self.phases[uid] = phase

    def restarted(self) -> None:
        with self.lock:
            self.restarts += 1

    def ended(self, phase: str, reason: str) -> None:
        with self.lock:
            self.finished[(phase, reason)] += 1

    def reconciled(self, seconds: float) -> None:
        with self.lock:
            self.reconcile_count += 1
            self.reconcile_sum += seconds
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self.reconcile_buckets[i] += 1

    def render(self) -> str:
        with self.lock:
            by_phase = Counter(self.phases.values())
            lines = ["# HELP netsense_jobs NetSenseJobs by phase.", "# TYPE netsense_jobs gauge"]
            lines += [f'netsense_jobs{{phase="{p}"}} {n}' for p, n in sorted(by_phase.items())]
            lines += ["# HELP netsense_gang_restarts_total Gangs restarted after a worker failed.",
                      "# TYPE netsense_gang_restarts_total counter", f"netsense_gang_restarts_total {self.restarts}",
                      "# HELP netsense_jobs_finished_total Jobs that ended, by phase and reason.",
                      "# TYPE netsense_jobs_finished_total counter"]
            lines += [f'netsense_jobs_finished_total{{phase="{p}",reason="{r}"}} {n}'
                      for (p, r), n in sorted(self.finished.items())]
            lines += ["# HELP netsense_reconcile_seconds Time of one reconcile pass.",
                      "# TYPE netsense_reconcile_seconds histogram"]
            lines += [f'netsense_reconcile_seconds_bucket{{le="{b}"}} {n}'
                      for b, n in zip(BUCKETS, self.reconcile_buckets, strict=True)]
            lines += [f'netsense_reconcile_seconds_bucket{{le="+Inf"}} {self.reconcile_count}',
                      f"netsense_reconcile_seconds_sum {self.reconcile_sum:.6f}",
                      f"netsense_reconcile_seconds_count {self.reconcile_count}"]
        return "\n".join(lines) + "\n"


METRICS = Metrics()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = METRICS.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_) -> None:  # scrapes are not news
        pass


DEFAULT_ADDR = "127.0.0.1:9090"


def parse_addr(addr: str) -> tuple[str, int] | None:
    """``host:port`` (an IPv6 host in brackets) -> (host, port); None for ``off``. A port of its own: ':9090'
    is refused, since an empty host would listen on every interface (say 0.0.0.0 if that is meant)."""
    if addr.strip().lower() == "off":
        return None
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-addr: {addr!r} is not HOST:PORT (e.g. 127.0.0.1:9090, or off)")
    return host, int(port)


def serve(addr: tuple[str, int]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(addr, _Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
