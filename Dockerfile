# The oxhorn image: one binary for the manager DaemonSet and the processes it
# starts. Host tools are those the node plugin runs (mkfs, blkid, resize2fs,
# xfs_growfs, mount, losetup, fusermount3, iscsiadm).
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin oxhorn

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates e2fsprogs xfsprogs util-linux fuse3 open-iscsi \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/oxhorn /usr/local/bin/oxhorn
ENTRYPOINT ["/usr/local/bin/oxhorn"]
CMD ["manager"]
