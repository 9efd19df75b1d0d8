"""A node whose supervisor is SIGKILLed (a CI timeout, an OOM kill) leaves containers, shims, mounts, network
namespaces, the bridge and iptables chains behind; `python -m support.node down` must remove them all.
Runs after test_local_node.py (its node is down by then: one node per machine)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.root]

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_down_sweeps_what_a_killed_node_left(tmp_path):
    from support.node import KUBECONFIG, leftovers, node_binaries

    kubectl = os.path.join(node_binaries(), "kubectl")
    envtest_dirs = set(glob.glob(os.path.join(tempfile.gettempdir(), "netsense-envtest-*")))

    log = open(tmp_path / "up.log", "w")
    up = subprocess.Popen([sys.executable, "-m", "support.node", "up"], cwd=TESTS, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "is Ready" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(1)
        # A pod, so that a sandbox, its network namespace and its mounts exist when the supervisor dies.
        env = {**os.environ, "KUBECONFIG": KUBECONFIG}
        subprocess.run([kubectl, "run", "sleeper", "--image=netsense/shaper:dev", "--image-pull-policy=Never",
                        "--restart=Never", "--command", "--", "sleep", "600"], env=env, check=True,
                       capture_output=True)
        subprocess.run([kubectl, "wait", "pod/sleeper", "--for=condition=Ready", "--timeout=120s"], env=env,
                       check=True, capture_output=True)
    finally:
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
    time.sleep(2)
    left = leftovers()
    assert left["netns"] and left["mounts"] and left["bridge"], f"nothing to sweep? {left}"
    subprocess.run([sys.executable, "-m", "support.node", "down"], cwd=TESTS, check=True)
    left = {k: v for k, v in leftovers().items() if v}
    assert not left, f"`down` left: {left}"
    # The control plane's certificates and etcd data (123 MB) are the node's too: none left in the temp dir.
    new_dirs = set(glob.glob(os.path.join(tempfile.gettempdir(), "netsense-envtest-*"))) - envtest_dirs
    assert not new_dirs, f"the killed node's control plane left {sorted(new_dirs)}"
