#!/usr/bin/env bash
# make chart-check: lint, values-schema tests, template snapshots, CRD sync.
#   UPDATE=1 helm/tests/chart-check.sh   regenerates the snapshots after a deliberate change.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
chart=$repo/helm/celld-operator
helm=$("$repo/integration/cluster/build.sh" | tail -n 1)/helm
fail=0
echo "==> helm lint --strict"
"$helm" lint --strict "$chart" >/dev/null

echo "==> values schema: bad values are rejected with a clear message"
reject() { # message-fragment set-args...
  local want=$1; shift
  local out
  if out=$("$helm" template t "$chart" "$@" 2>&1); then
    echo "  FAIL: accepted $*"; fail=1
  elif ! grep -q -- "$want" <<<"$out"; then
    echo "  FAIL: $* rejected without '$want':"; echo "$out" | head -5 | sed 's/^/    /'; fail=1
  else
    echo "  ok: rejects $*"
  fi
}
accept() {
  if ! "$helm" template t "$chart" "$@" >/dev/null 2>&1; then echo "  FAIL: rejected $*"; fail=1; else echo "  ok: accepts $*"; fi
}
reject "memberReplacementDelay" --set memberReplacementDelay=30s
reject "memberReplacementDelay" --set memberReplacementDelay=0m
reject "memberReplacementDelay" --set memberReplacementDelay=10
reject "image.digest" --set image.digest=latest
reject "image" --set-string image.tag=v1
reject "replicas" --set replicas=0
reject "logFormat" --set logFormat=xml
reject "reconcileConcurrency" --set reconcileConcurrency=0
reject "reconcileConcurrency" --set reconcileConcurrency=65
reject "watchNamespacesPerConnection" --set watchNamespacesPerConnection=101
reject "watchNamespacesPerConnection" --set-string watchNamespacesPerConnection=ten
reject "watchScope" --set watchScope=everywhere
reject "mallocArenas" --set mallocArenas=257
reject "mallocArenas" --set mallocArenas=-1
reject "statusProgressInterval" --set statusProgressInterval=11s
reject "statusProgressInterval" --set statusProgressInterval=500ms
reject "statusProgressInterval" --set statusProgressInterval=1m
reject "annotationBytes" --set journal.annotationBytes=200000
reject "cacheBytes" --set journal.cacheBytes=1048575
reject "cacheBytes" --set journal.cacheBytes=2147483648
reject "cacheBytes" --set-string journal.cacheBytes=8Mi
reject "fleetNamespaces" --set 'fleetNamespaces={Bad_NS}'
reject "networkPolicyEnforced" --set-string networkPolicyEnforced=yes
reject "additional" --set unknownKey=1
reject "metrics.port and healthPort are both 8082" --set metrics.port=8082
accept --set metrics.enabled=false --set metrics.port=8082
accept --set memberReplacementDelay=1m
accept --set watchNamespacesPerConnection=0 --set reconcileConcurrency=64
accept --set mallocArenas=1
accept --set journal.cacheBytes=1073741824
accept --set statusProgressInterval=0s
accept --set-string statusProgressInterval=0
accept --set statusProgressInterval=10s
accept --set watchScope=cluster
accept --set memberReplacementDelay=2h
accept --set memberReplacementDelay=1h5m

echo "==> template snapshots"
mkdir -p "$here/snapshots"
for values in "$here"/values-*.yaml; do
  name=$(basename "$values" .yaml)
  rendered=$("$helm" template celld-operator "$chart" --namespace celld-system -f "$values")
  snap=$here/snapshots/$name.yaml
  if [ "${UPDATE:-0}" = 1 ]; then
    printf '%s\n' "$rendered" > "$snap"; echo "  updated $snap"
  elif ! diff -u "$snap" <(printf '%s\n' "$rendered") >/dev/null 2>&1; then
    echo "  FAIL: $name differs from $snap (UPDATE=1 $0 after a deliberate change):"
    diff -u "$snap" <(printf '%s\n' "$rendered") | head -20 | sed 's/^/    /' || true
    fail=1
  else
    echo "  ok: $name"
  fi
done

echo "==> README values table covers every value of values.schema.json"
missing=$(python3 - "$chart/values.schema.json" "$repo/README.md" <<'PY'
import json, sys
schema = json.load(open(sys.argv[1]))
readme = open(sys.argv[2]).read()
table = readme[readme.index("## Install on a cluster"):]
table = table[:table.index("\n## ", 3)]
def leaves(node, prefix=""):
    props = node.get("properties")
    if not props:
        yield prefix
        return
    for key, sub in props.items():
        if key == "global":
            continue
        yield from leaves(sub, f"{prefix}.{key}" if prefix else key)
for path in leaves(schema):
    # A row names the value, or its parent with its children (e.g. `metrics.service/serviceMonitor`).
    parts = path.split(".")
    if f"`{path}`" in table:
        continue
    # Or a row naming an ancestor that lists this leaf (e.g. `metrics.service/serviceMonitor.enabled`).
    rows = [l for l in table.splitlines() if l.startswith("|")]
    if not any(f"`{'.'.join(parts[:i])}" in r and parts[-1] in r for r in rows for i in range(1, len(parts))):
        print(path)
PY
)
if [ -n "$missing" ]; then echo "  FAIL: values missing from README's table: $missing"; fail=1; else echo "  ok"; fi

echo "==> chart CRDs in sync with crds/"
if ! diff -u "$repo/crds/celld.eric.dev.yaml" "$chart/crds/celld.eric.dev.yaml" >/dev/null; then
  echo "  FAIL: helm/celld-operator/crds is stale: run 'make crds'"; fail=1
else
  echo "  ok"
fi

"$here/alerts-check.sh" || fail=1
exit $fail
