"""The GPU path, checked in one run (testbed/gpu/check.sh is the entry point).

Steps, each ok / failed / skipped (with the reason) / dry (run on the CPU in place of the GPU):

1. cuda-tests: the compression tests' CUDA variants (pytest -m cuda, tests/test_compression.py and
   tests/test_sampled.py): the same selection, collisions, error-feedback conservation and rank agreement as
   on the CPU, on CUDA tensors; the sampled selection's count bound, recall, bit-exact error feedback, and
   that it never synchronizes with the host. Without CUDA: only that they are collected.
2. shared-gpu-job: `netsense run` of a 2-rank job on emulated, shaped links (a static and a step profile)
   with both ranks on the one GPU over gloo (NCCL refuses two ranks on one device). Checks that it
   trains (loss falls), that the collectives were timed by CUDA events, that those times are plausible
   (the rate they imply stays under the link), and that the step profile changed the link. Needs root.
3. nccl-smoke: every method's hook on a world-size-1 NCCL group, a few steps, parameters finite.
   Without CUDA: the same on gloo and the CPU.
4. selection: selection + compression overhead against the ResNet18 and VGG16 compute step on the GPU
   (testbed/bench_selection.py --device cuda), the exact PyTorch path and the sampled one side by side, in
   ms and in GB/s against the device's peak. Without CUDA: a small CPU run of the same script.
5. device-profile: the simulated clock's inputs (a step's compute, TopK's and PowerSGD's own work per million
   elements) of the judged set's tasks and of ResNet18/VGG16 at batch 32 and 128 (the paper's setting) on the
   GPU, in device-profile.json: what netsense.clock.devices' table takes, from a committed run. Without CUDA:
   two small tasks on the CPU.
6. cluster-path: every GPU sample (manifests/samples/paper-*.yaml) built into the pods the operator makes,
   validated against the Kubernetes schema, each trainer asking for its GPU with NCCL pinned to the shaped
   eth0 and a NET_ADMIN-only shaper beside it. With --cluster NAMESPACE (the current kubeconfig's cluster,
   the operator installed from manifests/overlays/gpu, the samples' PVC there): a 40-step copy of
   paper-resnet18-steps.yaml submitted as a NetSenseJob, Succeeded on CUDA or failed with its reason.
   Without --cluster (or with --dry): built and validated only.

Everything lands in --out (summary.json, summary.md, each step's own files); exit 1 if a step failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
CUDA_TESTS = ["tests/test_compression.py", "tests/test_sampled.py"]
METHODS = ["allreduce", "fp16", "topk", "netsense", "tta", "powersgd"]


@dataclass
class Ctx:
    out: Path
    cuda: bool  # run on the GPU (CUDA present and not --dry)
    reason: str  # why not, when not
    cluster: str | None = None  # a namespace to submit the cluster-path job to (--cluster)


@dataclass
class Step:
    name: str
    status: str = "ok"
    detail: str = ""
    seconds: float = 0.0
    data: dict = field(default_factory=dict)


def run(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> int:
    with open(log, "w") as fh:
        try:
            return subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            fh.write(f"\n(timed out after {timeout:.0f}s)\n")
            return 124


# ---- 1 ----------------------------------------------------------------------------

def cuda_tests(ctx: Ctx) -> Step:
    step = Step("cuda-tests")
    log = ctx.out / "cuda-tests.log"
    if not ctx.cuda:
        rc = run([PY, "-m", "pytest", "-q", "--collect-only", "-m", "cuda", *CUDA_TESTS], log, 120)
        collected = sum(1 for line in log.read_text().splitlines() if "::" in line)  # -m cuda: each one a variant
        if rc != 0 or collected == 0:
            return Step(step.name, "failed", f"the CUDA variants did not collect (rc {rc}, {collected} found)")
        return Step(step.name, "skipped", f"{collected} CUDA variants collected, not run: {ctx.reason}",
                    data={"collected": collected})
    xml = ctx.out / "cuda-tests.xml"
    rc = run([PY, "-m", "pytest", "-q", "-rs", "-m", "cuda", *CUDA_TESTS, f"--junitxml={xml}"], log, 360)
    text = xml.read_text() if xml.exists() else ""
    counts = step.data = _junit_counts(text)
    if rc != 0 or counts.get("skipped", 0) or not counts.get("tests"):
        step.status = "failed"
    step.detail = ", ".join(f"{k} {v}" for k, v in counts.items()) + f" (log: {log.name})"
    return step


def _junit_counts(xml: str) -> dict[str, int]:
    """tests, failures, errors, skipped of the junit report's test suite ({} without one)."""
    import re

    m = re.search(r"<testsuite [^>]*>", xml)
    if not m:
        return {}
    return {k: int(v) for k, v in re.findall(r'\b(tests|failures|errors|skipped)="(\d+)"', m.group(0))}


# ---- 2 ----------------------------------------------------------------------------

def job_doc(name: str, profile: dict, device: str, steps: int) -> dict:
    from netsense.spec import API_VERSION, KIND

    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
            "spec": {"workers": 2,
                     "training": {"model": "mlp", "dataset": "digits", "hiddenSize": 1024, "batchSize": 32,
                                  "maxSteps": steps, "evalEvery": 20, "backend": "gloo", "device": device,
                                  "seed": 0},
                     "compression": {"method": "tta"},
                     "network": {"profile": profile}}}


def read_timeline(path: Path) -> list[dict]:
    import csv

    with open(path) as fh:
        return list(csv.DictReader(fh))


def check_job_run(out: Path, device: str) -> tuple[list[str], dict]:
    """What is wrong with one run (empty: nothing), and its figures."""
    problems: list[str] = []
    result = json.loads((out / "result.json").read_text())
    rows = read_timeline(out / "timeline.csv")
    losses = [float(r["loss"]) for r in rows if r.get("loss")]
    rates = sorted({round(float(r["link_rate_mbit"])) for r in rows if r.get("link_rate_mbit")})
    timer = "cuda-events" if device == "cuda" else "wall-clock"
    if not result.get("device", "").startswith(device):
        problems.append(f"trained on {result.get('device')}, not {device}")
    if result.get("collective_timer") != timer:
        problems.append(f"collectives timed by {result.get('collective_timer')}, not {timer}")
    if len(losses) < 10 or not all(math.isfinite(x) for x in losses):
        problems.append(f"{len(losses)} losses, finite: {all(math.isfinite(x) for x in losses)}")
    elif sum(losses[-5:]) / 5 >= sum(losses[:5]) / 5:
        problems.append(f"the loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})")
    collective = result.get("collective_rate_mbit")
    # Times that end too early (a callback taken for completion) would show as a rate above the link.
    if not collective or not rates or collective > 1.15 * max(rates):
        problems.append(f"the collectives' timed rate {collective} Mbit/s is not under the link ({rates})")
    figures = {"device": result.get("device"), "collective_timer": result.get("collective_timer"),
               "steps": result.get("steps"), "first_loss": losses[0] if losses else None,
               "last_loss": losses[-1] if losses else None, "link_rates_mbit": rates,
               "collective_rate_mbit": collective, "comm_seconds": result.get("comm_seconds"),
               "selection_ms_mean": result.get("selection_ms_mean")}
    return problems, figures


def shared_gpu_job(ctx: Ctx) -> Step:
    step = Step("shared-gpu-job")
    if os.geteuid() != 0:
        return Step(step.name, "skipped", "needs root (network namespaces and tc for the emulated links)")
    device = "cuda" if ctx.cuda else "cpu"
    steps = 120
    profiles = {"static": {"type": "static", "rate": "200Mbit"},
                # The rate alternates every 0.4 s up to 5.6 s, so any run whose steps span 0.4 s sees two rates
                # wherever it starts: 120 steps last ~2.5 s on 2 CPU cores (under 1 s on one CI run), 2.2-5 s
                # on an H200, where the first step (CUDA's warm-up) ended at 0.40-0.41 s, past a single step
                # at 0.4 s on one run of two.
                "step": {"type": "steps", "steps": [{"at": f"{0.4 * i:.1f}s", "rate": ("200Mbit", "50Mbit")[i % 2]}
                                                    for i in range(15)]}}
    problems = []
    for name, profile in profiles.items():
        run_dir = ctx.out / f"job-{name}"
        job_file = ctx.out / f"job-{name}.yaml"
        job_file.write_text(json.dumps(job_doc(f"gpu-check-{name}", profile, device, steps)))
        rc = run([PY, "-m", "netsense", "run", str(job_file), "--out", str(run_dir), "--quiet"],
                 ctx.out / f"job-{name}.log", 240)
        if rc != 0 or not (run_dir / "result.json").exists():
            problems.append(f"{name}: netsense run exited {rc} (job-{name}.log)")
            continue
        found, figures = check_job_run(run_dir, device)
        if name == "step" and len(figures["link_rates_mbit"]) < 2:
            found.append(f"the step profile never changed the link ({figures['link_rates_mbit']})")
        step.data[name] = figures
        problems += [f"{name}: {p}" for p in found]
    if problems:
        return Step(step.name, "failed", "; ".join(problems), data=step.data)
    where = "one GPU, 2 ranks over gloo" if ctx.cuda else f"CPU in place of the GPU ({ctx.reason})"
    return Step(step.name, "ok" if ctx.cuda else "dry", f"trained on {where}; static and step profiles",
                data=step.data)


# ---- 3 ----------------------------------------------------------------------------

def smoke(backend: str, device: str) -> dict:
    """Every method's hook on a world-size-1 group: a few steps, parameters finite (runs in a child)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from netsense.compression import ddp_options, register

    dist.init_process_group(backend, rank=0, world_size=1)
    out = {}
    try:
        for method in METHODS:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
            config = {"method": method, **({"startIter": 2} if method == "powersgd" else {})}
            ddp = DDP(model.to(device), device_ids=[0] if device == "cuda" else None, gradient_as_bucket_view=True,
                      **ddp_options(config, backend))
            state = register(ddp, config)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
            for i in range(6):
                x = torch.randn(32, 64, device=device, generator=torch.Generator(device=device).manual_seed(i))
                loss = torch.nn.functional.cross_entropy(ddp(x), (x[:, :10].argmax(1)))
                opt.zero_grad()
                loss.backward()
                opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            finite = all(bool(torch.isfinite(p).all()) for p in ddp.parameters())
            history = state.history
            out[method] = {"finite": finite, "loss": float(loss), "steps_recorded": len(history)}
    finally:
        dist.destroy_process_group()
    return out


def nccl_smoke(ctx: Ctx) -> Step:
    backend, device = ("nccl", "cuda") if ctx.cuda else ("gloo", "cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = ctx.out / "smoke.json"
    rc = run([PY, __file__, "--smoke", backend, device, str(result)], ctx.out / "smoke.log", 180,
             env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if rc != 0 or not result.exists():
        return Step("nccl-smoke", "failed", f"exited {rc} (smoke.log)")
    data = json.loads(result.read_text())
    bad = [m for m, r in data.items() if not r["finite"]]
    if bad or set(data) != set(METHODS):
        return Step("nccl-smoke", "failed", f"non-finite parameters: {bad}; methods run: {sorted(data)}", data=data)
    if ctx.cuda:
        return Step("nccl-smoke", "ok", f"{len(data)} methods, world size 1 on NCCL", data=data)
    return Step("nccl-smoke", "dry", f"{len(data)} methods on gloo and the CPU; NCCL not run: {ctx.reason}",
                data=data)


# ---- 4 ----------------------------------------------------------------------------

def selection(ctx: Ctx) -> Step:
    rows = ctx.out / "selection.json"
    if ctx.cuda:
        args = ["--device", "cuda", "--model", "resnet18,vgg16", "--repeats", "10"]
    else:
        args = ["--device", "cpu", "--model", "mlp", "--densities", "0.01,0.1", "--repeats", "2"]
    rc = run([PY, "testbed/bench_selection.py", *args, "--json", str(rows)], ctx.out / "selection.txt", 240)
    if rc != 0 or not rows.exists():
        return Step("selection", "failed", f"bench_selection exited {rc} (selection.txt)")
    data = json.loads(rows.read_text())
    detail = "; ".join(selection_detail(data, model) for model in dict.fromkeys(r["model"] for r in data))
    if ctx.cuda:
        return Step("selection", "ok", detail, data={"rows": data})
    return Step("selection", "dry", f"{detail} (CPU, mlp; ResNet18/VGG16 on a GPU: {ctx.reason})",
                data={"rows": data})


def selection_detail(rows: list[dict], model: str) -> str:
    """One model's figures at density 0.01: each path's select + decode, share of the step, GB/s, % of peak."""
    at = {r["path"]: r for r in rows if r["model"] == model and r["density"] == 0.01}
    if not at:
        return f"{model}: no row at density 0.01"
    first = next(iter(at.values()))
    paths = ", ".join(f"{path} {r['select_ms'] + r['decode_ms']:.3f} ms ({100 * r['overhead_x_step']:.1f}%, "
                      f"{r['pct_of_peak']:.1f}% of peak)" for path, r in at.items())
    return (f"{model} at density 0.01 against a {first['compute_step_ms']:.1f} ms step, peak "
            f"{first['peak_gbs']:.0f} GB/s: {paths}")


# The device profile's trainings: the judged set's tasks (their dense grids' training, 2 workers) and the paper's
# setting (ResNet18 and VGG16 on 3x32x32 inputs of 100 classes, as testbed/grids/scale-paper-*.yaml, 8 workers) at
# batch 32 and 128 a worker. A dry run measures the two smallest on the CPU.
_PAPER = {"dataset": "synthetic", "syntheticClasses": 100, "lr": 0.05}
PROFILE_TRAININGS = [
    *((task, f"testbed/grids/judged-{task}-dense.yaml", 2) for task in ("gru1d", "cnn1d", "mlp1d", "gpt")),
    *((f"{model}-b{batch}", {"model": model, "batchSize": batch, **_PAPER}, 8)
      for model in ("resnet18", "vgg16") for batch in (32, 128)),
]
DRY_PROFILE = ("gru1d", "mlp1d")
PROFILE_KEEP = ("model", "dataset", "hiddenSize", "contextLength", "batchSize", "lr", "momentum", "weightDecay",
                "optimizer", "seed", "syntheticClasses")


def profile_row(label: str, training: dict | str, world: int, device: str) -> dict:
    """The simulated clock's three inputs (spec.network.simulation) for one training on ``device``, measured as
    netsense bench measures a task's (netsense.train.calibrate.inputs_for: TopK at 1% and PowerSGD rank 4, fp16
    values, ``world`` ranks' chunks decoded, one CPU thread), with CUDA's queued work waited for around every
    timed call."""
    import yaml

    from netsense.spec import parse_spec
    from netsense.train import calibrate
    from netsense.train.data import load_dataset
    from netsense.train.models import build_model

    if isinstance(training, str):  # a grid's base training, the parts that shape a step
        base = yaml.safe_load((REPO / training).read_text())["base"]["training"]
        training = {k: v for k, v in base.items() if k in PROFILE_KEEP}
    parsed = parse_spec({"workers": world, "training": training}).training
    compute, topk, lowrank = calibrate.inputs_for(parsed, {"method": "topk", "density": 0.01}, world, device=device)
    data = load_dataset(parsed)  # the model once more, for its size (as testbed/judged/prepare.py inputs)
    model = build_model(parsed["model"], data.input_shape, data.classes, parsed["hiddenSize"])
    return {"name": label, "model": parsed["model"], "dataset": parsed["dataset"], "batchSize": parsed["batchSize"],
            "world": world, "parameters": sum(p.numel() for p in model.parameters()), "computeSeconds": round(compute, 7),
            "compressionSecondsPerMelement": round(topk, 7), "lowRankSecondsPerMelement": round(lowrank, 7)}


def device_profile(ctx: Ctx) -> Step:
    """Each training's step and compressor costs on the device, as the simulated clock takes them
    (device-profile.json; a row's three inputs go into a grid's network.simulation as they are, and rows of a
    committed run are what netsense.clock.devices' table takes)."""
    device = "cuda" if ctx.cuda else "cpu"
    trainings = [t for t in PROFILE_TRAININGS if ctx.cuda or t[0] in DRY_PROFILE]
    rows = [profile_row(label, training, world, device) for label, training, world in trainings]
    (ctx.out / "device-profile.json").write_text(json.dumps({"device": machine().get("gpu") if ctx.cuda else "cpu",
                                                             "rows": rows}, indent=1))
    detail = "; ".join(f"{r['name']} {1e3 * r['computeSeconds']:.2f} ms a step" for r in rows)
    return Step("device-profile", "ok" if ctx.cuda else "dry",
                detail if ctx.cuda else f"{detail} (CPU; the rest on a GPU: {ctx.reason})", data={"rows": rows})


# ---- the run ----------------------------------------------------------------------

def gpu_sample_pods() -> dict:
    """Each GPU sample's pods as the operator builds them, checked: schema, GPU, NCCL on the shaped eth0, shaper."""
    sys.path.insert(0, str(REPO / "operator"))
    from netsense_operator import resources as res

    from netsense.spec import load_job

    try:
        import kubernetes_validate
    except ImportError:  # a GPU machine's venv without the dev extras: the other checks still run
        kubernetes_validate = None
    found = {}
    for sample in sorted((REPO / "manifests" / "samples").glob("paper-*.yaml")):
        job = load_job(str(sample))
        for rank in range(job.workers):
            pod = res.worker_pod(job, "default", "uid-check", rank, 0)
            if kubernetes_validate:
                kubernetes_validate.validate(pod, "1.37.0", strict=True)
            trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
            env = {e["name"]: e.get("value") for e in trainer["env"]}
            problems = [what for what, bad in (
                ("no GPU limit", trainer["resources"].get("limits", {}).get("nvidia.com/gpu") != "1"),
                ("NCCL not on eth0", env.get("NCCL_SOCKET_IFNAME") != "eth0" or env.get("NCCL_IB_DISABLE") != "1"),
                ("wrong rank", env.get("RANK") != str(rank * job.procs_per_worker)
                 or env.get("WORLD_SIZE") != str(job.world)),
                ("shaper not NET_ADMIN alone", (pod["spec"].get("initContainers") or [{}])[0].get(
                    "securityContext", {}).get("capabilities") != {"drop": ["ALL"], "add": ["NET_ADMIN"]}),
            ) if bad]
            if problems:
                raise AssertionError(f"{sample.name} rank {rank}: {', '.join(problems)}")
        found[sample.name] = {"pods": job.workers, "validated": bool(kubernetes_validate)}
    return found


def submit_gpu_job(namespace: str, out: Path, timeout_s: float = 1800) -> dict:
    """A 40-step copy of paper-resnet18-steps.yaml on the current kubeconfig's cluster: its final status."""
    import yaml
    from kubernetes import client

    from netsense.kubeclient import load_kube_config
    from netsense.spec import GROUP, PLURAL, VERSION

    load_kube_config()
    api = client.CustomObjectsApi()
    doc = yaml.safe_load((REPO / "manifests" / "samples" / "paper-resnet18-steps.yaml").read_text())
    doc["metadata"] = {"name": "gpu-check-cluster", "namespace": namespace}
    doc["spec"]["training"].update(maxSteps=40, evalEvery=20, epochs=1)
    doc["spec"]["runPolicy"] = {"backoffLimit": 0, "pendingTimeoutSeconds": 600, "activeDeadlineSeconds": 1500}
    (out / "cluster-job.yaml").write_text(yaml.safe_dump(doc))
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gpu-check-cluster").get(
                "status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                return status
            time.sleep(5)
        return {"phase": "Failed", "message": f"not finished after {timeout_s:.0f}s"}
    finally:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gpu-check-cluster")


def cluster_path(ctx: Ctx) -> Step:
    pods = gpu_sample_pods()
    built = f"{sum(p['pods'] for p in pods.values())} pods of {len(pods)} GPU samples built" + (
        " and schema-validated" if all(p["validated"] for p in pods.values()) else " (kubernetes-validate missing: "
        "schema not checked)")
    if ctx.reason or not ctx.cluster:
        why = ctx.reason or "no --cluster NAMESPACE"
        return Step("cluster-path", "dry", f"{built}; nothing submitted ({why})", data={"samples": pods})
    status = submit_gpu_job(ctx.cluster, ctx.out)
    (ctx.out / "cluster-status.json").write_text(json.dumps(status, indent=1))
    result = status.get("result") or {}
    data = {"samples": pods, "phase": status.get("phase"), "device": result.get("device"),
            "samples_per_s": result.get("throughputSamplesPerS"), "steps": result.get("steps")}
    if status.get("phase") != "Succeeded" or not str(result.get("device", "")).startswith("cuda"):
        return Step("cluster-path", "failed", f"{built}; the job: {status.get('phase')} {status.get('reason', '')} "
                    f"{status.get('message', '')}".strip(), data=data)
    return Step("cluster-path", "ok", f"{built}; a 40-step ResNet18 job Succeeded on {result['device']} "
                f"({result.get('throughputSamplesPerS')} samples/s)", data=data)


def machine() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "host": platform.node(),
            "python": platform.python_version()}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


def write_summary(out: Path, info: dict, steps: list[Step]) -> None:
    (out / "summary.json").write_text(json.dumps({"machine": info, "steps": [asdict(s) for s in steps]}, indent=1))
    lines = [f"# GPU check: {info.get('gpu', 'no GPU (dry run)')}", "",
             f"torch {info['torch']}" + (f", CUDA {info['cuda']}, NCCL {info['nccl']}" if "gpu" in info else ""), "",
             "| step | status | seconds | detail |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.detail} |" for s in steps]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description="Check the GPU path (CUDA tests, a shared-GPU job on shaped links, "
                                             "an NCCL smoke, selection overhead, the device profile); --dry runs it on the CPU.")
    ap.add_argument("--dry", action="store_true", help="run on the CPU even where CUDA is available")
    ap.add_argument("--out", default=None, help="results folder (default runs/gpu-check-<time>)")
    ap.add_argument("--only", default=None, help="comma-separated steps to run (cuda-tests, shared-gpu-job, "
                                                 "nccl-smoke, selection, device-profile, cluster-path)")
    ap.add_argument("--cluster", metavar="NAMESPACE", default=None,
                    help="cluster-path: submit a 40-step GPU job to this namespace of the current kubeconfig's "
                         "cluster (the operator from manifests/overlays/gpu and the samples' PVC there)")
    ap.add_argument("--smoke", nargs=3, metavar=("BACKEND", "DEVICE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:  # the nccl-smoke step's child: a process group of its own
        backend, device, path = args.smoke
        Path(path).write_text(json.dumps(smoke(backend, device), indent=1))
        # Its results are on disk: leave without the interpreter's teardown. Once (CI, 2026-12-05) the child
        # aborted there after writing them ("terminate called without an active exception": a gloo thread torn
        # down at exit), failing a step whose every method had run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    import torch

    out = Path(args.out or REPO / "runs" / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    if args.dry:
        reason = "--dry"
    elif not torch.cuda.is_available():
        reason = "no CUDA device (torch.cuda.is_available() is false)"
    else:
        reason = ""
    ctx = Ctx(out, cuda=not reason, reason=reason, cluster=args.cluster)
    info = machine()
    print(f"gpu check: {info.get('gpu') or 'dry run: ' + reason}; results in {out}", flush=True)
    steps = []
    for fn in (cuda_tests, shared_gpu_job, nccl_smoke, selection, device_profile, cluster_path):
        name = fn.__name__.replace("_", "-")
        if args.only and name not in args.only.split(","):
            continue
        start = time.monotonic()
        print(f"--- {name}", flush=True)
        try:
            s = fn(ctx)
        except Exception as e:  # a step that breaks is a failed step; the others still run
            s = Step(name, "failed", f"{type(e).__name__}: {e}")
        s.seconds = time.monotonic() - start
        print(f"    {s.status}: {s.detail}", flush=True)
        steps.append(s)
    write_summary(out, info, steps)
    failed = [s.name for s in steps if s.status == "failed"]
    print(f"gpu check: {len(steps) - len(failed)}/{len(steps)} steps without failure"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f" ({out}/summary.md)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
