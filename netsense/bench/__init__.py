"""`netsense bench`: methods x bandwidth profiles x seeds, compared fairly.

Fair means: every method runs to the SAME fixed target accuracy with the SAME
wall budget (a run that does not reach the target is reported as not reached,
never cut short when another method peaks), over several seeds, and the measure
that counts is the time to the target ("time to target"; not to be confused with the method tta, our
controller). Regret = a method's mean time to target / the best method's in that scenario. Every row also says its samples/s over allreduce's on the same link
(x allreduce: the paper's headline measure) and, with ``ceiling``, over the no-communication ceiling:
``true``, one worker alone (no second worker's collectives on its cores); ``matched``, each fixed method's cell
followed by its twin without the wire (both workers run the whole hook path, every collective moves no bytes;
an adaptive method is read against the twins of the fixed TopK density nearest its own), which also gives
each method's exposed network time per step against the wire time of the bytes it sent.
A sensitivity section adds a table of each variant's time to target over its method's own, paired on the same
seeds.

A calibration's cost (issue 66): a method whose runs used a penalties profile (``methods: {tta-cal: {method: tta,
penalties: cal/penalties.json}}``, made by ``netsense calibrate``) is charged the calibration in full: beside its
time to target the table shows it with the profile's cost added (the training seconds of the calibration's raced
runs, on the simulated clock the calibration always runs on; netsense.control.penalties.cost_seconds) and
amortized (the cost over stats.AMORTIZED_OVER = 10 runs of the same model), and its regret and paired comparison
use the charged time, so that no table leaves the cost out; its own time to target stays in the row. The full
charge is per run the profile serves: a grid that gives one profile, made once, to all its cells charges it to
each seed's cell (each is read as the run the calibration was made for; the amortized column is the one that
shares it). A method without a profile is charged nothing and reads as before.

A grid file::

    name: ci
    base: {workers: 2, training: {...}}          # a NetSenseJob spec shared by all cells
    methods: {allreduce: {method: allreduce}, topk-0.01: {method: topk, density: 0.01}, ...}
    profiles: {static-50: {type: static, rate: 50Mbit}, ...}
    seeds: [0, 1]
    order: shuffled                               # default: cells interleaved (seeded by orderSeed); or grid
    targets: [0.9]                                # optional: more targets, read off each run's accuracy curve
                                                  # (losses off its loss curve, where base sets targetLoss)
    ceiling: matched                              # optional: true (one worker) or matched (a twin per cell
    ceilingSteps: 100                             #   without the wire, this many steps; default 100)
    accuracyAfterEpochs: 3                        # optional: test accuracy after this many epochs, per method
                                                  # (every run then trains that long: training.minEpochs)
    variants: {tta: [tta-plain]}                  # optional: a method's own variants (ablations); each method
                                                  # is paired with the best method outside its family
    sensitivity:                                  # optional: constants varied one at a time (methods may be empty)
      netsense: {method: {method: netsense}, vary: {alpha: [0.25, 1.0]}}  # -> netsense, netsense-alpha-0.25, ...
    mixedEncodings: true                          # optional: methods at different compression.values on purpose
                                                  # (refused otherwise; allreduce, fp16, netsense never count)
    ranAt: <40-hex commit>                        # a committed grid whose methods ran with settings since removed
                                                  # (the commit of its results): read, never run (bench refuses)

A scenario is a bandwidth profile, or ``{network: {...}, workers: N}`` (either or
both): a whole spec.network (the shared topology, cross traffic) merged over the
base's, and another worker count.
Each row reports, beside time to accuracy, what the method did to the
bottleneck: its worst link's p99 queueing delay and the drops there, and the
cross traffic's goodput while on.

Locally each cell is `netsense run`; with --cluster each cell is a NetSenseJob
submitted through the Kubernetes API (current kubeconfig), its result read back
from the job's status.

The package, one job per module:

    grid     the grid file -> cells (one NetSenseJob each)
    cells    running one cell, locally or on a cluster; the no-communication ceiling
    stats    results -> one row per method and scenario
    report   rows -> summary.md and the plots
    provenance  the commit that ran and the commit of the grid file, in every results file
    run      `netsense bench`: the loop over the cells and what lands in --out
"""

from netsense.bench.grid import Cell, load_grid
from netsense.bench.run import run_bench
from netsense.bench.stats import summarize

__all__ = ["Cell", "load_grid", "run_bench", "summarize"]
