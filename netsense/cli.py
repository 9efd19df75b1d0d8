"""The `netsense` command line.

Exit codes: 0 success; 2 bad input (the job, the profile, the arguments),
nothing created; 1 a failure while running; 130/143 interrupted (cleaned up).
Errors are one line on stderr: ``netsense: <field>: <reason>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
import time
import warnings

import yaml

from netsense.errors import NetsenseError, Terminated
from netsense.spec import SpecError, check_local, load_job
from netsense.spec.job import inline_trace_file, read_yaml
from netsense.spec.schema import Errors, Issue

EPILOG = """examples:
  netsense validate samples/quick.yaml
  sudo .venv/bin/netsense run samples/quick.yaml --out runs/quick
  netsense bench testbed/grids/ci.yaml --out runs/bench
  netsense calibrate samples/quick.yaml --out runs/calibrate/quick
  netsense shape --dev eth0 --rate 200Mbit
  netsense shape --dev eth0 --profile profile.yaml --direction both
  netsense clean
"""




def _grid_format() -> str:
    """The grid file's format, from netsense.bench's docstring (without importing the bench: --help stays fast)."""
    import importlib.util

    spec = importlib.util.find_spec("netsense.bench")
    with open(spec.origin) as fh:
        text = fh.read()
    start, end = text.find("A grid file::"), text.find("A scenario is")
    return text[start:end].rstrip() if start >= 0 and end > start else ""


def _on_signal(signum, _frame):
    raise Terminated(signum)


def _fail(message: str, code: int) -> int:
    for line in str(message).splitlines() or [""]:  # several errors: one a line, each naming its field
        print(f"netsense: {line}", file=sys.stderr)
    return code


def _warn(job) -> None:
    from netsense.spec.job import warnings_for

    for message in warnings_for(job):
        print(f"netsense: warning: {message}", file=sys.stderr)


def cmd_validate(args) -> int:
    job = load_job(args.job)
    if args.local:
        check_local(job)
    _warn(job)
    print(f"{args.job}: valid NetSenseJob {job.name!r} ({job.workers} workers, "
          f"{job.training['model']} on {job.training['dataset']}, method {job.compression['method']})")
    return 0


def cmd_run(args) -> int:
    from netsense.emulation.runner import run_job

    job = load_job(args.job)
    check_local(job)
    _warn(job)
    out = args.out or os.path.join("runs", f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from netsense.train.results import summary_lines

    try:
        result = run_job(job, out, quiet=args.quiet)
    except (KeyboardInterrupt, Terminated):
        try:  # what the run reached before it was stopped, where rank 0 kept it
            with open(os.path.join(out, "result.json")) as fh:
                print("\n".join(summary_lines(json.load(fh))))
            print(f"netsense: kept what it reached in {out}/result.json, timeline.csv", file=sys.stderr)
        except (OSError, ValueError):
            pass
        raise
    print("\n".join(summary_lines(result)))
    print(f"netsense: wrote {out}/result.json, timeline.csv" + (", timeline.png" if "plot" in result else ""),
          file=sys.stderr)
    return 0


def _load_profile(args) -> dict:
    from netsense.spec.job import PROFILE

    if args.rate:
        raw = {"type": "static", "rate": args.rate}
    elif args.profile_json:
        raw = json.loads(args.profile_json)
    else:
        raw = read_yaml(args.profile, "profile", "--profile")
    for _ in range(2):  # a second pass validates the points of an inlined trace file
        errors = Errors()
        parsed = PROFILE.parse(raw, "profile", errors)
        if errors:
            raise SpecError(errors)
        # --profile-json: a trace file is relative to the working directory
        if not inline_trace_file(parsed, args.profile or os.path.join(os.getcwd(), "-"), "profile.file"):
            break
        raw = parsed
    return parsed


def cmd_shape(args) -> int:
    from netsense.shaping.profiles import build_profile
    from netsense.shaping.queue import Link, Sampler
    from netsense.shaping.shaper import ProfileFollower
    from netsense.shaping.tc import TcLink

    profile = build_profile(_load_profile(args))
    links = []
    if args.direction in ("egress", "both"):
        links.append(TcLink(args.dev, impairments=profile.impairments))
    if args.direction in ("ingress", "both"):
        links.append(TcLink(args.dev, ingress=True, impairments=profile.impairments))
    # This pod's own sends keep to the rate in force; traffic shaped on ingress only comes from senders
    # this sidecar cannot reach (shape their egress too).
    senders = [(None, args.dev)] if args.direction in ("egress", "both") else None
    follower = ProfileFollower(profile, links, epoch=args.epoch, start_file=args.start_file, senders=senders)
    sampler = None
    try:
        follower.start_shaping()
        if (args.queue_csv or args.queue_summary) and not args.once:
            sampler = Sampler([Link(link.shaped_dev, link.shaped_dev) for link in links], args.start_file,
                              args.queue_csv, args.queue_summary).start()
        if args.ready_file:
            with open(args.ready_file, "w") as fh:
                fh.write("shaped\n")
        if args.once:
            return 0
        follower.follow()
    finally:
        if sampler:
            sampler.stop()
            print(json.dumps({"event": "queue", "links": sampler.summary()}), flush=True)
        if not args.once:
            follower.stop(teardown=True)
            print(json.dumps({"event": "unshaped", "devs": [link.shaped_dev for link in links]}), flush=True)
    return 0


def cmd_worker(_args) -> int:
    from netsense.gang import PROCS_ENV

    procs = os.environ.get(PROCS_ENV, "1")
    if procs != "1":  # several ranks in this worker: start them (without torch here)
        from netsense.train.launch import launch

        if not procs.isdigit() or int(procs) < 1:
            print(f"netsense worker: bad environment: {PROCS_ENV}={procs!r} is not a positive integer", file=sys.stderr)
            return 2
        return launch(int(procs))
    from netsense.train.trainer import worker_main

    code = worker_main()
    # Everything is written and the process group is gone; the interpreter's own teardown with torch
    # loaded takes ~2 s of a small machine's CPU, and every run and bench cell would wait for it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_operator(args) -> int:
    try:
        from netsense_operator.main import main as operator_main
    except ImportError as e:
        print(f"netsense operator: the operator is a distribution of its own (operator/): "
              f"pip install . ./operator ({e})", file=sys.stderr)
        return 2
    return operator_main(args.operator_args)


def cmd_bench(args) -> int:
    from netsense.bench import run_bench

    seeds = None
    if args.seeds:
        try:
            seeds = [int(x) for x in args.seeds.split(",")]
        except ValueError:
            raise SpecError([Issue("--seeds", f"{args.seeds!r} is not a comma-separated list of integers")]) from None
    return run_bench(args.grid, args.out, cluster=args.cluster, namespace=args.k8s_namespace, seeds=seeds,
                     cell_plots=args.cell_plots, parallel=args.parallel, output_claim=args.output_claim,
                     reader_image=args.reader_image)


def _numbers(text: str, kind: type, flag: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(","))
    except ValueError:
        raise SpecError([Issue(flag, f"{text!r} is not a comma-separated list of {kind.__name__}s")]) from None
    if any(v <= 0 for v in values) or (flag == "--densities" and any(v > 1 for v in values)):
        raise SpecError([Issue(flag, f"{text!r}: each must be " + ("in (0, 1]" if flag == "--densities" else "> 0"))])
    return values


def cmd_calibrate(args) -> int:
    from netsense.bench import calibration

    try:
        return _calibrate(args, calibration)
    except BaseException as e:  # what a cluster's job says as its reason (its pod's termination message)
        if args.termination_log and not isinstance(e, SystemExit):
            calibration.write_message(args.termination_log, f"calibration failed: {e}")
        raise


def _calibrate(args, calibration) -> int:
    from netsense.spec.job import CALIBRATION, Errors

    job = load_job(args.job)
    # Its network and penalties are not used (the runs are simulated, with their own link), and its mode is why
    # it is here: the rest as netsense run checks it.
    job.compression.pop("penalties", None)
    check_local(type(job)(job.name, {**job.spec, "mode": "train"}))
    given = job.spec.get("calibration") or CALIBRATION.parse({}, "spec.calibration", Errors())
    seeds_n = given["seeds"] if args.seeds is None else args.seeds
    steps = given["steps"] if args.steps is None else args.steps
    rungs = given["rungs"] if args.rungs is None else args.rungs
    parallel = given["parallel"] if args.parallel is None else args.parallel
    if seeds_n < 1 or steps < 10 or rungs < 1 or parallel < 1:
        raise SpecError([Issue("--seeds/--steps/--rungs/--parallel", "at least 1 seed, 10 steps, 1 rung and 1 run "
                                                                     "at a time")])
    densities = tuple(given["densities"]) if args.densities is None else _numbers(args.densities, float, "--densities")
    ranks = tuple(given["ranks"]) if args.ranks is None else _numbers(args.ranks, int, "--ranks")
    out = args.out or os.path.join("runs", "calibrate", job.name)
    seeds = [job.training["seed"] + i for i in range(seeds_n)]
    profile, path = calibration.calibrate(job, out, seeds=seeds, budget=steps, rungs=rungs, parallel=parallel,
                                          densities=densities, ranks=ranks)
    print("\n".join(calibration.summary_lines(profile)))
    print(f"netsense: wrote {path} (use it: spec.compression.penalties with method tta)", file=sys.stderr)
    if args.termination_log:
        calibration.write_message(args.termination_log, calibration.message(profile))
    return 0


def cmd_clean(args) -> int:
    from netsense.emulation.cluster import clean, preflight

    preflight(None)
    removed = clean(everything=args.all)
    print(f"removed {len(removed)} namespace(s)" + (f": {', '.join(removed)}" if removed else ""))
    return 0


def cmd_crd(_args) -> int:
    from netsense.spec.crd import crd

    yaml.safe_dump(crd(), sys.stdout, sort_keys=False)
    return 0


def cmd_admission_policy(_args) -> int:
    from netsense.spec.fence import HEADER, admission_policies

    sys.stdout.write(HEADER)
    yaml.safe_dump_all(admission_policies(), sys.stdout, sort_keys=False, width=120)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="netsense", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Network-adaptive gradient compression for PyTorch DDP, on an emulated network "
                    "testbed or a Kubernetes cluster.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("run", help="run a NetSenseJob on the local emulated cluster (root)",
                       description="Run JOB on one machine: one worker process per rank, each in its own "
                                   "network namespace, links shaped by the job's bandwidth profile. Writes "
                                   "DIR/result.json, timeline.csv and timeline.png.")
    s.add_argument("job", help="NetSenseJob YAML file")
    s.add_argument("--out", metavar="DIR", help="output directory (default runs/NAME-TIMESTAMP)")
    s.add_argument("--quiet", action="store_true", help="no progress line")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("validate", help="check a NetSenseJob and list every error with its field path",
                       description="Check JOB against the NetSenseJob schema (the same rules as the CRD and the "
                                   "operator) and print every error, one a line, with its field path and what "
                                   "to write instead. Exit 0 when valid, 2 otherwise; nothing is created.")
    s.add_argument("job", help="NetSenseJob YAML file")
    s.add_argument("--local", action="store_true", help="also check local files (dataPath)")
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("bench", help="run a grid of methods x profiles x seeds and compare them fairly",
                       description=textwrap.fill("Run every cell of GRID (methods x bandwidth profiles x seeds), each method "
                                   "to the same target accuracy with the same budget, in a shuffled, "
                                   "interleaved order; write DIR/summary.json (every run), table.json and "
                                   "summary.md (time to target with paired intervals, failed runs named) and "
                                   "plots. A run interrupted and started again with the same --out reuses its "
                                   "finished cells.", 79),
                       epilog=_grid_format(), formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("grid", help="grid YAML (see testbed/grids/)")
    s.add_argument("--out", metavar="DIR", default=None, help="output directory (default runs/bench-TIMESTAMP)")
    s.add_argument("--cluster", action="store_true",
                   help="submit one NetSenseJob per cell to the current Kubernetes cluster instead")
    s.add_argument("--namespace", dest="k8s_namespace", default="default", help="namespace for --cluster")
    s.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="with --cluster: N cells (jobs) at once (default: as many as the cluster's free cpu and "
                        "memory hold now, for the grid's pod requests); Ctrl-C deletes every running cell's job. "
                        "Locally cells run one at a time (they share this machine's cores), unless every cell is on "
                        "the simulated clock (spec.network.clock: simulated), whose times no load can change")
    s.add_argument("--seeds", metavar="S,S,...", help="run only these of the grid's seeds (a later run with the "
                   "same --out reuses them)")
    s.add_argument("--output-claim", metavar="CLAIM",
                   help="--cluster: a PersistentVolumeClaim in --namespace where every cell's ranks leave their "
                        "timeline, result and queue samples (spec.output); the bench reads them back into each "
                        "cell's directory through a reader pod, so the report has the plots a local bench has")
    s.add_argument("--reader-image", metavar="IMAGE",
                   help="--output-claim: the reader pod's image (needs sh, tar, base64; default: the grid's "
                        "spec.image, else the operator's NETSENSE_WORKER_IMAGE)")
    s.add_argument("--cell-plots", action="store_true",
                   help="also draw each cell's timeline.png (about a second of CPU a cell; the bench's own "
                        "plots come from the cells' timeline.csv either way)")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("calibrate", help="measure each compression option's step penalty on this job (tta's "
                                         "penalties profile)",
                       description=textwrap.fill(
                           "Like a learning-rate finder: race dense fp16, TopK at --densities and PowerSGD at --ranks "
                           "on JOB's own model, data, batch and lr, each to the same training-loss milestone (dense's "
                           "smoothed loss at 80% of --steps), with --seeds seeds, successive-halving style (options "
                           "that miss it, the nearer half runs again at twice the budget, the rest are reported as "
                           "lower bounds). Runs on the simulated clock (the steps to a loss do not depend on the "
                           "clock; no root needed). Writes DIR/penalties.json: each option's steps over dense's, "
                           "with a 95% interval over the seeds (2 seeds: wide), and the calibration's cost (wall "
                           "seconds, steps trained), which belongs in any comparison that uses it. Give it to tta as "
                           "spec.compression.penalties. On a cluster, the same job with spec.mode: calibrate runs this in one pod; its "
                           "profile lands in the ConfigMap <job>-penalties (penalties: configmap:<job>-penalties). "
                           "Judged: its early milestone misread the penalties to the target on all three tasks run "
                           "(testbed/judged/RESULTS.md).", 79),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("job", help="NetSenseJob YAML file (its network is ignored: the runs are simulated)")
    s.add_argument("--out", metavar="DIR", help="output directory (default runs/calibrate/NAME); every run is kept "
                                                "under DIR/runs/")
    s.add_argument("--seeds", type=int, metavar="N", help="seeds per option, from the job's seed on "
                                                          "(default: spec.calibration.seeds, else 2)")
    s.add_argument("--steps", type=int, metavar="B", help="rung 0's step budget per run (default: "
                                                          "spec.calibration.steps, else 200); rung r's is B x 2^r")
    s.add_argument("--rungs", type=int, metavar="R", help="successive-halving rungs (default: spec.calibration.rungs, "
                                                          "else 3)")
    s.add_argument("--densities", metavar="D,D,...", help="TopK's densities (default: spec.calibration.densities, "
                                                          "else 0.01,0.003,0.001)")
    s.add_argument("--ranks", metavar="R,R,...", help="PowerSGD's ranks (default: spec.calibration.ranks, else 2,8)")
    s.add_argument("--parallel", type=int, metavar="N", help="runs at once (default: spec.calibration.parallel, "
                                                             "else 2: simulated runs take a core a worker)")
    s.add_argument("--termination-log", metavar="PATH", help="also write the profile there as one compact JSON line "
                   "(at most 4096 bytes, a pod's termination message; over it, or on failure, the reason instead): "
                   "how a cluster's calibrate job hands its profile to the operator")
    s.set_defaults(fn=cmd_calibrate)

    s = sub.add_parser("shape", help="shape an interface with tc, following a bandwidth profile",
                       description="Apply a static rate or a profile to IFACE (TBF, rate changes in place) "
                                   "until SIGTERM, then remove the qdiscs. Logs each applied step as JSON. "
                                   "This is the Kubernetes shaping sidecar; it needs only NET_ADMIN.")
    s.add_argument("--dev", required=True, metavar="IFACE")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", help="static rate, e.g. 200Mbit")
    g.add_argument("--profile", metavar="FILE", help="profile YAML (same mapping as spec.network.profile)")
    g.add_argument("--profile-json", metavar="JSON", help="profile as inline JSON")
    s.add_argument("--direction", choices=("egress", "ingress", "both"), default="egress")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--epoch", type=float, default=None, help="unix time the profile's clock starts (default now)")
    g.add_argument("--start-file", metavar="PATH",
                   help="follow the trainer's training clock published in PATH: the first step holds "
                        "until it appears (the trainer's first step), and the profile stands still "
                        "while training does (evaluation)")
    s.add_argument("--ready-file", metavar="PATH", help="written once the first step is applied")
    s.add_argument("--once", action="store_true", help="apply the current step and exit, leaving it in place")
    s.add_argument("--queue-csv", metavar="PATH",
                   help="sample the shaped queue (backlog, queueing delay, drops) every 10 ms into PATH, on the "
                        "training clock of --start-file; print its summary on exit")
    s.add_argument("--queue-summary", metavar="PATH",
                   help="keep the queue's summary (delay percentiles, drops) in PATH, rewritten every 5 s")
    s.set_defaults(fn=cmd_shape)

    s = sub.add_parser("worker", help="the trainer inside a worker pod (configured by environment)",
                       description="The trainer of one rank, as a pod or `netsense run` starts it: configured "
                                   "by MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and NETSENSE_JOB_FILE (the "
                                   "job as JSON). Not for interactive use.")
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("operator", add_help=False,
                       help="run the NetSenseJob Kubernetes operator (netsense-operator; --help for its options)")
    s.set_defaults(fn=cmd_operator)  # its own options pass through (main)

    s = sub.add_parser("clean", help="remove the network namespaces (and their processes) left by killed runs",
                       description="Remove the emulated cluster's network namespaces (nsense-*) whose run is "
                                   "gone, with any process left in them. A run still alive is left alone "
                                   "unless --all.")
    s.add_argument("--all", action="store_true", help="also those of runs still alive")
    s.set_defaults(fn=cmd_clean)
    # The earlier spelling, kept for scripts that have it.
    s = sub.add_parser("testbed", help="deprecated: `netsense testbed clean` is `netsense clean`")
    tsub = s.add_subparsers(dest="testbed_command", required=True, metavar="ACTION")
    c = tsub.add_parser("clean", help="the same as `netsense clean`")
    c.add_argument("--all", action="store_true", help="also those of runs still alive")
    c.set_defaults(fn=cmd_clean)

    s = sub.add_parser("crd", help="print the NetSenseJob CRD (generated from the spec)",
                       description="Print the CustomResourceDefinition generated from the spec schema (its "
                                   "validation rules included); manifests/base/crd.yaml is this output.")
    s.set_defaults(fn=cmd_crd)
    s = sub.add_parser("admission-policy", help="print the admission policies that fence the operator's account",
                       description="Print the ValidatingAdmissionPolicies generated from netsense/spec/fence.py: the "
                                   "operator's account may create and delete only a NetSenseJob's objects, and no "
                                   "pod it creates breaks a rule of the table; "
                                   "manifests/base/admission-policy.yaml is this output.")
    s.set_defaults(fn=cmd_admission_policy)
    return p


def _say_deprecation(message, category, filename, lineno, file=None, line=None) -> None:
    """A deprecated spelling in the user's job is a line like any other message, not a traceback-like warning
    naming our source file; warnings from libraries keep Python's format."""
    if issubclass(category, FutureWarning) and str(message).startswith("spec."):
        print(f"netsense: warning: {message}", file=file or sys.stderr)
    else:
        _show_warning(message, category, filename, lineno, file, line)


_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _say_deprecation
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "operator":
        args.operator_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    try:
        return args.fn(args)
    except NetsenseError as e:
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted; everything it started was cleaned up", 130)
    except Terminated:
        return _fail("terminated; everything it started was cleaned up", 143)
    except Exception as e:  # a one-line reason, never a traceback, for expected failures
        if os.environ.get("NETSENSE_DEBUG"):
            raise
        return _fail(f"{type(e).__name__}: {e}", 1)


if __name__ == "__main__":
    sys.exit(main())
