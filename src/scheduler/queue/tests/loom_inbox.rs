//! The inbox's model: two pushers against a taker, on `crate::loom`'s atomics (the nodes are
//! the unit tests').

use super::tests::node;
use super::*;
use crate::loom::Arc;

/// Two pushers against a taker: every entry comes out exactly once, in each pusher's order.
#[test]
fn loom_inbox_two_pushers_one_taker() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new());
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let inbox = inbox.clone();
                loom::thread::spawn(move || {
                    inbox.push(node(10 * t + 1));
                    inbox.push(node(10 * t + 2));
                })
            })
            .collect();
        let mut seen: Vec<usize> = inbox.take_all().map(|n| n.value).collect();
        pushers.into_iter().for_each(|h| h.join().unwrap());
        seen.extend(inbox.take_all().map(|n| n.value));
        for t in 0..2 {
            let mine: Vec<_> = seen.iter().copied().filter(|v| v / 10 == t).collect();
            assert_eq!(mine, [10 * t + 1, 10 * t + 2], "pusher {t}: each once, in order");
        }
    });
}
