"""Credentials for a Kubernetes API server, shared by the operator and `netsense bench --cluster`."""

from __future__ import annotations

import os


def load_kube_config() -> None:
    """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config.

    $KUBECONFIG is read here, not at import: the client reads it once when imported.
    """
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
