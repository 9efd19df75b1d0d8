"""`netsense operator`: run the kopf operator in this process."""

from __future__ import annotations

import logging


def run_operator(namespaces: list[str] | None = None, liveness: str | None = None) -> int:
    import kopf

    import netsense.kube.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=False)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Every timer run would log "succeeded" at INFO: restarts and failures stay visible.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    kopf.run(clusterwide=not namespaces, namespaces=namespaces or (), standalone=True,
             liveness_endpoint=liveness)
    return 0
