#!/usr/bin/env bash
# Builds the pinned cluster binaries from their Go modules into a per-version cache:
#   $RLKUBE_BIN_CACHE/<component>-<version>/<binary>   (default ~/.cache/rlkube/bin)
# A component whose cache folder is complete is skipped, so a rerun builds nothing.
# Usage: build-bins.sh [kubernetes|etcd|helm|kwok|kueue|promtool ...]   (default: all)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${RLKUBE_BIN_CACHE:-${RLKUBE_CACHE:-$HOME/.cache/rlkube}/bin}"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED="${CGO_ENABLED:-0}"
# Each component is a wrapper module under go/<component>; its version is the one it requires.
version_of() { awk -v m="$2" '$1==m || ($1=="require" && $2==m) {print ($1=="require")?$3:$2; exit}' "$HERE/go/$1/go.mod"; }

# Version stamps that Kubernetes' own build (hack/lib/version.sh) sets with -X: without them the
# binaries report v0.0.0, which breaks version checks (Helm's kubeVersion, kubectl skew).
k8s_ldflags() {
  local v="$1" minor; minor="$(echo "$v" | cut -d. -f2)"
  local p f=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    f+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

# Prometheus tags its Go module v0.<major*100+minor>.<patch> (v0.316.0 is 3.16.0); its own build
# (promu) stamps that release version, which `promtool --version` prints.
promtool_ldflags() {
  local v="${1#v0.}" mm; mm="${v%%.*}"
  echo " -X github.com/prometheus/common/version.Version=$((mm / 100)).$((mm % 100)).${v#*.}"
}

build() {  # build <component> <module> <binaries...>  (binary = name=package)
  local comp="$1" mod="$2"; shift 2
  local ver; ver="$(version_of "$comp" "$mod")"
  local ldflags="-s -w"
  [[ "$comp" != kubernetes ]] || ldflags+="$(k8s_ldflags "$ver")"
  [[ "$comp" != promtool ]] || ldflags+="$(promtool_ldflags "$ver")"
  local out="$CACHE/$comp-$ver" names=() pkgs=() b
  for b in "$@"; do names+=("${b%%=*}"); pkgs+=("${b#*=}"); done
  # One builder per component at a time (a test session and `make` may both ask); the second
  # waits, then finds the cache complete.
  mkdir -p "$CACHE"
  exec {lock}>"$CACHE/.$comp.lock"
  flock "$lock"
  # The stamp names what was built and how; a change of flags or binaries means a rebuild.
  local stamp; stamp="$(echo "$ldflags ${pkgs[*]}" | sha256sum | cut -c1-16)"
  local missing=0; for b in "${names[@]}"; do [[ -x "$out/$b" ]] || missing=1; done
  [[ "$(cat "$out/.stamp" 2>/dev/null)" == "$stamp" ]] || missing=1
  if [[ $missing == 0 ]]; then echo "[$comp] $ver cached in $out"; flock -u "$lock"; return; fi
  echo "[$comp] building $ver -> $out"; local t0=$SECONDS
  mkdir -p "$out.tmp"
  # One package: name the binary (go would call go.etcd.io/etcd/server/v3 "server").
  local dest="$out.tmp/"; [[ ${#pkgs[@]} -gt 1 ]] || dest="$out.tmp/${names[0]}"
  (cd "$HERE/go/$comp" && go build -trimpath -ldflags="$ldflags" -o "$dest" "${pkgs[@]}")
  echo "$stamp" > "$out.tmp/.stamp"
  rm -rf "$out"; mv "$out.tmp" "$out"
  echo "[$comp] built in $((SECONDS - t0)) s"
  flock -u "$lock"
}

want=("$@"); [[ ${#want[@]} -gt 0 ]] || want=(kubernetes etcd helm kwok kueue promtool)
for c in "${want[@]}"; do
  case "$c" in
    kubernetes) build kubernetes k8s.io/kubernetes \
      kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
      kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
      kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
      kubelet=k8s.io/kubernetes/cmd/kubelet \
      kubectl=k8s.io/kubernetes/cmd/kubectl ;;
    etcd) build etcd go.etcd.io/etcd/server/v3 etcd=go.etcd.io/etcd/server/v3 ;;
    helm) build helm helm.sh/helm/v3 helm=helm.sh/helm/v3/cmd/helm ;;
    kwok) build kwok sigs.k8s.io/kwok kwok=sigs.k8s.io/kwok/cmd/kwok ;;
    kueue) build kueue sigs.k8s.io/kueue kueue=sigs.k8s.io/kueue/cmd/kueue ;;
    promtool) build promtool github.com/prometheus/prometheus \
      promtool=github.com/prometheus/prometheus/cmd/promtool ;;
    *) echo "unknown component $c" >&2; exit 2 ;;
  esac
done
