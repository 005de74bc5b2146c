//! Helpers shared by the integration tests that include this module (`mod common;`).

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on a helper thread and fails the test if it has not returned within `limit` (a
/// hang becomes a failure that names `what`); a panic in `f` is the test's.
pub fn within<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(panic::catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => panic::resume_unwind(p),
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}
