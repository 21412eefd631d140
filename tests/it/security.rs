//! A secured cluster: the test broker's SASL_SSL listener (SCRAM-SHA-512 over TLS, a CA made by
//! `scripts/certs.sh`) and PostgreSQL with `ssl=on`. `produce` → `run` → `verify` over SASL_SSL; a
//! wrong password and an untrusted CA fail fast naming the cause; the PostgreSQL store and snapshot
//! source connect with `sslmode=verify-full` and refuse a server their CA did not sign.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kafka_backfill::ports::StoreError;
use kafka_backfill::store::postgres::PostgresStore;
use kafka_backfill::workload::TableKind;
use support::{serial, Fixture, BIN};

const MIN: Duration = Duration::from_secs(60);

fn kafka_script(arg: &str) -> String {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh"))
        .arg(arg)
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/kafka.sh {arg}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn certs_dir() -> String {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/certs.sh"))
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Rewrites the fixture's `[jobs.kafka]` for the SASL_SSL listener with `password` and `ca`.
fn use_sasl_ssl(f: &Fixture, password: &str, ca: &str) -> String {
    support::bootstrap();
    let sasl = kafka_script("sasl-bootstrap");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let start = text.find("[jobs.kafka]").unwrap();
    let end = text[start..].find("[jobs.snapshot]").unwrap() + start;
    let kafka = format!(
        "[jobs.kafka]\n\"bootstrap.servers\" = \"{sasl}\"\n\"group.id\" = \"{}\"\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"SCRAM-SHA-512\"\n\"sasl.username\" = \"kb\"\n\"sasl.password\" = \"{password}\"\n\"ssl.ca.location\" = \"{ca}\"\n\"session.timeout.ms\" = \"6000\"\n",
        f.group
    );
    std::fs::write(
        &f.config,
        format!("{}{}{}", &text[..start], kafka, &text[end..]),
    )
    .unwrap();
    sasl
}

#[test]
fn sasl_ssl_with_scram_end_to_end_and_bad_credentials_or_ca_fail_fast() {
    let _g = serial();
    let f = Fixture::new("saslssl", 1, "");
    let ca = kafka_script("ca");
    // The password comes from the environment, as in production.
    std::env::set_var("KB_TEST_SASL_PASSWORD", "kb-test-secret");
    let sasl = use_sasl_ssl(&f, "${KB_TEST_SASL_PASSWORD}", &ca);
    let out = Command::new(BIN)
        .args(["produce", "--bootstrap", &sasl, "--topic", &f.topic])
        .args(["--partitions", "2", "--rows", "500", "--changes", "2000"])
        .args([
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanisms=SCRAM-SHA-512",
        ])
        .args([
            "-X",
            "sasl.username=kb",
            "-X",
            "sasl.password=${KB_TEST_SASL_PASSWORD}",
        ])
        .args(["-X", &format!("ssl.ca.location={ca}")])
        .arg("--out")
        .arg(f.dir.join("out"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "produce over SASL_SSL: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    let v = f.verify();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));

    // A wrong password: the start-up check fails fast, naming the authentication failure.
    use_sasl_ssl(&f, "not-the-password", &ca);
    fails_fast_naming(&f, "b", "SASL authentication error", 2);
    // A CA that did not sign the broker's certificate.
    let other = format!("{}/other-ca.crt", certs_dir());
    use_sasl_ssl(&f, "kb-test-secret", &other);
    // librdkafka says it twice (the handshake, then OpenSSL's error), the final error once.
    fails_fast_naming(&f, "c", "certificate verify failed", 3);
}

/// `run` exits non-zero within 30 s and its last line is an error containing `cause`.
fn fails_fast_naming(f: &Fixture, prefix: &str, cause: &str, at_most: usize) {
    let started = Instant::now();
    let mut run = f.spawn_run(prefix, &["--exit-when-caught-up"]);
    let status = run.wait_exit(MIN);
    let log = run.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not fast: {log}"
    );
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains(cause),
        "the final error names the cause: {log}"
    );
    // Said by librdkafka's own line(s) and by the final error, not again by every client and
    // callback (`src/kafka/client_log.rs`; a wrong password was five lines).
    assert!(
        log.matches(cause).count() <= at_most,
        "the cause is said more than {at_most} times: {log}"
    );
}

fn tls_url(ca: &str) -> String {
    format!("{}?sslmode=verify-full&sslrootcert={ca}", support::pg_url())
}

#[test]
fn postgres_store_over_verify_full_tls_and_an_untrusted_server_is_refused() {
    let certs = certs_dir();
    let url = tls_url(&format!("{certs}/ca.crt"));
    let mut c = kafka_backfill::pg_tls::connect(&url).unwrap();
    let ssl: bool = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(ssl, "the connection is encrypted");
    let table = TableKind::Accounts.schema().unwrap();
    let tname = format!("tls_{}", std::process::id());
    PostgresStore::open(&url, &tname, table.clone()).unwrap();

    let bad = tls_url(&format!("{certs}/other-ca.crt"));
    let started = Instant::now();
    let e = PostgresStore::open(&bad, &tname, table)
        .err()
        .expect("refused");
    assert!(matches!(e, StoreError::Rejected { .. }), "permanent: {e}");
    assert!(e.to_string().contains("certificate verify failed"), "{e}");
    assert!(!e.is_transient());
    assert!(started.elapsed() < Duration::from_secs(5), "not retried");
    // verify-full checks the host name too: the certificate is for 127.0.0.1 and localhost only.
    let e = kafka_backfill::pg_tls::connect(&url.replace("127.0.0.1", "127.0.0.2")).err();
    assert!(
        e.is_some(),
        "a host the certificate does not name is refused"
    );
}

/// The snapshot source over TLS: export a snapshot to PostgreSQL and back-fill from it, both with
/// `sslmode=verify-full`.
#[test]
fn postgres_snapshot_source_over_verify_full_tls() {
    let _g = serial();
    let certs = certs_dir();
    let url = tls_url(&format!("{certs}/ca.crt"));
    let f = Fixture::new(&format!("pgtls{}", std::process::id()), 1, "");
    f.produce(&["--partitions", "2", "--rows", "800", "--changes", "1000"]);
    let snap = format!("tls-snap-{}", std::process::id());
    let out = Command::new(BIN)
        .args(["export-snapshot", "--from"])
        .arg(f.dir.join("out/snapshot"))
        .args([
            "--to-postgres",
            &url,
            "--name",
            &snap,
            "--table",
            "tls_snapshot_rows",
        ])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    f.use_postgres_snapshot(&url, &snap);
    f.use_postgres(&url);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(2 * MIN).success(),
        "{}",
        support::tail(&run.log_text())
    );
    let v = f.verify();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
}
