"""The operator's steady-state cost against a real API server (envtest: etcd + kube-apiserver built from Go):
requests a second by kind (the API server's own apiserver_request_total), and the operator's CPU and memory,
for many Pending jobs (their pods never schedule: no node) and Running jobs (this script plays kubelet).

    python testbed/operator_cost.py                                   # 1,000 Pending (10 pods each), 200 Running
    python testbed/operator_cost.py --pending 100 --pods 1 --running 20 --window 30

The operator runs as it is installed (its timer at its default, 10 s) with the Deployment's identity
(manifests/base/rbac.yaml, fenced by admission-policy.yaml). Watches (long-lived) and the Lease's renewals
(leader election: one request every few seconds, whatever the jobs) are counted apart. Needs the envtest
binaries (make envtest). About 10 minutes on 2 cores at the defaults, most of it the operator creating pods.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from support.kube import Kube, operator_cluster, quick_spec, wait_for  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def started(kube: Kube, ns: str, names: list[str], phase: str) -> int:
    items = kube.custom.list_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs")["items"]
    by_name = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in items}
    return sum(1 for n in names if by_name.get(n) == phase)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pending", type=int, default=1000, help="Pending jobs (default 1000)")
    ap.add_argument("--pods", type=int, default=10, help="workers of each Pending job (default 10: 10,000 pods)")
    ap.add_argument("--running", type=int, default=200, help="Running jobs, 2 workers each (default 200)")
    ap.add_argument("--window", type=float, default=60, help="seconds measured in steady state (default 60)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="operator-cost-")
    with operator_cluster(work, interval=os.environ.get("NETSENSE_RECONCILE_INTERVAL", "10")) as (kube, op):
        ns = kube.namespace("cost")
        t0 = time.monotonic()
        pending = [f"pending-{i}" for i in range(args.pending)]
        running = [f"running-{i}" for i in range(args.running)]
        for name in pending:
            kube.create_job(ns, name, quick_spec(workers=args.pods))
        for name in running:
            kube.create_job(ns, name, quick_spec())
        print(f"created {len(pending) + len(running)} jobs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        want = len(pending) * args.pods + 2 * len(running)
        wait_for(lambda: len(kube.core.list_namespaced_pod(ns).items) >= want, timeout=3600, interval=5,
                 what=f"{want} pods")
        print(f"{want} pods after {time.monotonic() - t0:.0f} s", file=sys.stderr)
        for name in running:
            for pod in kube.pods(ns, name, 0):
                kube.set_pod_phase(ns, pod.metadata.name, "Running")
        wait_for(lambda: started(kube, ns, running, "Running") == len(running), timeout=600, interval=5,
                 what="the Running jobs")
        wait_for(lambda: started(kube, ns, pending, "Pending") == len(pending), timeout=600, interval=5,
                 what="the Pending jobs")
        time.sleep(30)  # the echoes of the last writes
        print(f"steady after {time.monotonic() - t0:.0f} s; measuring {args.window:.0f} s", file=sys.stderr)
        before, cpu0 = kube.request_counts(), cpu_seconds(op.proc.pid)
        time.sleep(args.window)
        after, cpu1 = kube.request_counts(), cpu_seconds(op.proc.pid)
        rates = {k: (n - before.get(k, 0)) / args.window for k, n in after.items() if n > before.get(k, 0)}
        steady = {k: v for k, v in rates.items() if k[0] != "WATCH" and k[1] != "leases"}
        total = sum(steady.values())
        print(f"# Operator cost: {len(pending)} Pending jobs ({args.pods} pods each), {len(running)} Running "
              f"(2 pods each), {want} pods; timer {op.env['NETSENSE_RECONCILE_INTERVAL']} s, window "
              f"{args.window:.0f} s\n")
        print("| verb | resource | requests/s |\n|---|---|---:|")
        for (verb, res, sub), n in sorted(rates.items(), key=lambda kv: -kv[1]):
            print(f"| {verb} | {res}{'/' + sub if sub else ''} | {n:.3f} |")
        print(f"\nsteady requests (no watches, no Lease): {total:.2f}/s = {total / max(1, len(running)):.3f} "
              f"a Running job; operator CPU {100 * (cpu1 - cpu0) / args.window:.0f}% of a core, RSS "
              f"{rss_mib(op.proc.pid):.0f} MiB")


if __name__ == "__main__":
    main()
