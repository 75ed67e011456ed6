#!/usr/bin/env bash
# Builds the sidecache container image with podman or docker, whichever is
# installed (podman first; CONTAINER_ENGINE=docker to choose).
#
#   deploy/image.sh                 # no registry needed: binary built here,
#                                   # image FROM scratch (deploy/Dockerfile.prebuilt)
#   deploy/image.sh --from-source   # deploy/Dockerfile: builds inside a
#                                   # rust:1-bookworm stage (needs a registry)
#
# Environment: IMAGE (tag, default localhost/sidecache:latest), SIDECACHE_BIN
# (use this binary instead of building target/release/sidecache),
# CONTAINER_ENGINE. Prints the image's size at the end.
#
# Without a registry: `apt-get install podman` (Debian) is all it needs
# besides the Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${IMAGE:-localhost/sidecache:latest}
from_source=no
case "${1:-}" in
  "") ;;
  --from-source) from_source=yes ;;
  *) echo "usage: $0 [--from-source]" >&2; exit 2 ;;
esac

engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v podman >/dev/null 2>&1; then engine=podman
  elif command -v docker >/dev/null 2>&1; then engine=docker
  else
    echo "image: neither podman nor docker is installed (Debian: apt-get install podman)" >&2
    exit 1
  fi
fi
# podman writes OCI images by default, which have no HEALTHCHECK.
format=()
[ "$(basename "$engine")" = podman ] && format=(--format docker)

if [ "$from_source" = yes ]; then
  "$engine" build "${format[@]}" -f deploy/Dockerfile -t "$image" .
else
  bin=${SIDECACHE_BIN:-}
  if [ -z "$bin" ]; then
    cargo build --release -p sidecache --locked
    bin=target/release/sidecache
  fi
  ctx=target/image
  deploy/rootfs.sh "$bin" "$ctx/rootfs"
  "$engine" build "${format[@]}" -f deploy/Dockerfile.prebuilt -t "$image" "$ctx"
fi

size=$("$engine" image inspect --format '{{.Size}}' "$image")
echo "image: $image built with $engine, $size bytes ($((size / 1024 / 1024)) MiB)"
