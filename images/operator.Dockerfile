# The operator image: kopf and the Kubernetes client, no torch (~150 MB).
# docker build -f images/operator.Dockerfile -t netsense/operator:dev .
# BASE: any Debian bookworm with python3.11 and pip (e.g. one bootstrapped without a registry).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY netsense ./netsense
COPY operator ./operator
RUN pip install --no-cache-dir . ./operator && rm -rf /src
WORKDIR /
USER 65532:65532
CMD ["netsense-operator"]
