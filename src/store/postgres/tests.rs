use crate::pg_tls::redact_url;

#[test]
fn passwords_are_redacted() {
    assert_eq!(
        redact_url("postgresql://kb:hunter2@db:5432/x"),
        "postgresql://kb:***@db:5432/x"
    );
    assert_eq!(redact_url("postgresql://kb@db/x"), "postgresql://kb@db/x");
}
