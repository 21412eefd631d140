//! Connecting to PostgreSQL with TLS as libpq's URL options describe it, for the state store and the
//! snapshot source: `sslmode` = `disable`, `prefer` (the default), `require`, `verify-ca` or
//! `verify-full`, with `sslrootcert` (the CA file) and, for client certificates, `sslcert` and
//! `sslkey`. `require` with an `sslrootcert` verifies the chain like `verify-ca` (libpq's rule).
//!
//! Owns only connection set-up (and [`redact_url`], a URL's password hidden for messages); what is
//! sent over the connection is the stores' business.

use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use postgres::config::SslMode;
use postgres::{Client, NoTls};
use postgres_openssl::MakeTlsConnector;

/// The TLS options of a URL, taken out of it (the `postgres` crate knows only some of them).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    pub mode: String,
    pub root_cert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// Splits the TLS options off a `postgresql://…?…` URL; returns the rest of the URL and the options.
pub fn split_tls_options(url: &str) -> (String, TlsOptions) {
    let mut opts = TlsOptions {
        mode: "prefer".into(),
        ..Default::default()
    };
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), opts);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => opts.mode = v.to_string(),
            "sslrootcert" => opts.root_cert = Some(v.to_string()),
            "sslcert" => opts.cert = Some(v.to_string()),
            "sslkey" => opts.key = Some(v.to_string()),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rest, opts)
}

/// Why a connection failed, and whether trying again can help.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConnectError {
    /// The redacted URL and the whole cause chain, on one line.
    pub message: String,
    /// A bad URL, TLS set-up or certificate, or refused credentials: retrying cannot help.
    pub permanent: bool,
    /// The client's error, when there was one (not for a URL refused before connecting).
    #[source]
    pub cause: Option<postgres::Error>,
}

/// The sslmode values [`connect`] knows.
const SSL_MODES: [&str; 5] = ["disable", "prefer", "require", "verify-ca", "verify-full"];

/// Checks a URL as [`connect`] will read it, without connecting: the scheme, the connection
/// string and `sslmode`. Errors say what is wrong (the URL is never printed).
pub fn check_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
        let scheme = url.split_once("://").map_or("(none)", |(s, _)| s);
        return Err(format!(
            "scheme {scheme}: a PostgreSQL URL starts with postgresql://"
        ));
    }
    let (rest, opts) = split_tls_options(url);
    if !SSL_MODES.contains(&opts.mode.as_str()) {
        return Err(format!(
            "sslmode {} is not one of {}",
            opts.mode,
            SSL_MODES.join(", ")
        ));
    }
    rest.parse::<postgres::Config>()
        .map(drop)
        .map_err(|e| format!("not a PostgreSQL connection URL: {e}"))
}

/// Connects as the URL says, TLS included. Errors name the (redacted) URL and the cause.
pub fn connect(url: &str) -> Result<Client, ConnectError> {
    let (rest, opts) = split_tls_options(url);
    let fail = |what: String| ConnectError {
        message: format!("connecting to PostgreSQL at {}: {what}", redact_url(url)),
        permanent: true,
        cause: None,
    };
    let mut config: postgres::Config = rest.parse().map_err(|e| fail(format!("{e}")))?;
    let (verify, hostname) = match opts.mode.as_str() {
        "disable" => {
            config.ssl_mode(SslMode::Disable);
            return config.connect(NoTls).map_err(|e| connect_failed(url, e));
        }
        "prefer" => (opts.root_cert.is_some(), false),
        "require" => (opts.root_cert.is_some(), false),
        "verify-ca" => (true, false),
        "verify-full" => (true, true),
        other => {
            return Err(fail(format!(
                "sslmode {other} is not one of {}",
                SSL_MODES.join(", ")
            )))
        }
    };
    config.ssl_mode(if opts.mode == "prefer" {
        SslMode::Prefer
    } else {
        SslMode::Require
    });
    let mut builder = SslConnector::builder(SslMethod::tls_client())
        .map_err(|e| fail(format!("TLS set-up: {e}")))?;
    if verify {
        builder.set_verify(SslVerifyMode::PEER);
        if let Some(ca) = &opts.root_cert {
            builder
                .set_ca_file(ca)
                .map_err(|e| fail(format!("sslrootcert {ca}: {e}")))?;
        }
    } else {
        builder.set_verify(SslVerifyMode::NONE);
    }
    if let Some(cert) = &opts.cert {
        builder
            .set_certificate_chain_file(cert)
            .map_err(|e| fail(format!("sslcert {cert}: {e}")))?;
    }
    if let Some(key) = &opts.key {
        builder
            .set_private_key_file(key, SslFiletype::PEM)
            .map_err(|e| fail(format!("sslkey {key}: {e}")))?;
    }
    let mut connector = MakeTlsConnector::new(builder.build());
    if !hostname {
        connector.set_callback(|c, _| {
            c.set_verify_hostname(false);
            Ok(())
        });
    }
    config
        .connect(connector)
        .map_err(|e| connect_failed(url, e))
}

/// A failed connection: the whole cause chain (the TLS cause, e.g. "certificate verify failed", is
/// in its sources); refused credentials and TLS failures are permanent, the rest (server down,
/// starting up, too many connections) transient.
fn connect_failed(url: &str, e: postgres::Error) -> ConnectError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    let auth = e
        .code()
        .is_some_and(|c| c.code().starts_with("28") || c.code() == "3D000");
    let tls = msg.contains("TLS") || msg.contains("SSL") || msg.contains("certificate");
    ConnectError {
        message: format!("connecting to PostgreSQL at {}: {msg}", redact_url(url)),
        permanent: auth || tls,
        cause: Some(e),
    }
}

/// `postgresql://user:secret@host/db` → `postgresql://user:***@host/db`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_split_off_the_url() {
        let (rest, o) = split_tls_options(
            "postgresql://u:p@h:5432/db?sslmode=verify-full&application_name=kb&sslrootcert=/ca.crt",
        );
        assert_eq!(rest, "postgresql://u:p@h:5432/db?application_name=kb");
        assert_eq!(o.mode, "verify-full");
        assert_eq!(o.root_cert.as_deref(), Some("/ca.crt"));
        let (rest, o) = split_tls_options("postgresql://h/db");
        assert_eq!(
            (rest.as_str(), o.mode.as_str()),
            ("postgresql://h/db", "prefer")
        );
    }

    #[test]
    fn an_unknown_sslmode_is_an_error_naming_it() {
        let e = connect("postgresql://u:secret@127.0.0.1:1/db?sslmode=verify-some")
            .err()
            .unwrap();
        assert!(e.permanent);
        let e = e.to_string();
        assert!(e.contains("sslmode verify-some is not one of"), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }
}
