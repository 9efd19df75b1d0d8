"""The NetSenseJob Kubernetes operator (kopf). Imports no torch: the operator image stays small."""
