"""Study (one-off). Question: do two workers' compute steps slow each other on this machine's 2 cores?
Answer (testbed/results/sim-training.md): no: "measured by two processes at once, a step's compute is what one
process measures alone (the MLP 4.5-4.7 ms against 4.3-4.6, the CNN-1D 7.7-8.0 against 7.7-7.8)".
Run on: commit not recorded (the numbers were written in 17f5836, with this script).

Do two workers' compute steps slow each other on this machine's 2 cores? The simulated clock's measured inputs
(netsense.train.calibrate.inputs_for: a step's compute, TopK's and PowerSGD's path per million elements, in ms)
for a validation grid's method, measured by one process alone and then by two at once, each on one thread, as the
emulator's two workers run (testbed/results/sim-training.md quotes it).

    .venv/bin/python testbed/studies/contention.py testbed/grids/sim-validation.yaml topk-0.01
"""

from __future__ import annotations

import json
import subprocess
import sys


def measure(grid: str, method: str) -> list[float]:
    from netsense.bench.grid import load_grid
    from netsense.spec import parse_job
    from netsense.train import calibrate

    job = parse_job(next(c.job for c in load_grid(grid)[1] if c.method == method))
    return [round(v * 1e3, 3) for v in calibrate.inputs_for(job.training, job.compression, job.workers)]


def main() -> int:
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure(*sys.argv[2:4])))
        return 0
    one = [sys.executable, __file__, "--one", *sys.argv[1:3]]
    alone = [json.loads(subprocess.check_output(one)) for _ in range(2)]
    procs = [subprocess.Popen(one, stdout=subprocess.PIPE) for _ in range(2)]
    together = [json.loads(p.communicate()[0]) for p in procs]
    print(f"alone (twice, one after the other): {alone}\ntwo at once: {together}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
