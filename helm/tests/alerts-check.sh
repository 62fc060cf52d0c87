#!/usr/bin/env bash
# The chart's PrometheusRule, rendered with the default values, checked and unit-tested with
# promtool (Debian package prometheus, installed by `make deps`): helm/tests/alerts-test.yaml
# has a firing and a non-firing case for every alert.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
helm=$("$repo/integration/cluster/build.sh" | tail -n 1)/helm
command -v promtool >/dev/null || { echo "promtool is missing: run 'make deps' (Debian package prometheus)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$helm" template celld-operator "$repo/helm/celld-operator" --namespace celld-system \
  --set metrics.prometheusRule.enabled=true |
  python3 -c '
import sys, yaml
specs = [d["spec"] for d in yaml.safe_load_all(sys.stdin) if d and d.get("kind") == "PrometheusRule"]
assert len(specs) == 1, "one PrometheusRule"
yaml.safe_dump(specs[0], sys.stdout, sort_keys=False)
' > "$tmp/rules.yaml"
cp "$here/alerts-test.yaml" "$tmp/"
echo "==> promtool check rules (the chart's PrometheusRule)"
promtool check rules "$tmp/rules.yaml"
echo "==> promtool test rules (helm/tests/alerts-test.yaml)"
(cd "$tmp" && promtool test rules alerts-test.yaml)
# Every alert is tested.
missing=$(python3 - "$tmp/rules.yaml" "$here/alerts-test.yaml" <<'PY'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
fired, quiet = set(), set()
for t in tests["tests"]:
    for c in t.get("alert_rule_test", []):
        (fired if c.get("exp_alerts") else quiet).add(c["alertname"])
for a in sorted(alerts):
    if a not in fired or a not in quiet:
        print(f"{a}: firing case {a in fired}, non-firing case {a in quiet}")
PY
)
if [ -n "$missing" ]; then echo "alerts without both cases:"; echo "$missing"; exit 1; fi
echo "  ok: every alert has a firing and a non-firing case"
