# The worker image, CPU: the trainer (`netsense worker`); the shaping sidecar has its own image (shaper.Dockerfile).
# Build from the repository root: docker build -f images/worker.Dockerfile -t netsense/worker:dev .
# BASE: any Debian bookworm with python3.11 and pip (e.g. one bootstrapped without a registry).
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 procps g++ \
 && rm -rf /var/lib/apt/lists/*
# CPU wheels keep the image ~1 GB instead of several (PyPI's torch is the CUDA build);
# where PyTorch's index is unreachable, TORCH_INDEX=https://pypi.org/simple works too.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX} \
      torch==2.14.1 torchvision==0.29.1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY netsense ./netsense
RUN pip install --no-cache-dir '.[train]' && rm -rf /src
WORKDIR /
# g++ builds the fused CPU compression kernels at a worker's first sparse step (about
# a second, cached here); without it the slower PyTorch path is used.
ENV NETSENSE_NATIVE_DIR=/tmp/netsense-native
ENTRYPOINT []
CMD ["netsense", "worker"]
