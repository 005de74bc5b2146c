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

/// A stop meets the hand-off of the lock to its first waiter (modelled without an unwind, as
/// in `channel::chan`'s stop model: the waiter's wait runs the unwind's `abandon` and ends).
/// The stopped waiter either got the lock (and releases it) or passed it on: the next waiter
/// gets it either way, and the lock ends free; never held twice, never lost.
#[test]
fn stop_races_a_lock_hand_off() {
    use ::loom::sync::atomic::AtomicBool;
    ::loom::model(|| {
        let m = Arc::new(Mutex::new(0u32));
        let held = m.lock().unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let (m1, stop) = (m.clone(), flag.clone());
        let victim = ::loom::thread::spawn(move || {
            crate::sync::loom::stop_flag(stop);
            let got = m1.lock_contended();
            if got {
                // SAFETY: `lock_contended` returned true: this thread holds the lock.
                let mut g = unsafe { MutexGuard::new(&m1) }.unwrap();
                *g += 1;
            }
            got
        });
        // The canceller: the stop and its unpark, once the victim has queued, and before
        // anyone else can hold the queue's inner lock (loom's `Thread::unpark` also resumes a
        // thread blocked on a loom lock, as if it were free).
        while m.state.load(Ordering::Relaxed) & QUEUED == 0 {
            ::loom::thread::yield_now();
        }
        flag.store(true, Ordering::Release);
        victim.thread().unpark();
        let m2 = m.clone();
        let next = ::loom::thread::spawn(move || *m2.lock().unwrap() += 10);
        drop(held);
        let got = victim.join().unwrap();
        next.join().unwrap();
        assert_eq!(*m.try_lock().expect("the lock ends free"), 10 + u32::from(got));
    });
}
