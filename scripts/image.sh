#!/usr/bin/env bash
# Builds waitroom's container image from the Containerfile with podman, or docker when there is
# no podman, and prints its size and files.
#
#   scripts/image.sh                 # localhost/waitroom:VERSION (VERSION from Cargo.toml)
#   TAG=registry.example/waitroom:1 scripts/image.sh
#   EXPORT=DIR scripts/image.sh      # also unpack the image's filesystem into DIR
#
# Two ways, chosen by LOCAL_BASE (auto by default):
#   - LOCAL_BASE=0: the Containerfile as written: Rust compiles in its `build` stage and the
#     binary lands on distroless `cc`. Needs both base images from their registries.
#   - LOCAL_BASE=1: for machines that reach no container registry (auto picks this when the run
#     base cannot be pulled): the binary is built here with `cargo build --release`, and the run
#     base is assembled here on `scratch` from the shared libraries `ldd` lists for that binary,
#     plus /etc/passwd and /etc/group naming the user 65532. The same Containerfile builds the
#     image (its `prebuilt` target, with both bases swapped through build arguments); the script
#     says when it does.
#     The binary then links against this machine's glibc, so build on the distribution you run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

if [ -n "${ENGINE:-}" ]; then
  engine=$ENGINE
elif command -v podman >/dev/null 2>&1; then
  engine=podman
elif command -v docker >/dev/null 2>&1; then
  engine=docker
else
  die "neither podman nor docker found: apt-get install -y podman"
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
tag=${TAG:-localhost/waitroom:$version}
run_image=$(sed -n 's/^ARG RUN_IMAGE=//p' Containerfile)

local_base=${LOCAL_BASE:-auto}
if [ "$local_base" = auto ]; then
  say "trying to pull $run_image"
  if timeout 60 "$engine" pull -q "$run_image" >/dev/null 2>&1; then
    local_base=0
  else
    local_base=1
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_args=(--build-arg "VERSION=$version")
if [ "$local_base" = 1 ]; then
  say "no registry image used: building the binary here and the run base from its ldd libraries on scratch"
  ensure_cargo
  ensure_tools cc cmake
  cargo build --release --locked --bin waitroom
  bin=${CARGO_TARGET_DIR:-target}/release/waitroom

  # The run base: every library the dynamic loader will open, at the path ldd resolves it to
  # (the loader itself is the one line without "=>").
  mkdir -p "$work/base/etc" "$work/base/tmp"
  chmod 1777 "$work/base/tmp"
  ldd "$bin" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do
    mkdir -p "$work/base$(dirname "$lib")"
    cp -L "$lib" "$work/base$lib"
  done
  # Names for the numeric user, as distroless's nonroot has them, so tools that look users up
  # (ps, a runtime's logs) show one.
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$work/base/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/base/etc/group"
  tar -C "$work/base" -cf "$work/base.tar" .
  "$engine" import "$work/base.tar" localhost/waitroom-run-base:local >/dev/null

  # The binary, at the path the Containerfile's `build` stage leaves it.
  mkdir -p "$work/binary/out"
  cp "$bin" "$work/binary/out/waitroom"
  tar -C "$work/binary" -cf "$work/binary.tar" .
  "$engine" import "$work/binary.tar" localhost/waitroom-binary:local >/dev/null

  # The `prebuilt` target skips the `build` stage; RUST_IMAGE is pointed at a local image all the
  # same, so that no builder tries to pull a base it will not use.
  build_args+=(
    --target prebuilt
    --build-arg RUN_IMAGE=localhost/waitroom-run-base:local
    --build-arg BINARY_IMAGE=localhost/waitroom-binary:local
    --build-arg RUST_IMAGE=localhost/waitroom-binary:local
  )
fi

say "$engine build -t $tag"
"$engine" build -q -f Containerfile -t "$tag" "${build_args[@]}" . >/dev/null

# What the image is: its size and every file, as a runtime would unpack it.
container=$("$engine" create "$tag")
"$engine" export "$container" >"$work/rootfs.tar"
"$engine" rm "$container" >/dev/null
say "image $tag: $("$engine" image inspect --format '{{.Size}}' "$tag") bytes"
tar -tvf "$work/rootfs.tar" | awk '$1 !~ /^d/ { printf "  %10s  %s\n", $3, $6 }' >&2

if [ -n "${EXPORT:-}" ]; then
  mkdir -p "$EXPORT"
  tar -C "$EXPORT" -xf "$work/rootfs.tar"
  say "filesystem unpacked into $EXPORT"
fi
echo "$tag"
