# The driver's image: gpu-kubelet-plugin (the node agent, DaemonSet) and
# gpu-dra-controller (the cluster-side service, Deployment) in one image, as
# the Helm chart in charts/gpu-dra-driver expects.
#
#   docker build -t ghcr.io/example/gpu-dra-driver:0.1.0 .
#
# Without a container engine, image/build.sh builds the same image as an
# OCI archive (reproducibly); tests/tests/image.rs holds the two to the
# same binaries, user, entrypoint and labels.
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

# The root filesystem: Debian 12's C library, unwinder, CA bundle and base
# files, unpacked by image/debian-root.sh -- the script image/build.sh runs
# to build the same image without a container engine, so both hold the
# same files (no shell, no package manager). glibc, because NVML
# (libnvidia-ml.so, from the node's driver root) is loaded at run time and
# needs the C library it was built for, as do the driver's programs the
# plugin runs (nvidia-smi, nvidia-cuda-mps-control, nvidia-imex). No NVIDIA
# files are in the image: the plugin uses the node's driver.
FROM docker.io/library/debian:bookworm-slim AS root
COPY image/debian-root.sh /usr/local/bin/debian-root.sh
RUN debian-root.sh /rootfs

FROM scratch
COPY --from=root /rootfs/ /
COPY --from=build /out/ /usr/local/bin/
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Non-root by default (the controller runs so); the chart runs the plugin
# as root because it writes the kubelet's directories and device nodes.
USER 65532:65532
LABEL org.opencontainers.image.title="gpu-dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs: kubelet plugin and controller" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/gpu-kubelet-plugin"]
