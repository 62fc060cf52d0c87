#!/usr/bin/env bash
# Builds the pinned control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, helm) from the Go module proxy into a cache folder
# outside the checkout, keyed by a hash of go.mod, go.sum and this script.
# Prints the bin folder on stdout (last line); progress goes to stderr.
# Idempotent: a warm cache returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.34.4
HELM_VERSION=v3.19.5
ETCD_VERSION=v3.6.4
hash=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)
cache=${CELLD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/celld-operator}/cluster/$hash
bin=$cache/bin
want="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm"
done_all=1
for b in $want; do [ -x "$bin/$b" ] || done_all=0; done
if [ "$done_all" = 1 ] && [ -f "$cache/.complete" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[cluster-build $(date +%H:%M:%S)] $*" >&2; }
log "Go: $(go version); cache: $cache (cold build takes tens of minutes on 2 cores)"
major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
  ld="$ld -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=$now"
done
cd "$here"
start=$(date +%s)
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if [ -x "$bin/$cmd" ]; then log "$cmd: cached"; continue; fi
  log "building $cmd $K8S_VERSION ..."
  t0=$(date +%s)
  go build -trimpath -ldflags "$ld" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$bin/$cmd.tmp" "$bin/$cmd"
  log "built $cmd in $(( $(date +%s) - t0 ))s"
done
if [ ! -x "$bin/etcd" ]; then
  log "building etcd $ETCD_VERSION ..."
  t0=$(date +%s)
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$bin/etcd.tmp" "$bin/etcd"
  log "built etcd in $(( $(date +%s) - t0 ))s"
fi
if [ ! -x "$bin/helm" ]; then
  log "building helm $HELM_VERSION ..."
  t0=$(date +%s)
  hv=helm.sh/helm/v3/internal/version
  (cd "$cache" && GOFLAGS= GOBIN="$bin" go install -trimpath \
    -ldflags "-s -w -X $hv.version=$HELM_VERSION -X $hv.gitTreeState=clean -X $hv.metadata= \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  log "built helm in $(( $(date +%s) - t0 ))s"
fi
touch "$cache/.complete"
log "control plane ready in $bin ($(( $(date +%s) - start ))s, $(du -sh "$bin" | cut -f1))"
echo "$bin"
