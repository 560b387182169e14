#!/usr/bin/env bash
# Installs Debian's Docker engine (package docker.io: dockerd 20.10 and its CLI) for the kind
# path, WITHOUT starting it: the package's init script would start dockerd with its default
# settings, which turn on IP forwarding and set the host's iptables FORWARD policy to DROP (that
# broke the harness cluster's cross-node traffic once). tests/cluster/docker_engine.py starts the
# engine with its own settings and stops it again. A rerun with dockerd present does nothing.
set -euo pipefail
if command -v dockerd >/dev/null; then echo "dockerd present: $(command -v dockerd)"; exit 0; fi
[[ $(id -u) == 0 ]] || { echo "install-docker.sh: needs root (apt-get)" >&2; exit 1; }
# policy-rc.d answering 101 ("action forbidden") keeps invoke-rc.d from starting the service.
policy=/usr/sbin/policy-rc.d own=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; own=1
fi
cleanup() { [[ $own == 0 ]] || rm -f "$policy"; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends docker.io \
  || { apt-get update -q && apt-get install -y --no-install-recommends docker.io; }
command -v dockerd
