"""spec.output: a cluster job's artifacts on a volume the user names (testbed/CLUSTER.md, Artifacts).

Each rank writes under <path>/<job>/attempt-<n>/rank-<r>/ on the claim: rank 0 its timeline and result, every shaped
rank a copy of its shaper's queue samples. The trainer writes, never the root shaper; the real node's test
(tests/e2e) reads the files back from the volume."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import kubernetes_validate
import pytest

from netsense import gang
from netsense.spec import SpecError, parse_spec
from netsense.train.results import Timeline
from netsense.train.trainer import _keep_artifacts

SHAPED = {"workers": 2, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 50},
          "network": {"profile": {"type": "static", "rate": "200Mbit"}},
          "output": {"claimName": "results", "path": "campaigns/may"}}


def _env(pod: dict, container: str = "trainer") -> dict[str, str]:
    c = next(c for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []) if c["name"] == container)
    return {e["name"]: e["value"] for e in c.get("env") or []}


def test_each_rank_of_each_attempt_writes_to_its_own_directory_on_the_claim():
    from netsense_operator import resources as res

    job = parse_spec(SHAPED, "tta-50")
    pod = res.worker_pod(job, "ns", "uid", 1, 2)
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    env = _env(pod)
    assert env[gang.OUT_DIR_ENV] == "/netsense-output/campaigns/may/tta-50/attempt-2/rank-1"
    assert env[gang.OUTPUT_URI_ENV] == "pvc://results/campaigns/may/tta-50/attempt-2"
    assert env[gang.QUEUE_CSV_ENV] == "/run/netsense-link/netsense-queue.csv"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["netsense-output"]["persistentVolumeClaim"] == {"claimName": "results"}
    trainer = pod["spec"]["containers"][0]
    mounts = {m["name"]: m for m in trainer["volumeMounts"]}
    assert mounts["netsense-output"]["mountPath"] == "/netsense-output"
    # The trainer reads the shaper's samples through a read-only mount: it can plant nothing there.
    assert mounts["netsense-shaper-tmp"]["readOnly"] is True
    assert pod["spec"]["securityContext"]["fsGroup"] == res.TRAINER_UID  # the claim writable by the trainer
    # The root shaper never sees the job's volume.
    shaper = pod["spec"]["initContainers"][0]
    assert "netsense-output" not in {m["name"] for m in shaper["volumeMounts"]}


def test_without_output_nothing_is_mounted_and_the_volume_root_is_the_default_path():
    from netsense_operator import resources as res

    plain = parse_spec({k: v for k, v in SHAPED.items() if k != "output"}, "plain")
    pod = res.worker_pod(plain, "ns", "uid", 0, 0)
    assert gang.OUT_DIR_ENV not in _env(pod) and "fsGroup" not in pod["spec"]["securityContext"]
    assert "netsense-output" not in {v["name"] for v in pod["spec"]["volumes"]}
    rooted = parse_spec({**SHAPED, "output": {"claimName": "results"}}, "rooted")
    assert _env(res.worker_pod(rooted, "ns", "uid", 0, 0))[gang.OUT_DIR_ENV] == "/netsense-output/rooted/attempt-0/rank-0"
    unshaped = parse_spec({k: v for k, v in SHAPED.items() if k != "network"}, "unshaped")
    env = _env(res.worker_pod(unshaped, "ns", "uid", 0, 0))
    assert gang.OUT_DIR_ENV in env and gang.QUEUE_CSV_ENV not in env  # no shaper, no samples to copy


@pytest.mark.parametrize("output, field", [
    ({"claimName": "Results"}, "spec.output.claimName"),
    ({"path": "x"}, "spec.output.claimName"),
    ({"claimName": "r", "path": "../elsewhere"}, "spec.output.path"),
    ({"claimName": "r", "path": "a/./b"}, "spec.output.path"),
    ({"claimName": "r", "path": "/abs"}, "spec.output.path"),
    ({"claimName": "r", "path": "a/"}, "spec.output.path"),
    ({"claimName": "r", "subPath": "a"}, "spec.output.subPath"),
])
def test_a_bad_output_is_refused_naming_the_field(output, field):
    with pytest.raises(SpecError) as e:
        parse_spec({**SHAPED, "output": output}, "bad")
    assert field in {i.path for i in e.value.issues}, str(e.value)


def test_a_pod_template_may_not_take_the_output_volumes_name():
    spec = {**SHAPED, "podTemplate": {"spec": {"volumes": [{"name": "netsense-output", "emptyDir": {}}]}}}
    with pytest.raises(SpecError, match="netsense-output"):
        parse_spec(spec, "taken")


def _trainer_with_rows() -> SimpleNamespace:
    timeline = Timeline()
    timeline.add(step=1, time=0.5, loss=2.0)
    return SimpleNamespace(timeline=timeline)


# A result as the trainer returns it (Trainer._result), the keys a user reads first: how the run ended, the
# target and whether it held, its time to accuracy, the accuracy curve it was read off, where the files are.
RESULT = {"job": "tta-50", "method": "tta", "workers": 2, "status": "Succeeded", "steps": 50, "train_seconds": 5.2,
          "best_accuracy": 0.94, "final_accuracy": 0.94, "target_accuracy": 0.9, "target_hold": 3,
          "time_to_accuracy_s": 2.4, "target_reached": True, "mean_density": 0.0125,
          "dense_steps": {"controller": 2}, "family_pilot": None, "artifacts": "pvc://r/j/attempt-0",
          "accuracy_curve": [[10, 1.1, 0.62], [20, 2.4, 0.91], [30, 3.3, 0.92], [40, 4.2, 0.93], [50, 5.2, 0.94]]}


def test_rank_0_keeps_its_timeline_and_result_every_rank_its_links_samples(tmp_path, monkeypatch):
    from netsense.train.results import read_timeline

    samples = tmp_path / "shaper-tmp" / "netsense-queue.csv"
    samples.parent.mkdir()
    samples.write_text("t,dev,backlog_bytes\n0.1,eth0,0\n0.2,eth0,15")  # the shaper mid-row
    monkeypatch.setenv(gang.QUEUE_CSV_ENV, str(samples))
    for rank in (0, 1):
        monkeypatch.setenv(gang.OUT_DIR_ENV, str(tmp_path / f"rank-{rank}"))
        _keep_artifacts(_trainer_with_rows(), rank, RESULT if rank == 0 else None)
    assert sorted(os.listdir(tmp_path / "rank-0")) == ["queue.csv", "result.json", "timeline.csv"]
    assert os.listdir(tmp_path / "rank-1") == ["queue.csv"]
    # Complete rows only: the row the shaper was writing is left out.
    assert (tmp_path / "rank-1" / "queue.csv").read_text() == "t,dev,backlog_bytes\n0.1,eth0,0\n"
    [row] = read_timeline(str(tmp_path / "rank-0" / "timeline.csv"))
    assert (row["step"], row["time"], row["loss"]) == (1, 0.5, 2.0)
    # The whole result, the accuracy curve too (the termination message leaves it out; the file must not).
    kept = json.loads((tmp_path / "rank-0" / "result.json").read_text())
    assert kept == RESULT
    assert kept["status"] == "Succeeded" and kept["artifacts"] == "pvc://r/j/attempt-0"
    assert kept["target_reached"] is True and kept["time_to_accuracy_s"] == kept["accuracy_curve"][1][1]


def test_a_volume_that_cannot_be_written_costs_the_artifacts_not_the_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(gang.OUT_DIR_ENV, str(tmp_path / "file" / "rank-0"))  # a file where a directory must be
    monkeypatch.delenv(gang.QUEUE_CSV_ENV, raising=False)
    _keep_artifacts(_trainer_with_rows(), 0, {"status": "Succeeded"})
    assert "could not write the artifacts" in capsys.readouterr().err


def test_a_cluster_cells_files_are_laid_out_as_a_local_cells(tmp_path):
    """netsense bench --output-claim: the last attempt's rank-0 timeline becomes the cell's timeline.csv, with the
    per-step queue columns a local run has, from every rank's samples (each under its own device label)."""
    from netsense.bench.artifacts import lay_out
    from netsense.shaping.queue import FIELDS, read_rows
    from netsense.train.results import read_timeline

    cell = tmp_path / "cell"
    for attempt, steps in ((0, 3), (1, 2)):  # a gang restarted once: attempt 1 is what counts
        rank0 = cell / "artifacts" / f"attempt-{attempt}" / "rank-0"
        rank0.mkdir(parents=True)
        timeline = Timeline()
        for step in range(1, steps + 1):
            timeline.add(time=0.1 * step, step=step, loss=1.0)
        timeline.write_csv(str(rank0 / "timeline.csv"))
        for rank in (0, 1):
            d = cell / "artifacts" / f"attempt-{attempt}" / f"rank-{rank}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "queue.csv").write_text(",".join(FIELDS) + "\n" + "".join(
                f"{t},eth0,0,0,{1.5 * (rank + 1) if t == 0.15 else 0},0,0,50\n" for t in (0.05, 0.15)))
    assert lay_out(str(cell)) == str(cell / "timeline.csv")
    steps = read_timeline(str(cell / "timeline.csv"))
    assert [s["step"] for s in steps] == [1, 2]
    assert [s["queue_delay_max_ms"] for s in steps] == [0.0, 3.0]  # rank 1's 3 ms in step 2's (0.1, 0.2]
    assert {r["dev"] for r in read_rows(str(cell / "queue.csv"))} == {"rank0-eth0", "rank1-eth0"}


def test_a_cell_without_files_has_no_timeline(tmp_path):
    from netsense.bench.artifacts import lay_out

    assert lay_out(str(tmp_path)) is None
    (tmp_path / "artifacts" / "attempt-0" / "rank-1").mkdir(parents=True)  # rank 0 never wrote
    assert lay_out(str(tmp_path)) is None


def test_output_claim_is_for_cluster_cells(tmp_path):
    from netsense.bench import run_bench

    (tmp_path / "g.yaml").write_text("name: g\nmethods: {a: {method: allreduce}}\nprofiles: {p: {type: static, "
                                     "rate: 50Mbit}}\nseeds: [0]\n")
    with pytest.raises(SpecError, match="--output-claim"):
        run_bench(str(tmp_path / "g.yaml"), str(tmp_path / "out"), output_claim="results")


@pytest.mark.apiserver
@pytest.mark.parametrize("path", ["../elsewhere", "a/./b", "/abs"])
def test_the_api_server_keeps_the_output_path_inside_the_volume(kube, ns, path):
    """What `kubectl apply` without `netsense validate` meets: the CRD's own pattern."""
    import json

    from kubernetes import client

    job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "out"},
           "spec": {**SHAPED, "output": {"claimName": "results", "path": path}}}
    with pytest.raises(client.ApiException) as e:
        kube.custom.create_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", job)
    message = json.loads(e.value.body)["message"]
    assert e.value.status == 422 and "spec.output.path" in message, message
    job["spec"]["output"]["path"] = "runs/..x/.y"  # dots inside names are fine
    kube.custom.create_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", job)


def test_reading_a_cells_files_never_borrows_the_processes_api_client(monkeypatch):
    """kubernetes.stream swaps its client's call_api for a websocket one while it opens an exec: on the shared
    client, a cell's status poll in another thread went out as a websocket upgrade in that window (an e2e
    campaign ended "Handshake status 200 OK"). Each read opens its exec on a client of its own, and the shared
    client is left as it was, even with two reads at once."""
    import threading

    import kubernetes.stream
    from kubernetes import client

    from netsense.bench.artifacts import VolumeReader

    reader = VolumeReader("ns", "claim", "image", "campaign")
    shared = reader.api.api_client
    shared_call = shared.call_api
    used, both_inside = [], threading.Barrier(2, timeout=10)

    class Done:
        returncode = 0

        def is_open(self):
            return False

        def close(self):
            pass

    def fake_stream(api_method, *args, **kwargs):
        own = api_method.__self__.api_client
        used.append(own)
        own.call_api = "swapped"  # what the real stream does while it opens the exec
        both_inside.wait()  # two reads inside at once
        return Done()

    monkeypatch.setattr(kubernetes.stream, "stream", fake_stream)
    threads = [threading.Thread(target=reader.fetch, args=(f"p{i}", "/nonexistent")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(used) == 2 and used[0] is not used[1]
    assert all(c is not shared and isinstance(c, client.ApiClient) for c in used)
    assert shared.call_api == shared_call, "the shared client was changed"


class _Exec:
    """What kubernetes.stream returns for the reader's exec: stdout and stderr as given, then the exit code;
    ``cut``: the stream drops after the first stdout chunk (the reader pod deleted mid-fetch)."""

    def __init__(self, stdout: list[str], stderr: str = "", code: int = 0, cut: bool = False):
        self.stdout, self.stderr, self.returncode, self.cut = list(stdout), stderr, code, cut
        self.open = True

    def is_open(self):
        return self.open

    def update(self, timeout=None):
        if self.cut and not self.stdout:
            raise ConnectionResetError("Connection to remote host was lost.")
        if not self.stdout:
            self.open = False

    def peek_stdout(self):
        return bool(self.stdout)

    def read_stdout(self):
        chunk = self.stdout.pop(0)
        if self.cut:
            self.stdout.clear()
        return chunk

    def peek_stderr(self):
        return bool(self.stderr) and not self.open

    def read_stderr(self):
        said, self.stderr = self.stderr, ""
        return said

    def close(self):
        self.open = False


def _archive(files: dict[str, str]) -> str:
    import base64
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("exec_, why", [
    (lambda a: _Exec([a[: len(a) // 2]], cut=True), "ConnectionResetError"),  # the reader pod deleted mid-fetch
    (lambda a: _Exec([a[: len(a) // 2]], "netsense-tar-exit:0\n"), "reading rank-0"),  # a truncated archive
    (lambda a: _Exec([a], "tar: ./result.json: file changed as we read it\nnetsense-tar-exit:1\n"), "tar exit 1"),
    (lambda a: _Exec([], "netsense-tar-exit:0\n"), "the stream ended before the archive"),
])
def test_a_fetch_that_breaks_is_an_artifacts_error_never_another_exception(monkeypatch, tmp_path, exec_, why):
    """tar's own status is read (a pipe into base64 hid it), and a dropped stream or a truncated archive is an
    ArtifactsError, which the campaign handles, not an exception that ends it."""
    import kubernetes.stream

    from netsense.bench.artifacts import ArtifactsError, VolumeReader

    monkeypatch.setattr(kubernetes.stream, "stream", lambda *a, **k: exec_(_archive({"result.json": "{}" * 4000})))
    with pytest.raises(ArtifactsError) as e:
        VolumeReader("ns", "claim", "image", "campaign").fetch("rank-0", str(tmp_path / "dest"))
    assert why in str(e.value)


def test_a_cell_whose_fetch_fails_is_tried_once_more_with_a_fresh_reader_and_the_campaign_goes_on(
        monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from netsense.bench import artifacts
    from netsense.bench.run import Volume

    readers: list = []

    class Reader:
        def __init__(self, *args):
            self.closed = False
            readers.append(self)

        def start(self):
            pass

        def close(self):
            self.closed = True

        def fetch(self, path, dest):
            if len(readers) == 1 or fails_always:
                raise artifacts.ArtifactsError(f"reading {path}: ConnectionResetError: the reader pod went away")
            os.makedirs(dest, exist_ok=True)
            return ["attempt-0/rank-0/result.json"]

    monkeypatch.setattr(artifacts, "VolumeReader", Reader)
    volume = Volume("ns", "claim", "image", {}, "campaign")
    cell = SimpleNamespace(job={"metadata": {"name": "job-1"}}, name="cell-1")
    fails_always = False
    result = {"status": "Succeeded"}
    volume.collect(cell, str(tmp_path / "cell-1"), result, plot=False)
    assert len(readers) == 2 and readers[0].closed, "no fresh reader for the second try"
    assert "artifacts_error" not in result and result["artifacts"].endswith("/job-1")
    fails_always = True
    result = {"status": "Succeeded"}
    volume.collect(cell, str(tmp_path / "cell-2"), result, plot=False)  # does not raise: the campaign goes on
    assert "the reader pod went away" in result["artifacts_error"] and result["status"] == "Succeeded"
    assert "trying once more" in capsys.readouterr().err
