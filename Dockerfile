# syntax=docker/dockerfile:1
# The oxhorn image: one binary for the manager DaemonSet and the processes it
# starts. Host tools are those the node plugin runs (mkfs.ext4, mkfs.xfs,
# blkid, resize2fs, xfs_growfs, mount, umount, losetup, blockdev,
# fusermount3, iscsiadm).
#
# Builds with Docker (BuildKit) or buildah; hack/build-image.sh builds it
# with buildah without a registry.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Cargo's downloads and target directory are cache mounts, kept from one
# build to the next, so a source change rebuilds incrementally. They are not
# part of the layer: the binary is copied out of the target directory, its
# debug sections (line tables, for backtraces) compressed: a third the size.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin oxhorn \
 && objcopy --compress-debug-sections=zlib target/release/oxhorn /usr/local/bin/oxhorn

# The image without its binary: hack/build-image.sh --binary builds this
# stage alone and adds a binary built on the host (the same Debian), so a
# binary is built once for the host and the image.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates e2fsprogs xfsprogs util-linux mount fuse3 open-iscsi \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/local/bin/oxhorn"]
CMD ["manager"]

FROM runtime
COPY --from=build /usr/local/bin/oxhorn /usr/local/bin/oxhorn
