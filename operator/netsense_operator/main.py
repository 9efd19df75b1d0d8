"""`netsense-operator` (also `netsense operator`, `python -m netsense_operator`): the kopf operator in this
process."""

from __future__ import annotations

import logging
import os
import signal
import threading

STOP_S = 10


def run_operator(namespaces: list[str] | None = None, liveness: str | None = None) -> int:
    import kopf

    import netsense_operator.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=False)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Every timer run would log "succeeded" at INFO: restarts and failures stay visible.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    elector = None
    if os.environ.get("NETSENSE_LEADER_ELECTION", "true") != "false":
        from netsense.kubeclient import load_kube_config
        from netsense_operator.leader import LeaseElector, LeaseNamespaceMissing

        load_kube_config()
        elector = LeaseElector(lease_namespace())
        standby = _standby_health(liveness)  # a waiting replica is alive: its liveness probe must say so
        try:
            elector.acquire()
        except LeaseNamespaceMissing as e:
            logging.getLogger("netsense.operator").error("%s", e)
            return 1
        finally:
            if standby is not None:
                standby.shutdown()
                standby.server_close()
    from netsense_operator.leader import process_identity

    # kopf runs in a thread of its own and this thread owns the signals: on SIGTERM the lease is handed back
    # at once and the process is gone within STOP_S, where kopf's own shutdown could hang on an open watch
    # for minutes (a successor would wait for the lease to lapse meanwhile).
    stop, lost = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def on_lost() -> None:
        lost.set()
        stop.set()

    if elector:
        elector.keep(on_lost)
    # An explicit identity: kopf's own guess asks the passwd database for our user, and an image's
    # non-root UID (65532) has no entry there (KeyError, and kopf's thread is gone).
    identity = elector.identity if elector else process_identity()
    os.environ["NETSENSE_NAMESPACES"] = ",".join(namespaces or ())  # where the handlers' resync lists pods
    operator = threading.Thread(target=kopf.run, name="kopf", daemon=True, kwargs={
        "clusterwide": not namespaces, "namespaces": namespaces or (), "standalone": True,
        "liveness_endpoint": liveness, "stop_flag": stop, "identity": identity})
    operator.start()
    while operator.is_alive() and not stop.wait(1):
        pass
    crashed = not stop.is_set()  # kopf ended by itself: an error, never a clean exit
    if crashed:
        logging.getLogger("netsense.operator").error("kopf stopped on its own (see above): exiting with 1")
    stop.set()
    if elector and not lost.is_set():
        elector.release()
    operator.join(STOP_S)
    code = 1 if lost.is_set() or crashed else 0
    if operator.is_alive():  # its executor threads would hold the interpreter's exit too
        logging.getLogger("netsense.operator").warning("kopf did not stop within %ss: exiting anyway", STOP_S)
        logging.shutdown()
        os._exit(code)
    return code


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def lease_namespace() -> str:
    """NETSENSE_LEASE_NAMESPACE, else the namespace the operator runs in (its service account's), else
    netsense-system (a developer's kubeconfig)."""
    if os.environ.get("NETSENSE_LEASE_NAMESPACE"):
        return os.environ["NETSENSE_LEASE_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as fh:
            return fh.read().strip() or "netsense-system"
    except OSError:
        return "netsense-system"


def _standby_health(liveness: str | None):
    """While this replica waits for the Lease, answer its liveness endpoint (kopf's starts only once it leads);
    None without one."""
    if not liveness:
        return None
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    url = urlparse(liveness)

    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server API)
            ok = self.path.split("?")[0] == (url.path or "/")
            self.send_response(200 if ok else 404)
            self.end_headers()
            if ok:
                self.wfile.write(b"waiting for the lease\n")

        def log_message(self, *_) -> None:
            pass

    server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 8080), Healthy)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="netsense-operator", description="The NetSenseJob operator (kopf).")
    p.add_argument("--namespace", action="append", default=None,
                   help="watch only this namespace (repeatable; default: every namespace)")
    p.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-addr", default=None,
                   help="where to serve Prometheus metrics, unauthenticated: HOST:PORT or off (default: "
                        "$NETSENSE_METRICS_ADDR, else 127.0.0.1:9090; the Deployment binds the pod's IP and a "
                        "NetworkPolicy admits only the monitoring namespace)")
    args = p.parse_args(argv)
    if args.metrics_addr is not None:
        from netsense_operator.metrics import parse_addr

        try:
            parse_addr(args.metrics_addr)
        except ValueError as e:
            p.error(str(e))
        os.environ["NETSENSE_METRICS_ADDR"] = args.metrics_addr  # read by the startup handler
    return run_operator(namespaces=args.namespace, liveness=args.liveness)
