# The worker image for GPU clusters: PyPI's torch bundles the CUDA runtime and NCCL;
# the node needs only the NVIDIA driver and container toolkit.
# docker build -f images/worker-cuda.Dockerfile -t netsense/worker-cuda:0.1.0 .
# BASE: any Debian bookworm with python3.11 and pip (e.g. one bootstrapped without a registry).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 procps \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir torch==2.14.1 torchvision==0.29.1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY netsense ./netsense
RUN pip install --no-cache-dir '.[train]' && rm -rf /src
WORKDIR /
ENV NCCL_DEBUG=WARN
CMD ["netsense", "worker"]
