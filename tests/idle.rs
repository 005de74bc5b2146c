//! Idle means idle: with no work, carriers and the supervisor sleep. Its own test binary, so
//! that no other test's runtime runs in the process while CPU time is measured.

use std::time::Duration;

use virtual_threads as vt;

fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    Duration::from_secs(ru.ru_utime.tv_sec as u64 + ru.ru_stime.tv_sec as u64)
        + Duration::from_micros(ru.ru_utime.tv_usec as u64 + ru.ru_stime.tv_usec as u64)
}

#[test]
fn an_idle_runtime_uses_no_cpu() {
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    rt.block_on(|| (0..1000).map(|i| vt::spawn(move || i)).for_each(|h| drop(h.join())));
    // A fiber that sleeps keeps a timer armed: the runtime must still sleep between ticks.
    let sleeper = rt.spawn(|| vt::sleep(Duration::from_millis(400)));
    std::thread::sleep(Duration::from_millis(50)); // carriers finish their short spin and park
    let before = cpu_time();
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_time() - before;
    // A spinning carrier would use ~500 ms; a supervisor ticking every 10 ms a few ms.
    assert!(used < Duration::from_millis(25), "idle runtime used {used:?} of CPU in 500 ms");
    sleeper.join().unwrap();
}
