use super::*;

/// Two lockers and the main thread increment under the lock; the fast path, the queue and
/// both unlock paths (wake and hand-off) all get explored.
#[test]
fn exclusive_and_no_lost_unlock() {
    ::loom::model(|| {
        let m = Arc::new(Mutex::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                ::loom::thread::spawn(move || *m.lock().unwrap() += 1)
            })
            .collect();
        *m.lock().unwrap() += 1;
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock().unwrap(), 3);
    });
}
