# One image for both programs: `sandlot operator` (Deployment, non-root) and
# `sandlot agent` (DaemonSet; the chart runs it as uid 0 for containerd's socket).
#
#   docker build -t sandlot:dev .
#
# The same recipe builds without a Docker engine (sandlot.devtools.cluster.images,
# RECIPE; `sandlot dev cluster up` and the cluster tests use it): Debian bookworm
# with the packages and the user below, and /opt/sandlot, a virtualenv made by that
# Debian's python3: the dependencies from requirements/runtime.txt (the runtime lock,
# with hashes: `make lock`), then the package alone. tests/unit/test_image_recipe.py
# fails when the two recipes drift apart.
#
# The builder generates the containerd gRPC stubs from the .proto files Debian
# ships (golang-github-containerd-containerd-dev, plus gogo.proto; the Transfer
# service's files, newer than Debian's, from
# operator/sandlot/devtools/containerd_protos), the same generator and source the
# development setup uses, and installs the package with them into a virtualenv that the final stage copies alone: no compiler, no
# grpcio-tools, no .proto files in the image. It also builds the files tool with Debian's Go.
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv iproute2 \
      golang-github-containerd-containerd-dev golang-github-gogo-protobuf-dev golang-go \
 && rm -rf /var/lib/apt/lists/*
# grpcio-tools lives in its own virtualenv: it is needed to generate, never to run.
RUN python3 -m venv /opt/gen && /opt/gen/bin/pip install "grpcio-tools>=1.85" "protobuf>=7.36"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/runtime.txt ./requirements/
COPY operator ./operator
RUN PYTHONPATH=operator /opt/gen/bin/python -m sandlot.devtools.gen_stubs \
      --source debian --force \
 && test -f operator/sandlot/adapters/containerd/gen/services/tasks/v1/tasks_pb2_grpc.py \
 && test -f operator/sandlot/adapters/containerd/gen/services/transfer/v1/transfer_pb2_grpc.py
RUN python3 -m venv /opt/sandlot \
 && /opt/sandlot/bin/pip install --require-hashes -r requirements/runtime.txt \
 && /opt/sandlot/bin/pip install --no-deps . \
 && /opt/sandlot/bin/pip check \
 && /opt/sandlot/bin/python -c "import sandlot.adapters.containerd.client" \
 && /opt/sandlot/bin/sandlot --help >/dev/null
# The files tool the agent mounts into sandboxes (operator/filetool, the chart's
# agent.filesTool): static, standard library only, shipped inside /opt/sandlot.
RUN cd operator/filetool \
 && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" \
      -o /opt/sandlot/libexec/sandlot-files . \
 && /opt/sandlot/libexec/sandlot-files stat / >/dev/null
# The executor the agent mounts beside it (operator/executor, agent.executor): it
# runs a sandbox's commands from inside it; it ends by itself once stdin does.
RUN cd operator/executor \
 && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" \
      -o /opt/sandlot/libexec/sandlot-exec . \
 && /opt/sandlot/libexec/sandlot-exec 5 </dev/null >/dev/null

FROM ${DEBIAN_IMAGE}
LABEL org.opencontainers.image.title="sandlot" \
      org.opencontainers.image.description="sandlot operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/sandlot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# python3 runs the virtualenv (python3-venv made it); iproute2: the agent creates
# each sandbox's network namespace with `ip netns` before it runs the node's CNI
# plugins (mounted from the node); iptables: it installs each sandbox's network
# policy inside that namespace (iptables-restore, through util-linux's nsenter).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv iproute2 iptables \
 && rm -rf /var/lib/apt/lists/*
# The chart's operator pod runs as this user (65532) with a read-only root filesystem.
RUN groupadd --system --gid 65532 sandlot \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin sandlot
COPY --from=build /opt/sandlot /opt/sandlot
USER 65532:65532
ENTRYPOINT ["sandlot"]
CMD ["--help"]
