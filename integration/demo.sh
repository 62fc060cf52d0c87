#!/usr/bin/env bash
# make demo: the embedded default on one machine. Brings up (or reuses) the local control
# plane, the object store behind its fault proxy, the test kubelet running celld-simulator
# members, and the operator; applies the sample PersistentFleet and Bucket fleet; scales one,
# restarts it with a token, and prints `kubectl describe` and `journal show`.
#
#   integration/demo.sh up | down
#
# Everything binds 127.x only. State and logs: .work/demo/ (logs in .work/demo/logs).
#
# The demo has a control plane of its own (.work/demo-cluster, ports from 15400; override with
# CELLD_DEMO_CLUSTER_DIR and CELLD_DEMO_PORT_BASE), so `make test`, whose suites use
# .work/cluster on ports from 16400, never shares an API server with the demo's operator.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
work=$repo/.work/demo
cluster=${CELLD_DEMO_CLUSTER_DIR:-$repo/.work/demo-cluster}
export CELLD_PORT_BASE=${CELLD_DEMO_PORT_BASE:-15400}
mkdir -p "$work"/{logs,run,store}
log() { echo "[demo $(date +%H:%M:%S)] $*" >&2; }
alive() { [ -f "$work/run/$1.pid" ] && kill -0 "$(cat "$work/run/$1.pid")" 2>/dev/null; }
stop_all() {
  for name in operator kubelet proxy s3s; do
    if alive "$name"; then log "stopping $name"; kill "$(cat "$work/run/$name.pid")" 2>/dev/null || true; fi
    rm -f "$work/run/$name.pid"
  done
}
if [ "${1:-up}" = down ]; then
  stop_all
  "$repo/integration/cluster/down.sh" "$cluster" >/dev/null 2>&1 || true
  log "stopped the demo's operator, test bed and control plane"
  exit 0
fi

bin=$("$repo/integration/cluster/build.sh" | tail -n 1)
"$repo/integration/cluster/up.sh" "$cluster" >/dev/null
export KUBECONFIG=$cluster/admin.kubeconfig
k() { "$bin/kubectl" "$@"; }
log "building the operator and the test bed"
(cd "$repo" && cargo build -q -p celld-operator -p celld-test-kubelet -p celld-sim -p celld-store-proxy)
target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug
s3s=$("$repo/integration/store/install-s3s.sh" | tail -n 1)

start() { # name cmd...
  local name=$1; shift
  if alive "$name"; then return 0; fi
  log "starting $name (log: $work/logs/$name.log)"
  setsid "$@" >>"$work/logs/$name.log" 2>&1 </dev/null &
  echo $! > "$work/run/$name.pid"
}
for bucket in celld-alpha-data celld-beta-data; do mkdir -p "$work/store/$bucket"; done
start s3s "$s3s" --host 127.0.0.1 --port 16490 --access-key celld-test --secret-key celld-test-secret "$work/store"
start proxy "$target/celld-store-proxy" --listen 127.0.0.2:9000 --upstream 127.0.0.1:16490 --control 127.0.0.2:9001
cat > "$work/images.map" <<MAP
registry.celld.test/celld = $target/celld-sim
MAP
start kubelet "$target/celld-test-kubelet" --kubeconfig "$cluster/test-kubelet.kubeconfig" --work-dir "$work/kubelet" \
  --nodes 6 --node-prefix demo-node --image-map "$work/images.map" --control-addr 127.0.0.1:16481 \
  --store-ip 127.0.0.2 --pod-ip-range 127.40.0.0/16 --backoff-initial-ms 1000
k create namespace celld-system --dry-run=client -o yaml | k apply -f - >/dev/null
# The CRDs first: the operator lists fleets as soon as it leads (a fresh demo control plane
# has none of the test suites' CRDs).
k apply --server-side --force-conflicts -f "$repo/crds/" >/dev/null
k wait --for=condition=Established crd/celldfleets.celld.eric.dev --timeout=60s >/dev/null
start operator env RUST_LOG=info "$target/celld-operator" run --local-test --network-policy-enforced \
  --operator-namespace celld-system --watch-namespaces celld-demo --journal-dir "$work/journal" --health-bind-address 127.0.0.1:15482 --metrics-bind-address 127.0.0.1:15484 --log-format plain
for _ in $(seq 1 50); do curl -fs http://127.0.0.1:15482/readyz >/dev/null && break; sleep 0.2; done

log "applying the sample fleets into namespace celld-demo"
k create namespace celld-demo --dry-run=client -o yaml | k apply -f - >/dev/null
k -n celld-demo create serviceaccount celld-alpha --dry-run=client -o yaml | k apply -f - >/dev/null
k -n celld-demo create serviceaccount celld-beta --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -f "$repo/config/test-storageclass.yaml" >/dev/null
k -n celld-demo apply -f "$repo/config/samples/"
wait_ready() { # fleet replicas
  for _ in $(seq 1 120); do
    [ "$(k -n celld-demo get cf "$1" -o jsonpath='{.status.readyReplicas}')" = "$2" ] && return 0
    sleep 1
  done
  log "fleet $1 did not reach $2 ready members; see $work/logs and 'kubectl describe cf $1 -n celld-demo'"; return 1
}
wait_ready beta 3; wait_ready alpha 2
log "scaling beta 3 -> 4, then restarting it with token demo-1"
k -n celld-demo scale celldfleet/beta --replicas=4
wait_ready beta 4
k -n celld-demo patch celldfleet beta --type merge -p '{"spec":{"maintenance":{"restartToken":"demo-1"}}}'
for _ in $(seq 1 120); do
  [ "$(k -n celld-demo get cf beta -o jsonpath='{.status.lastRestartToken}')" = demo-1 ] && break; sleep 1
done
k -n celld-demo get celldfleets
echo; k -n celld-demo describe celldfleet beta | sed -n '/^Status:/,$p'
echo; "$target/celld-operator" journal show celld-demo/beta
# The operator's binary is also its kubectl plugin.
mkdir -p "$work/bin"
ln -sf "$target/celld-operator" "$work/bin/kubectl-celld"
ln -sf "$bin/kubectl" "$work/bin/kubectl"
echo; PATH="$work/bin:$PATH" kubectl celld status celld-demo/beta
cat <<TXT

The demo keeps running. Three things to try next:
  export KUBECONFIG=$KUBECONFIG PATH=$work/bin:\$PATH
  kubectl celld status celld-demo/beta                       # members, operations, conditions, journal size
  kubectl celld journal show celld-demo/beta --since 15m     # the operation history, entry by entry
  kubectl -n celld-demo scale celldfleet/alpha --replicas=3  # then watch it with the two commands above
Logs: $work/logs (operator, kubelet, proxy, s3s) and member logs under $work/kubelet/pods.
Stop: make demo-down (operator, test bed and the demo's own control plane).
TXT
