#!/usr/bin/env bash
# Stops the local control plane started by up.sh: only the pids it recorded.
#   integration/cluster/down.sh [WORKDIR] [--purge]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${1:-${CELLD_CLUSTER_DIR:-$repo/.work/cluster}}
purge=0; for a in "$@"; do [ "$a" = --purge ] && purge=1; done
[ "$work" = --purge ] && work=${CELLD_CLUSTER_DIR:-$repo/.work/cluster}
for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f=$work/run/$name.pid
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    echo "[cluster-down] stopping $name (pid $pid)" >&2
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
done
if [ "$purge" = 1 ]; then rm -rf "$work"; echo "[cluster-down] removed $work" >&2; fi
