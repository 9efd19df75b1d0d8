"""Entry point for `kopf run operator/run.py` (the same operator as `netsense operator`).

The handlers live in the importable package ``netsense.kube`` (testable, and no
top-level package named ``operator``, which would shadow the standard library);
this file only registers them for users who prefer kopf's own CLI.
"""

import netsense.kube.handlers  # noqa: F401
