"""Study (one-off). Question: does a large gang's burst of pod events starve other jobs' handlers in the operator?
Answer (operator/netsense_operator/handlers.py, _pass; no numbers written down): no longer: a pass asked for while
one runs is folded into it, "so a 64-rank gang's burst of pod events holds one of kopf's threads, not 32 of them
while other jobs wait".
Run on: commit not recorded (written with 0abf1fd, the change it measured).

How fast the operator follows a large gang's pod events, against a real API server (envtest).

One job of --workers ranks: its pods are set Running one after the other (this script plays kubelet, as fast as
the API takes it), and the script reports the time from the last pod's Running to the job's status Running. A
second, small job is created at the same moment: the time until its gang exists says whether the large gang's
events starve other jobs (kopf runs handlers on a pool of 32 threads).

    python testbed/studies/gang_events.py                 # 64 ranks, 3 rounds
    python testbed/studies/gang_events.py --workers 128 --rounds 5

The operator runs with its timer at 60 s, so what is measured is the event path, not the timer. Needs the envtest
binaries (make envtest). To compare two versions, run it from a worktree of each with
PYTHONPATH=<worktree>:<worktree>/operator (the venv's editable install comes after PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests"))

from support.kube import Kube, operator_cluster, quick_spec, wait_for  # noqa: E402


def one_round(kube: Kube, ns: str, workers: int, i: int) -> tuple[float, float]:
    big, small = f"big-{i}", f"small-{i}"
    kube.create_job(ns, big, quick_spec(workers=workers))
    pods = wait_for(lambda: len(kube.pods(ns, big)) == workers and kube.pods(ns, big), timeout=300,
                    what=f"{workers} pods")
    wait_for(lambda: kube.status(ns, big).get("phase") == "Pending", timeout=60, what="Pending")
    small_made = {}

    def second_job() -> None:
        t0 = time.monotonic()
        kube.create_job(ns, small, quick_spec(workers=2))
        wait_for(lambda: len(kube.pods(ns, small)) == 2, timeout=120, interval=0.05, what="the small gang")
        small_made["s"] = time.monotonic() - t0

    side = threading.Thread(target=second_job)
    side.start()
    for pod in pods:
        kube.set_pod_phase(ns, pod.metadata.name, "Running")
    last = time.monotonic()
    wait_for(lambda: kube.status(ns, big).get("phase") == "Running", timeout=120, interval=0.05, what="Running")
    took = time.monotonic() - last
    side.join()
    return took, small_made["s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=64, help="ranks of the large job (default 64)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each a fresh pair of jobs (default 3)")
    args = ap.parse_args()
    with operator_cluster(tempfile.mkdtemp(prefix="gang-events-"), interval="60", nodes=True) as (kube, _):
        ns = kube.namespace("gang-events")
        results = [one_round(kube, ns, args.workers, i) for i in range(args.rounds)]
    running = [r[0] for r in results]
    small = [r[1] for r in results]
    print(f"{args.workers} ranks, {args.rounds} rounds: last pod Running -> status Running "
          f"median {statistics.median(running):.2f}s (each: {', '.join(f'{t:.2f}' for t in running)}); "
          f"a 2-rank job created meanwhile had its gang after median {statistics.median(small):.2f}s "
          f"(each: {', '.join(f'{t:.2f}' for t in small)})")


if __name__ == "__main__":
    main()
