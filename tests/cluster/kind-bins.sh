#!/usr/bin/env bash
# Builds what the kind path needs from Go modules, cached like build-bins.sh's binaries:
#   $RLKUBE_BIN_CACHE/kind-<version>/kind                 (sigs.k8s.io/kind, go/kind)
#   $RLKUBE_BIN_CACHE/kindnode-<k8s version>/{kubeadm,kube-proxy}   (go/kindnode)
#   $RLKUBE_BIN_CACHE/runc-caps-<source hash>/runc-caps   (go/runc-caps, dockerd's runc wrapper)
#   $RLKUBE_BIN_CACHE/coredns-<version>/coredns          (github.com/coredns/coredns, go/coredns)
# The harness's own Kubernetes binaries (build-bins.sh kubernetes) are reused for the rest of a
# kind node; kubeadm and kube-proxy live in their own module so that the harness's cache stamp
# does not change. A complete cache folder is skipped: a rerun builds nothing.
# Usage: kind-bins.sh [kind|kindnode|runc-caps|coredns ...]   (default: all)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${RLKUBE_BIN_CACHE:-${RLKUBE_CACHE:-$HOME/.cache/rlkube}/bin}"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED="${CGO_ENABLED:-0}"
version_of() { awk -v m="$2" '$1==m || ($1=="require" && $2==m) {print ($1=="require")?$3:$2; exit}' "$HERE/go/$1/go.mod"; }

k8s_ldflags() {  # the version stamps Kubernetes' own build sets (kubeadm checks them)
  local v="$1" minor p f=""; minor="$(echo "$v" | cut -d. -f2)"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    f+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

build() {  # build <dir under go/> <cache name> <version> <ldflags> <name=package ...>
  local mod="$1" comp="$2" ver="$3" ldflags="$4"; shift 4
  local out="$CACHE/$comp-$ver" b
  mkdir -p "$CACHE"
  exec {lock}>"$CACHE/.$comp.lock"
  flock "$lock"
  local stamp; stamp="$(echo "$ldflags $*" | sha256sum | cut -c1-16)" missing=0
  for b in "$@"; do [[ -x "$out/${b%%=*}" ]] || missing=1; done
  [[ "$(cat "$out/.stamp" 2>/dev/null)" == "$stamp" ]] || missing=1
  if [[ $missing == 0 ]]; then echo "[$comp] $ver cached in $out"; flock -u "$lock"; return; fi
  echo "[$comp] building $ver -> $out"; local t0=$SECONDS
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  for b in "$@"; do
    (cd "$HERE/go/$mod" && go build -trimpath -ldflags="$ldflags" -o "$out.tmp/${b%%=*}" "${b#*=}")
  done
  echo "$stamp" > "$out.tmp/.stamp"
  rm -rf "$out"; mv "$out.tmp" "$out"
  echo "[$comp] built in $((SECONDS - t0)) s"
  flock -u "$lock"
}

want=("$@"); [[ ${#want[@]} -gt 0 ]] || want=(kind kindnode runc-caps coredns)
for c in "${want[@]}"; do
  case "$c" in
    kind) v="$(version_of kind sigs.k8s.io/kind)"
      build kind kind "$v" "-s -w" kind=sigs.k8s.io/kind ;;
    kindnode) v="$(version_of kindnode k8s.io/kubernetes)"
      build kindnode kindnode "$v" "-s -w$(k8s_ldflags "$v")" \
        kubeadm=k8s.io/kubernetes/cmd/kubeadm kube-proxy=k8s.io/kubernetes/cmd/kube-proxy ;;
    runc-caps) v="$(cat "$HERE"/go/runc-caps/{go.mod,main.go} | sha256sum | cut -c1-12)"
      build runc-caps runc-caps "$v" "-s -w" runc-caps=. ;;
    coredns) v="$(version_of coredns github.com/coredns/coredns)"
      build coredns coredns "$v" "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$v" \
        coredns=github.com/coredns/coredns ;;
    *) echo "unknown component $c (kind|kindnode|runc-caps|coredns)" >&2; exit 2 ;;
  esac
done
