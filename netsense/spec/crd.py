"""The NetSenseJob CustomResourceDefinition, generated from the spec schema."""

from __future__ import annotations

from netsense.spec.job import GROUP, KIND, PLURAL, SHORT_NAME, SPEC, VERSION

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Method", "type": "string", "jsonPath": ".spec.compression.method"},
    {"name": "Workers", "type": "integer", "jsonPath": ".spec.workers"},
    {"name": "Rate", "type": "string", "jsonPath": ".status.network.rate"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
    {"name": "Samples/s", "type": "number", "jsonPath": ".status.progress.samplesPerSecond"},
    {"name": "Best-Acc", "type": "number", "jsonPath": ".status.bestAccuracy"},
    {"name": "Target", "type": "string", "jsonPath": ".status.target"},  # reached at 12.3 s | missed (best 0.939)
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict:
    spec_schema = SPEC.openapi()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": [SHORT_NAME], "listKind": f"{KIND}List"},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object", "properties": {"name": {
                            "type": "string", "maxLength": 50,
                            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}},
                        "spec": spec_schema,
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            }],
        },
    }
