"""The NetSenseJob Kubernetes operator (kopf), a distribution of its own: kopf and the Kubernetes client
on top of netsense's core (the spec, profiles), no torch, so the operator image stays small.

    handlers    the kopf handlers: create, a pass per event or timer (one at a time a job), delete
    reconciler  one pass over one job: what comes next, from its status and its pods
    gangs       a job's gang: made whole or not at all, admitted together, deleted by attempt
    api         the API calls: create and delete idempotently, status writes that never regress
    podindex    the jobs' pods as the watch shows them, and the resync that drops vanished ones
    resources   the objects a job becomes (pure functions)
    status      reading pods into the job's status (pure functions)
    quota       does a gang fit the namespace's ResourceQuotas (pure)
    gate        does a gang fit the nodes' free room: its pods wait behind a scheduling gate until it does (pure)
    nodes       is a rank's node lost
    leader      one acting replica (a Lease)
    metrics     Prometheus metrics
    main        `netsense-operator` (also `netsense operator`, `python -m netsense_operator`)
The rules no worker pod may break are netsense.spec.fence's (the admission policy is generated from them).
"""
