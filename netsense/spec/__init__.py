"""The NetSenseJob model and all of its validation (no torch, no cluster needed)."""

from netsense.spec.job import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    VERSION,
    Job,
    SpecError,
    check_cluster,
    check_local,
    load_job,
    parse_job,
    parse_spec,
)

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "SHORT_NAME", "VERSION",
    "Job", "SpecError", "check_cluster", "check_local", "load_job", "parse_job", "parse_spec",
]
