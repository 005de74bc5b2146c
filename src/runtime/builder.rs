//! `runtime::Builder`: settings in, a validated `Config` and a started `Runtime` out.

use std::io;
use std::time::Duration;

use super::Runtime;
use super::config::Config;
use crate::fiber::stack::{DEFAULT_STACK_SIZE, usable_size};

/// Default time between two supervisor samples: 10 ms detects a blocked carrier in ~2 ticks
/// (10–20 ms, Go's sysmon works at this scale) at ~0.15% of one core; a 1 ms tick measured
/// false positives from plain OS descheduling. See `arch/supervisor.md`.
pub const DEFAULT_SUPERVISOR_INTERVAL: Duration = Duration::from_millis(10);

/// Default bound on carriers, compensating ones included: Java's virtual-thread scheduler
/// allows 256; blocking pools far larger than the core count were a pain point (cats-effect).
pub const DEFAULT_MAX_CARRIERS: usize = 256;

/// Settings for a [`Runtime`]. Setters take and return the builder by value, so calls chain:
/// `Runtime::builder().carriers(2).build()`. Nothing is checked or started until
/// [`build`](Builder::build), which reports invalid settings as `io::ErrorKind::InvalidInput`.
#[derive(Debug, Clone)]
pub struct Builder {
    carriers: Option<usize>,
    max_carriers: Option<usize>,
    pin_carriers: bool,
    pin_started_fibers: bool,
    stack_size: usize,
    fiber_roots: bool,
    supervisor_interval: Duration,
    thread_name: String,
    fork_yield: u32,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder::new()
    }
}

impl Builder {
    /// The defaults: one carrier per CPU this process may use, pinned; 64 KiB stacks.
    pub fn new() -> Builder {
        Builder {
            carriers: None,
            max_carriers: None,
            pin_carriers: true,
            pin_started_fibers: false,
            stack_size: DEFAULT_STACK_SIZE,
            fiber_roots: true,
            supervisor_interval: DEFAULT_SUPERVISOR_INTERVAL,
            thread_name: "vt-carrier".into(),
            fork_yield: 0,
        }
    }

    /// Carrier threads to run fibers on. Default: the CPUs this process may use (its affinity
    /// mask and cgroup CPU quota, not the machine's core count). Must be at least 1.
    pub fn carriers(mut self, n: usize) -> Builder {
        self.carriers = Some(n);
        self
    }

    /// The most carriers that may exist at once, compensating carriers (started while others
    /// are blocked in the OS) included. Default: the larger of 256 and `carriers`. Must be at
    /// least `carriers`.
    pub fn max_carriers(mut self, n: usize) -> Builder {
        self.max_carriers = Some(n);
        self
    }

    /// Pin each carrier to one CPU (default `true`). Failing to pin is not an error.
    pub fn pin_carriers(mut self, pin: bool) -> Builder {
        self.pin_carriers = pin;
        self
    }

    /// Keep every fiber on the carrier where it first ran (default `false`: started fibers
    /// migrate, as Loom's do). The strict mode for code that keeps `!Send` values or
    /// thread-local references across switch points; see the README's "Soundness" section.
    pub fn pin_started_fibers(mut self, pin: bool) -> Builder {
        self.pin_started_fibers = pin;
        self
    }

    /// Default usable stack per fiber, in bytes, rounded up to whole pages. Default 64 KiB;
    /// between 16 KiB and 1 GiB. Stacks are reserved address space: a fiber costs only the
    /// pages it touches.
    pub fn stack_size(mut self, bytes: usize) -> Builder {
        self.stack_size = bytes;
        self
    }

    /// Keep a registry of live fibers for dumps (default `true`). Reserved: dumps are not
    /// implemented yet, and this setting has no effect today.
    pub fn fiber_roots(mut self, on: bool) -> Builder {
        self.fiber_roots = on;
        self
    }

    /// How often the supervisor samples the carriers (default 10 ms). A carrier stuck in the
    /// kernel for one to two intervals gets a compensating carrier. Must not be zero.
    pub fn supervisor_interval(mut self, every: Duration) -> Builder {
        self.supervisor_interval = every;
        self
    }

    /// Name prefix of the carrier threads (default `vt-carrier`; threads are `prefix-N`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Builder {
        self.thread_name = name.into();
        self
    }

    /// A fiber that spawns this many fibers in a row yields once, so its children start on
    /// other carriers (ZIO's fork-yield rule). Default 0: off — measured, a yield every 100
    /// spawns made W1 20% slower and W2 no faster (`arch/performance.md`).
    pub fn fork_yield(mut self, every: u32) -> Builder {
        self.fork_yield = every;
        self
    }

    /// Validates the settings and starts the carriers.
    ///
    /// Errors: `InvalidInput` for 0 carriers, `max_carriers < carriers`, a stack size out of
    /// range, a zero supervisor interval or a thread name with a NUL byte; otherwise the OS
    /// error from starting a thread.
    pub fn build(self) -> io::Result<Runtime> {
        Runtime::start(self.config()?)
    }

    fn config(self) -> io::Result<Config> {
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        let carriers = self.carriers.unwrap_or_else(crate::platform::usable_cpus);
        if carriers == 0 {
            return invalid("a runtime needs at least 1 carrier, got carriers(0)".into());
        }
        let max_carriers = self.max_carriers.unwrap_or(DEFAULT_MAX_CARRIERS.max(carriers));
        if max_carriers < carriers {
            return invalid(format!("max_carriers({max_carriers}) is below carriers({carriers})"));
        }
        if self.supervisor_interval.is_zero() {
            return invalid("supervisor_interval must be greater than zero".into());
        }
        if self.thread_name.contains('\0') {
            return invalid("thread_name must not contain a NUL byte".into());
        }
        Ok(Config {
            carriers,
            max_carriers,
            pin_carriers: self.pin_carriers,
            pin_started_fibers: self.pin_started_fibers,
            stack_size: usable_size(self.stack_size)?,
            fiber_roots: self.fiber_roots,
            supervisor_interval: self.supervisor_interval,
            thread_name: self.thread_name,
            fork_yield: self.fork_yield,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_are_invalid_input() {
        let kind = |b: Builder| b.config().unwrap_err().kind();
        assert_eq!(kind(Builder::new().carriers(0)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().carriers(4).max_carriers(2)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().stack_size(1024)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().supervisor_interval(Duration::ZERO)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().thread_name("a\0b")), io::ErrorKind::InvalidInput);
        assert!(Builder::new().carriers(3).config().unwrap().max_carriers >= 3);
    }
}
