//! A queue of events with a descriptor that is readable exactly while the queue holds
//! any: one byte sits in a socket pair from the first event queued to the last taken. The
//! connection manager's event channels and the devices' asynchronous event queues are
//! such queues, as their verbs counterparts are descriptors a program polls.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::types::SimError;

#[derive(Debug)]
pub(crate) struct FdQueue<T> {
    events: VecDeque<T>,
    tx: UnixStream,
    rx: UnixStream,
}

impl<T> FdQueue<T> {
    /// An empty queue; [`SimError::QueueFull`] when no socket pair can be made (out of
    /// descriptors).
    pub(crate) fn new() -> Result<Self, SimError> {
        let full = |_| SimError::QueueFull;
        let (tx, rx) = UnixStream::pair().map_err(full)?;
        rx.set_nonblocking(true).map_err(full)?;
        Ok(FdQueue {
            events: VecDeque::new(),
            tx,
            rx,
        })
    }

    /// The descriptor, readable while events are queued.
    pub(crate) fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    /// A second handle on the descriptor, for a handle that outlives a borrow.
    pub(crate) fn clone_fd(&self) -> Result<UnixStream, SimError> {
        self.rx.try_clone().map_err(|_| SimError::QueueFull)
    }

    pub(crate) fn push(&mut self, ev: T) {
        if self.events.is_empty() {
            let _ = self.tx.write_all(&[1]);
        }
        self.events.push_back(ev);
    }

    /// The oldest event.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let ev = self.events.pop_front()?;
        self.quiet_if_empty();
        Some(ev)
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.events.iter()
    }

    /// Keeps the events `keep` holds for.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        let had = !self.events.is_empty();
        self.events.retain(keep);
        if had {
            self.quiet_if_empty();
        }
    }

    /// Takes every event.
    pub(crate) fn take_all(&mut self) -> VecDeque<T> {
        let all = std::mem::take(&mut self.events);
        if !all.is_empty() {
            self.quiet_if_empty();
        }
        all
    }

    /// Takes the byte back once the last event is gone.
    fn quiet_if_empty(&mut self) {
        if self.events.is_empty() {
            let _ = self.rx.read(&mut [0u8]);
        }
    }
}
