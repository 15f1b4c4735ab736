# syntax=docker/dockerfile:1
# The image of Clever Karpenter Hub: both binaries (karpenter-hub, karpenter-hub-webhook) on a
# distroless runtime, as user 65532. The charts/karpenter-hub chart runs it (image tag v<appVersion>).
#
#   docker build -t ghcr.io/clever-karpenter-hub/karpenter-hub:v0.1.0 .
#
# CI has no container engine: image/assemble.sh assembles the same image (these files, user,
# entrypoint, command and labels, on Debian 12 packages instead of the distroless base) as an OCI
# layout, and webhook/tests/image.rs checks it against this file and runs its entrypoints as 65532;
# operator/tests/suite/charts.rs checks that the builder matches the workspace's rust-version and the
# version label the chart.

# The workspace's minimum Rust (Cargo.toml rust-version), on Debian 12 like the runtime below, so
# the binaries link against the same glibc.
FROM docker.io/library/rust:1.89.0-slim-bookworm AS build
WORKDIR /src
COPY . .
# --locked: exactly the dependency versions of Cargo.lock. The caches only speed up rebuilds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p operator -p webhook \
        --bin karpenter-hub --bin karpenter-hub-webhook \
 && install -D -m 0755 target/release/karpenter-hub /out/karpenter-hub \
 && install -D -m 0755 target/release/karpenter-hub-webhook /out/karpenter-hub-webhook

# glibc, libgcc and CA certificates, no shell, no package manager; the nonroot tag runs as 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="Clever Karpenter Hub" \
      org.opencontainers.image.description="One Karpenter for a fleet of Clever Kubernetes Engine clusters: karpenter-hub and karpenter-hub-webhook" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/clever-karpenter-hub/clever-karpenter-hub" \
      org.opencontainers.image.url="https://github.com/clever-karpenter-hub/clever-karpenter-hub"
COPY --from=build /out/karpenter-hub /out/karpenter-hub-webhook /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/karpenter-hub"]
CMD ["run"]
