#!/usr/bin/env bash
# The Helm chart, checked offline (CI runs this; docs/OPERATIONS.md "Kubernetes"):
#  - `helm lint --strict` with the default values and every deploy/helm/examples/*.yaml;
#  - each render validated against Kubernetes' own schemas by kubernetes-validate (bundled, --strict);
#    the PodMonitor and PrometheusRule (CRDs those schemas lack) are checked field by field, the
#    rules also by `promtool check rules`;
#  - the config.toml each render puts in its ConfigMap passes `kafka-backfill check-config`, and the
#    pod's termination grace exceeds the config's shutdown_grace_secs;
#  - every deploy/helm/must-fail/*.yaml must fail to render, with the message its `# expect:` names.
# Needs helm and kubernetes-validate (scripts/deps.sh installs both) and a built binary
# (KB_BIN, default target/release/kafka-backfill, else target/debug/kafka-backfill).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.local/bin:$HOME/go/bin:$PATH"
chart=deploy/helm/kafka-backfill
bin=${KB_BIN:-}
if [ -z "$bin" ]; then
  if [ -x target/release/kafka-backfill ]; then bin=target/release/kafka-backfill; else bin=target/debug/kafka-backfill; fi
fi
[ -x "$bin" ] || { echo "helm-check: no binary at $bin (cargo build first)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "kafka-test-password" > "$work/password"

check_render() { # $1: label, $2...: helm args
  local label=$1; shift
  echo "-- $label"
  helm lint --strict "$chart" "$@" >"$work/lint.txt" || { cat "$work/lint.txt"; exit 1; }
  helm template kb "$chart" "$@" >"$work/render.yaml"
  python3 - "$work" <<'PY'
import sys, yaml
work = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(f"{work}/render.yaml")) if d]
kinds = sorted(d["kind"] for d in docs)
core = [d for d in docs if d["kind"] not in ("PodMonitor", "PrometheusRule")]
with open(f"{work}/core.yaml", "w") as f:
    yaml.safe_dump_all(core, f)
for d in docs:
    if d["kind"] == "PodMonitor":
        assert d["apiVersion"] == "monitoring.coreos.com/v1", d["apiVersion"]
        ep = d["spec"]["podMetricsEndpoints"]
        assert ep and ep[0]["port"] == "http" and ep[0]["path"] == "/metrics", ep
        assert d["spec"]["selector"]["matchLabels"], "PodMonitor selects nothing"
for d in docs:
    if d["kind"] == "PrometheusRule":
        assert d["apiVersion"] == "monitoring.coreos.com/v1", d["apiVersion"]
        alerts = [r["alert"] for g in d["spec"]["groups"] for r in g["rules"]]
        assert "KafkaBackfillStalled" in alerts and len(alerts) == 6, alerts
        open(f"{work}/rules.yaml", "w").write(yaml.safe_dump({"groups": d["spec"]["groups"]}))
(cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
open(f"{work}/config.toml", "w").write(cm["data"]["config.toml"])
(sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
pod = sts["spec"]["template"]["spec"]
assert sts["spec"]["podManagementPolicy"] == "Parallel"
assert sts["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
(c,) = pod["containers"]
assert c["securityContext"]["readOnlyRootFilesystem"] is True
assert pod["securityContext"]["runAsNonRoot"] is True
assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
for e in c.get("env", []):
    assert "value" not in e or "PASSWORD" not in e["name"] or e["name"].endswith("_FILE"), f"secret as a plain env value: {e}"
open(f"{work}/grace", "w").write(str(pod["terminationGracePeriodSeconds"]))
# Capture pods (capture.mode separate): their own labels, the snapshot volume the StatefulSet reads.
sts_sel = sts["spec"]["selector"]["matchLabels"]
for dep in (d for d in docs if d["kind"] == "Deployment"):
    dpod = dep["spec"]["template"]["spec"]
    (dc,) = dpod["containers"]
    assert dc["args"][0] == "capture" and "--job" in dc["args"], dc["args"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    assert dc["securityContext"]["readOnlyRootFilesystem"] is True
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert any(labels.get(k) != v for k, v in sts_sel.items()), "capture pods match the StatefulSet's selector"
    mount = [m for m in dc["volumeMounts"] if m["name"] == "capture-snapshots"]
    smount = [m for m in c["volumeMounts"] if m["name"] == "capture-snapshots"]
    cfg = cm["data"]["config.toml"]
    if 'snapshot_storage = "kafka"' in cfg:
        # Snapshots stored in Kafka: nothing shared; the capture writes under its own data dir.
        assert mount and mount[0]["mountPath"] == "/var/lib/kafka-backfill", mount
        assert not smount, "a shared snapshot volume with snapshots stored in Kafka"
        assert not any(v["name"] == "capture-snapshots" for v in pod["volumes"]), pod["volumes"]
    else:
        assert mount and smount and mount[0]["mountPath"] == smount[0]["mountPath"], "snapshot volume not shared"
        assert smount[0].get("readOnly") is True
    print("   capture pod:", " ".join(dc["args"]))
if "--capture" in c["args"]:
    print("   in-process capture:", " ".join(c["args"]))
print("   rendered:", ", ".join(kinds))
PY
  kubernetes-validate --strict --quiet "$work/core.yaml"
  if [ -s "$work/rules.yaml" ]; then promtool check rules "$work/rules.yaml" >/dev/null; rm "$work/rules.yaml"; fi
  local out
  out=$(POD_NAME=kb-kafka-backfill-0 KB_PG_URL=postgresql://backfill@db:5432/app \
        KB_SOURCE_URL=postgresql://capture@source:5432/app KB_ADMIN_TOKEN=kb-test-token \
        KAFKA_PASSWORD_FILE="$work/password" "$bin" check-config "$work/config.toml") \
    || { echo "check-config refused the rendered config:"; cat "$work/config.toml"; exit 1; }
  echo "   check-config: ${out%%$'\n'*}"
  local grace shutdown
  grace=$(cat "$work/grace")
  shutdown=$(sed -n 's/^shutdown_grace_secs = //p' "$work/config.toml")
  [ "$grace" -gt "$shutdown" ] || { echo "terminationGracePeriodSeconds $grace <= shutdown_grace_secs $shutdown"; exit 1; }
  grep -q '"group.instance.id"' "$work/config.toml" || { echo "no static membership in the rendered config"; exit 1; }
}

check_render "default values"
for v in deploy/helm/examples/*.yaml; do check_render "$v" -f "$v"; done

for v in deploy/helm/must-fail/*.yaml; do
  expect=$(sed -n 's/^# expect: //p' "$v")
  [ -n "$expect" ] || { echo "$v has no '# expect:' line"; exit 1; }
  if helm template kb "$chart" -f "$v" >"$work/out.txt" 2>&1; then
    echo "$v rendered, but must fail"; exit 1
  fi
  grep -qF -- "$expect" "$work/out.txt" || { echo "$v failed without '$expect':"; cat "$work/out.txt"; exit 1; }
  echo "-- $v fails as it must: $(grep -m1 -F -- "$expect" "$work/out.txt" | sed 's/^ *//')"
done
echo "helm-check: ok"
