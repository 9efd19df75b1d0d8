"""The NetSenseJob Kubernetes operator (kopf), a distribution of its own: kopf and the Kubernetes client
on top of netsense's core (the spec, profiles), no torch, so the operator image stays small.

    handlers   the kopf handlers: create, reconcile (timer), delete
    resources  the objects a job becomes (pure functions)
    status     reading pods into the job's status (pure functions)
    leader     one acting replica (a Lease)
    metrics    Prometheus metrics
    main       `netsense-operator` (also `netsense operator`, `python -m netsense_operator`)
"""
