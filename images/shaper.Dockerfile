# The shaping sidecar: `netsense shape` needs tc (iproute2) and PyYAML, not torch (~60 MB, not ~1 GB), and
# it runs with NET_ADMIN, so the less it carries the better. The operator names it in every shaped pod
# (NETSENSE_SHAPER_IMAGE in its Deployment; pin it by digest there).
# docker build -f images/shaper.Dockerfile -t netsense/shaper:dev .
# BASE: any Debian bookworm with python3.11 and pip (e.g. one bootstrapped without a registry).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY netsense ./netsense
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
ENTRYPOINT []
CMD ["netsense", "shape", "--help"]
