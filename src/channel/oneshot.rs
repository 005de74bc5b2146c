//! A channel for exactly one message: `send` consumes the sender, `recv` the receiver.
//!
//! Built on a one-slot channel, so it shares that channel's proof: the single message is either
//! received once or handed back to the sender (when the receiver is gone).
//!
//! ```
//! use virtual_threads as vt;
//!
//! let (tx, rx) = vt::channel::oneshot::channel();
//! vt::spawn(move || tx.send("done").unwrap());
//! assert_eq!(rx.recv(), Ok("done"));
//! ```

use std::fmt;
use std::time::Duration;

use super::error::{RecvError, RecvTimeoutError, TryRecvError, TrySendError};

/// `let (tx, rx) = vt::channel::oneshot::channel::<u64>();`
///
/// Creates a oneshot channel.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = super::bounded(1);
    (Sender { tx }, Receiver { rx })
}

/// Sends the one message.
pub struct Sender<T> {
    tx: super::Sender<T>,
}

/// Receives the one message.
pub struct Receiver<T> {
    rx: super::Receiver<T>,
}

impl<T> Sender<T> {
    /// Sends the message without blocking; `Err` hands it back if the receiver is gone.
    pub fn send(self, msg: T) -> Result<(), T> {
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(msg)) => Err(msg),
            Err(TrySendError::Full(_)) => unreachable!("a oneshot sender sends once"),
        }
    }
}

impl<T> Receiver<T> {
    /// Parks until the message arrives; `Err` if the sender was dropped without sending.
    pub fn recv(self) -> Result<T, RecvError> {
        self.rx.recv()
    }

    /// Parks for at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// Takes the message if it has arrived.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv()
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("oneshot::Sender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("oneshot::Receiver").finish_non_exhaustive()
    }
}
