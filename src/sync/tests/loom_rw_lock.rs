//! `downgrade` meets a reader and a writer that queue (or not) meanwhile: the reader gets
//! in while the downgraded guard is held, or after; the writer only after every reader;
//! nobody parks for good.
use super::RwLock;
use crate::sync::loom::Arc;

#[test]
fn downgrade_races_queued_reader_and_writer() {
    ::loom::model(|| {
        let lock = Arc::new(RwLock::new(0u32));
        let w = lock.write().unwrap();
        let l = lock.clone();
        let reader = ::loom::thread::spawn(move || *l.read().unwrap());
        let l = lock.clone();
        let writer = ::loom::thread::spawn(move || {
            *l.write().unwrap() = 2;
        });
        let mut w = w;
        *w = 1;
        let r = super::RwLockWriteGuard::downgrade(w);
        assert_eq!(*r, 1);
        drop(r);
        let seen = reader.join().unwrap();
        writer.join().unwrap();
        assert!(seen == 1 || seen == 2, "{seen}");
        assert_eq!(*lock.read().unwrap(), 2);
    });
}
