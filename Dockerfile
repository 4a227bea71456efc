# The driver's image: gpu-kubelet-plugin (the node agent, DaemonSet) and
# gpu-dra-controller (the cluster-side service, Deployment) in one image, as
# the Helm chart in charts/gpu-dra-driver expects.
#
#   docker build -t ghcr.io/example/gpu-dra-driver:0.1.0 .
#
# Build stage: only cargo is needed (protos are compiled by protox, no
# protoc). The plugin is built with the size-optimised `node` profile, the
# controller with `release` (see Cargo.toml).
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --profile node -p gpu-kubelet-plugin \
 && cargo build --locked --release -p gpu-dra-controller \
 && install -D -m 0755 target/node/gpu-kubelet-plugin /out/gpu-kubelet-plugin \
 && install -D -m 0755 target/release/gpu-dra-controller /out/gpu-dra-controller

# Runtime: glibc, because NVML (libnvidia-ml.so, from the node's driver
# root) is loaded at run time and needs the C library it was built for. No
# NVIDIA files are in the image: the plugin uses the node's driver.
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# Non-root by default (the controller runs so); the chart runs the plugin
# as root because it writes the kubelet's directories and device nodes.
USER 65532:65532
LABEL org.opencontainers.image.title="gpu-dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs: kubelet plugin and controller" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/gpu-kubelet-plugin"]
