//! The process's one shutdown signal (mini-redis's shape): a `CancellationToken` created by the
//! process shell (`src/service/process.rs`) and handed, cloned, to every thread and task it starts —
//! workers, HTTP servers, captures. A task stops at its next safe point once the token is
//! cancelled (a worker between steps, a capture between source transactions, a server at its next
//! accept); the shell waits for them. Nothing here imports the rest of the crate, so every edge may
//! take a token.

use std::time::Duration;

pub use tokio_util::sync::CancellationToken;

/// Waits up to `timeout` on a plain thread (not a runtime's) for `token`; true if it was cancelled.
/// For back-offs that must end at once on shutdown.
pub fn wait_blocking(token: &CancellationToken, timeout: Duration) -> bool {
    if token.is_cancelled() {
        return true;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        // No runtime (out of threads or descriptors): wait the whole time, then look once.
        std::thread::sleep(timeout);
        return token.is_cancelled();
    };
    rt.block_on(async {
        tokio::select! {
            _ = token.cancelled() => true,
            _ = tokio::time::sleep(timeout) => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_when_the_token_is_cancelled_not_at_its_timeout() {
        let token = CancellationToken::new();
        let other = token.clone();
        let started = std::time::Instant::now();
        let t = std::thread::spawn(move || wait_blocking(&other, Duration::from_secs(600)));
        token.cancel();
        assert!(t.join().unwrap(), "the wait saw the cancellation");
        assert!(started.elapsed() < Duration::from_secs(600));
        assert!(!wait_blocking(
            &CancellationToken::new(),
            Duration::from_millis(1)
        ));
    }
}
