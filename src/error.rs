//! How an error chain becomes the one line an operator reads.
//!
//! Errors here keep their cause as `source` (a client's error stays reachable by type, e.g. a
//! `postgres::Error` beneath a [`StoreError`]). Printing a chain with `{:#}` then risks saying a
//! cause twice: some errors already put their cause's text in their own `Display` (a
//! [`StoreError`] names the server's message), and some clients repeat their source in their own
//! text. [`line`] and [`chain_line`] print each cause once. This module owns that rule only; it
//! must not decide what is transient or permanent (each error's own type does).

use std::error::Error;

use crate::ports::StoreError;

pub use crate::ports::Cause;

/// An `anyhow` chain on one line, `: `-separated, each cause said once ([`chain_line`]).
pub fn line(e: &anyhow::Error) -> String {
    chain_line(e.as_ref())
}

/// An error and the causes beneath it on one line, `: `-separated. A cause whose text the line
/// already holds is left out, and nothing beneath a [`StoreError`] is added: its `Display` already
/// names its cause.
pub fn chain_line(e: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        if e.downcast_ref::<StoreError>().is_some() {
            break;
        }
        next = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn each_cause_is_said_once_and_a_store_error_ends_the_line() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let e = anyhow::Error::new(Outer(io)).context("reading job progress");
        assert_eq!(line(&e), "reading job progress: outer: connection reset");

        let cause: Cause = Box::new(std::io::Error::other("connection reset"));
        let store = StoreError::backend_from("PostgreSQL: connection reset", cause);
        let e = anyhow::Error::new(store).context("committing");
        assert_eq!(
            line(&e),
            "committing: state store unavailable: PostgreSQL: connection reset"
        );
        // The cause is kept, by type.
        let kept = e
            .chain()
            .find_map(|c| c.downcast_ref::<std::io::Error>())
            .expect("the io::Error stays reachable");
        assert_eq!(kept.to_string(), "connection reset");
    }
}
