//! Two callers of one `Once`: the initialiser runs once, the other parks until it is done
//! (or arrives after), and sees its write; a panicking initialiser poisons the other.
use super::Once;
use crate::sync::loom::{Arc, AtomicUsize, Ordering};

#[test]
fn once_waiter_meets_initialiser() {
    ::loom::model(|| {
        let once = Arc::new(Once::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let (o, r) = (once.clone(), runs.clone());
        let other = ::loom::thread::spawn(move || {
            o.call_once(|| {
                r.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(r.load(Ordering::Relaxed), 1);
        });
        once.call_once(|| {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        other.join().unwrap();
    });
}

#[test]
fn once_poison_reaches_waiter() {
    ::loom::model(|| {
        let once = Arc::new(Once::new());
        let o = once.clone();
        let other = ::loom::thread::spawn(move || {
            let mut forced = false;
            o.call_once_force(|_| forced = true);
            forced
        });
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            once.call_once(|| panic!("init"));
        }));
        // We panicked (poisoning it) and the other forced it after, or the other ran
        // first: either way the forced closure ran and the `Once` completed.
        assert!(other.join().unwrap());
        assert!(once.is_completed());
    });
}
