//! The member's examples, run as tests: each example's code is what the README's sections
//! "Using async crates" and "With rustls, tungstenite, httparse" quote.

#[allow(dead_code)] // its `main`
#[path = "../examples/tokio_interop.rs"]
mod tokio_interop;

#[test]
fn tokio_interop_both_ways() {
    tokio_interop::demo(100).unwrap();
}
