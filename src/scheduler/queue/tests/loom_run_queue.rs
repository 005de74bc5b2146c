use super::*;

impl Entry for usize {
    fn into_word(self) -> usize {
        self
    }
    unsafe fn from_word(word: usize) -> Self {
        word
    }
}

fn drain(q: &Local<usize>, into: &mut Vec<usize>) {
    into.extend(std::iter::from_fn(|| q.pop()));
}

/// The owner pushes past the ring's wrap and pops while a thief steals: every entry is taken
/// exactly once, and a slot the owner reuses is never handed out from its old contents.
#[test]
fn loom_run_queue_owner_and_thief_take_each_once() {
    loom::model(|| {
        let (owner, remote) = new::<usize>(2);
        owner.push(1).unwrap();
        owner.push(2).unwrap();
        let thief = loom::thread::spawn(move || {
            let (mine, _) = new::<usize>(2);
            let mut got: Vec<usize> = remote.steal_into(&mine, 32).into_iter().collect();
            drain(&mine, &mut got);
            got
        });
        let mut got: Vec<usize> = owner.pop().into_iter().collect();
        // Reuses slot 0 once 1 is gone (by our pop or the steal).
        if owner.push(3).is_err() {
            drain(&owner, &mut got);
            owner.push(3).unwrap();
        }
        drain(&owner, &mut got);
        got.extend(thief.join().unwrap());
        got.sort_unstable();
        assert_eq!(got, [1, 2, 3]);
    });
}

/// The owner spills a batch while a thief steals half: one CAS each, no entry twice.
#[test]
fn loom_run_queue_spill_against_a_steal() {
    loom::model(|| {
        let (owner, remote) = new::<usize>(4);
        for i in 1..=3 {
            owner.push(i).unwrap();
        }
        let thief = loom::thread::spawn(move || {
            let (mine, _) = new::<usize>(4);
            let mut got: Vec<usize> = remote.steal_into(&mine, 32).into_iter().collect();
            drain(&mine, &mut got);
            got
        });
        let mut got = Vec::new();
        owner.take_into(&mut got, 2);
        drain(&owner, &mut got);
        got.extend(thief.join().unwrap());
        got.sort_unstable();
        assert_eq!(got, [1, 2, 3]);
    });
}
