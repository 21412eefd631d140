//! The alerting rules (`deploy/helm/kafka-backfill/files/alerts.yml`, shared by the Helm chart's
//! PrometheusRule and docker/compose.yaml's Prometheus) are valid for Prometheus and each fires on
//! what it is for and on nothing in a healthy job (`tests/alerts/alerts_test.yml`, promtool's own
//! unit tests of rules).

use std::process::Command;

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("promtool (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alerting_rules_are_valid_and_fire_on_what_they_are_for() {
    promtool(&[
        "check",
        "rules",
        "deploy/helm/kafka-backfill/files/alerts.yml",
    ]);
    promtool(&["test", "rules", "tests/alerts/alerts_test.yml"]);
}
