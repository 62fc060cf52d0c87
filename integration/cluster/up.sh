#!/usr/bin/env bash
# Brings up the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) on 127.0.0.1 only, or reuses it when it is already healthy.
#
#   integration/cluster/up.sh [WORKDIR]     (default: <repo>/.work/cluster)
#
# Layout of WORKDIR: pki/ (generated CA and certs), etcd/ (data), logs/<component>.log,
# run/<component>.pid, audit/audit.log, admin.kubeconfig (system:masters),
# test-kubelet.kubeconfig, ports.env. Ports can be moved with CELLD_PORT_BASE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${1:-${CELLD_CLUSTER_DIR:-$repo/.work/cluster}}
mkdir -p "$work"
work=$(cd "$work" && pwd)
bin=$("$here/build.sh" | tail -n 1)
base=${CELLD_PORT_BASE:-16400}
etcd_client=$((base + 1)); etcd_peer=$((base + 2)); apiserver=$((base + 43))
kcm=$((base + 57)); sched=$((base + 59))
log() { echo "[cluster-up $(date +%H:%M:%S)] $*" >&2; }
mkdir -p "$work"/{pki,logs,run,audit,etcd}
# Test processes that start at the same time bring the control plane up one after another.
exec 9>"$work/run/up.lock"
flock 9
pki=$work/pki
kubectl() { "$bin/kubectl" --kubeconfig "$work/admin.kubeconfig" "$@"; }

alive() { [ -f "$work/run/$1.pid" ] && kill -0 "$(cat "$work/run/$1.pid")" 2>/dev/null; }

# ---------- PKI ----------
cert() { # name CN O [extfile]
  local name=$1 cn=$2 o=$3 ext=${4:-}
  [ -f "$pki/$name.crt" ] && return 0
  openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o/CN=$cn"
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  if [ -n "$ext" ]; then
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 3650 -sha256 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  else
    printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' > "$pki/client.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 3650 -sha256 -extfile "$pki/client.ext" -out "$pki/$name.crt" 2>/dev/null
  fi
}
if [ ! -f "$pki/ca.crt" ]; then
  log "generating PKI in $pki"
  openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=celld-test-ca" -days 3650 -sha256 -out "$pki/ca.crt" 2>/dev/null
fi
cat > "$pki/apiserver.ext" <<EXT
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment
EXT
cert apiserver kube-apiserver "" "$pki/apiserver.ext"
cert admin celld-test-admin system:masters
cert controller-manager system:kube-controller-manager ""
cert scheduler system:kube-scheduler ""
cert test-kubelet celld-test-kubelet celld-test-infrastructure
if [ ! -f "$pki/sa.key" ]; then
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi
[ -f "$pki/tokens.csv" ] || echo "$(openssl rand -hex 24),celld-test-token-admin,celld-test-token-admin,system:masters" > "$pki/tokens.csv"

kubeconfig() { # file cert
  cat > "$work/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: celld-test
  cluster:
    server: https://127.0.0.1:$apiserver
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: celld-test
  context: {cluster: celld-test, user: $2, namespace: default}
current-context: celld-test
KC
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig test-kubelet test-kubelet
cat > "$work/ports.env" <<PORTS
CELLD_APISERVER_URL=https://127.0.0.1:$apiserver
CELLD_ETCD_URL=http://127.0.0.1:$etcd_client
CELLD_KCM_PORT=$kcm
CELLD_SCHEDULER_PORT=$sched
KUBECONFIG=$work/admin.kubeconfig
CELLD_CLUSTER_BIN=$bin
PORTS

start() { # name cmd...
  local name=$1; shift
  # A running component is reused only when it runs with the flags this script gives it:
  # one started by an older version of this script is restarted (its data is kept).
  local flags; flags=$(printf '%s\n' "$@" | sha256sum | cut -c1-16)
  if alive "$name"; then
    if [ "$(cat "$work/run/$name.flags" 2>/dev/null)" = "$flags" ]; then
      log "$name already running (pid $(cat "$work/run/$name.pid"))"; return 0
    fi
    local pid; pid=$(cat "$work/run/$name.pid")
    log "$name (pid $pid) runs with other flags than this script gives it: restarting it"
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  log "starting $name (log: $work/logs/$name.log)"
  # setsid: a component survives the shell that started it; down.sh stops it by pid.
  setsid "$@" >>"$work/logs/$name.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$work/run/$name.pid"
  echo "$flags" > "$work/run/$name.flags"
}
# A port held by something else (often another checkout's cluster on the same CELLD_PORT_BASE)
# would make a component exit, or worse, make its health check answer for the other cluster.
port_free() { # name port...
  local name=$1; shift
  if alive "$name"; then return 0; fi
  local p
  for p in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      log "port $p (for $name) is already in use by another process: another cluster on CELLD_PORT_BASE=$base? Stop it (make cluster-down in its checkout) or set CELLD_PORT_BASE"
      exit 1
    fi
  done
}
wait_for() { # name seconds check...
  local name=$1 secs=$2; shift 2
  local i=0
  until "$@" >/dev/null 2>&1; do
    i=$((i + 1))
    if ! alive "$name"; then log "$name exited; last log lines:"; tail -n 30 "$work/logs/$name.log" >&2; exit 1; fi
    if [ "$i" -ge $((secs * 5)) ]; then log "$name not healthy after ${secs}s; log: $work/logs/$name.log"; tail -n 30 "$work/logs/$name.log" >&2; exit 1; fi
    sleep 0.2
  done
  log "$name healthy"
}

port_free etcd "$etcd_client" "$etcd_peer"
port_free kube-apiserver "$apiserver"
port_free kube-controller-manager "$kcm"
port_free kube-scheduler "$sched"
start etcd "$bin/etcd" --name celld-test --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "celld-test=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --quota-backend-bytes 4294967296
wait_for etcd 30 curl -fsS "http://127.0.0.1:$etcd_client/health"

start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_client" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$apiserver" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
  --authorization-mode Node,RBAC --allow-privileged=true \
  --service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type none \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --audit-policy-file "$here/audit-policy.yaml" --audit-log-path "$work/audit/audit.log" \
  --audit-log-format json --audit-log-maxsize 100000 --audit-log-mode blocking \
  --profiling=false --enable-priority-and-fairness=false \
  --enable-admission-plugins PodNodeSelector
wait_for kube-apiserver 90 curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  "https://127.0.0.1:$apiserver/readyz"

# The test kubelet is test-bed infrastructure, not the subject under test: it may act on any node.
kubectl get clusterrolebinding celld-test-kubelet >/dev/null 2>&1 || \
  kubectl create clusterrolebinding celld-test-kubelet --clusterrole cluster-admin --user celld-test-kubelet >/dev/null

start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$work/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$work/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$work/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm" --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials=true \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --horizontal-pod-autoscaler-sync-period 5s --profiling=false
wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$kcm/healthz"

start kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$work/scheduler.kubeconfig" \
  --authentication-kubeconfig "$work/scheduler.kubeconfig" \
  --authorization-kubeconfig "$work/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched" --leader-elect=false --profiling=false
wait_for kube-scheduler 60 curl -fsSk "https://127.0.0.1:$sched/healthz"

log "control plane up: KUBECONFIG=$work/admin.kubeconfig (logs in $work/logs, audit log $work/audit/audit.log)"
echo "$work"
