#!/usr/bin/env bash
# Builds the local base image `localhost/rlkube/base:bookworm` without Docker: debootstrap makes
# a minimal Debian bookworm root filesystem (python3, venv, CA certificates), buildah imports it.
# The Dockerfiles in images/ build FROM it with `--build-arg BASE_IMAGE=localhost/rlkube/base:bookworm`.
#
# Cached by content hash of its inputs (the recipe version, suite, package list and mirror):
# the rootfs tarball lives in $RLKUBE_CACHE/images/, and the image carries the hash as a label,
# so a rerun with the same inputs does nothing.
#
# The Debian mirror is the one this machine's apt already uses (read from its sources), so no
# host name is written here. Override with DEBIAN_MIRROR=<url>.
# Env: BUILDAH_ROOT (buildah storage; default $RLKUBE_CACHE/buildah/storage).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${RLKUBE_CACHE:-$HOME/.cache/rlkube}"
IMAGE="${BASE_IMAGE_REF:-localhost/rlkube/base:bookworm}"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
# tests/cluster/images.py passes the storage it uses (overlay where the kernel allows, else vfs).
STORAGE=(--root "${BUILDAH_ROOT:-$CACHE/buildah/storage}" --runroot "${BUILDAH_RUNROOT:-/run/rlkube-buildah}"
         --storage-driver "${BUILDAH_DRIVER:-vfs}")

mirror() {
  if [[ -n "${DEBIAN_MIRROR:-}" ]]; then echo "$DEBIAN_MIRROR"; return; fi
  # deb822 sources (bookworm default) first, then the one-line format.
  local m
  m="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
  [[ -n "$m" ]] || m="$(awk '$1=="deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)"
  [[ -n "$m" ]] || { echo "base image: no Debian mirror found in apt sources; set DEBIAN_MIRROR" >&2; exit 1; }
  echo "$m"
}

need() { command -v "$1" >/dev/null || { echo "base image: '$1' is missing (apt-get install -y $2)" >&2; exit 1; }; }
need debootstrap debootstrap; need buildah buildah

MIRROR="$(mirror)"
# Bump when the way the rootfs is made changes (debootstrap options, the clean-up below).
RECIPE=1
HASH="$(echo "recipe-$RECIPE $SUITE $PACKAGES $MIRROR" | sha256sum | cut -c1-16)"
have="$(buildah "${STORAGE[@]}" inspect --type image --format '{{index .ImageAnnotations "rlkube.io/input-hash"}}' "$IMAGE" 2>/dev/null || true)"
if [[ "$have" == "$HASH" ]]; then echo "base image: $IMAGE up to date ($HASH)"; exit 0; fi

TAR="$CACHE/images/base-$SUITE-$HASH.tar"
mkdir -p "$CACHE/images"
if [[ ! -s "$TAR" ]]; then
  WORK="$(mktemp -d /tmp/rlkube-debootstrap.XXXXXX)"
  trap 'umount -R "$WORK/rootfs/proc" "$WORK/rootfs/sys" 2>/dev/null || true; rm -rf "$WORK"' EXIT
  t0=$SECONDS
  echo "base image: debootstrap $SUITE ($PACKAGES)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
  # Drop what a container never needs: package lists, caches, docs (about a third of the size).
  rm -rf "$WORK/rootfs"/var/lib/apt/lists/* "$WORK/rootfs"/var/cache/apt/*.bin "$WORK/rootfs"/var/cache/apt/archives/*.deb \
         "$WORK/rootfs"/usr/share/doc/* "$WORK/rootfs"/usr/share/man/* "$WORK/rootfs"/usr/share/locale/*
  tar --numeric-owner -C "$WORK/rootfs" -cf "$TAR.tmp" . && mv "$TAR.tmp" "$TAR"
  echo "base image: rootfs made in $((SECONDS - t0)) s ($(du -h "$TAR" | cut -f1))"
fi

ctr="$(buildah "${STORAGE[@]}" from scratch)"
trap 'buildah "${STORAGE[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah "${STORAGE[@]}" add "$ctr" "$TAR" /
buildah "${STORAGE[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd /bin/bash --annotation "rlkube.io/input-hash=$HASH" "$ctr"
buildah "${STORAGE[@]}" commit --quiet "$ctr" "$IMAGE" >/dev/null
echo "base image: $IMAGE built ($HASH)"
