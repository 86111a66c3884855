# syntax=docker/dockerfile:1
# duet container image: build the `duet` binary with the Rust toolchain, then copy it alone into
# a distroless runtime (glibc + libgcc, no shell, no package manager) that runs as a non-root user.
#
#   docker build -t duet:dev .
#   docker run --rm -p 8080:8080 -v "$PWD/examples/demo:/manifests:ro" duet:dev \
#     serve --manifests /manifests --admin-listen 0.0.0.0:10254
#
# The Helm chart (charts/duet) runs this image with a read-only root filesystem, every capability
# dropped and ports 8080/8443/10254, so nothing here needs root.
#
# images/build.sh duet builds the same image layout without a daemon or a registry (binary path,
# user, entrypoint, command, ports, working directory, CA bundle variable);
# conformance/tests/image.rs checks this file's final stage against the image that script builds.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-trixie AS build
WORKDIR /src
# jemalloc, the binary's allocator, is built from C with make (the slim image has gcc only);
# pinned to trixie's version (hadolint DL3008).
RUN apt-get update && apt-get install -y --no-install-recommends make=4.4.1-2 && rm -rf /var/lib/apt/lists/*
COPY . .
# Cache mounts keep the registry and the target folder between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p controller --bin duet \
    && install -D -m 0755 target/dist/duet /out/duet

FROM gcr.io/distroless/cc-debian13:nonroot
COPY --from=build /out/duet /usr/local/bin/duet
# distroless's nonroot images start in /home/nonroot; duet's image starts in /.
WORKDIR /
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# 65532 is distroless's "nonroot" user; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080 8443 10254
ENTRYPOINT ["/usr/local/bin/duet"]
CMD ["serve"]
