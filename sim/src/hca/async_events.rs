//! The devices' asynchronous events (`ibv_get_async_event`): what happens to a port, a
//! completion queue or the whole device outside any work request, queued for every open
//! context of the device that asked for its events, on a descriptor that is readable
//! while events are queued (as a context's `async_fd` is).
//!
//! Raised: `PortErr` and `PortActive` when a link goes down and comes back
//! ([`Fabric::link_down`](crate::Fabric::link_down)), `DeviceFatal` when a device crashes,
//! `CqErr` when a completion queue overflows (`cq.rs`), `SrqLimitReached` and
//! `QpLastWqeReached` (`srq.rs`), `CommEst` when a request reaches a queue pair in RTR,
//! and `QpAccessErr`, `QpReqErr` or `QpFatal` when a responder fails a request that
//! consumes no receive (`responder.rs`). A context's queue exists from the first
//! time its events are asked for; what happened before is not in it.

use crate::fd_queue::FdQueue;
use crate::types::{AsyncEvent, AsyncEventKind, EventElement, SimError};

/// One context's queue.
#[derive(Debug)]
struct Queue {
    dev: usize,
    events: FdQueue<AsyncEvent>,
}

/// Every context's queue, by index (slots are not reused while the world lives, so an
/// index names one queue).
#[derive(Debug, Default)]
pub(crate) struct AsyncQueues {
    queues: Vec<Option<Queue>>,
}

impl AsyncQueues {
    /// A queue for a context of device `dev`; its index.
    pub(crate) fn open(&mut self, dev: usize) -> Result<usize, SimError> {
        let events = FdQueue::new()?;
        self.queues.push(Some(Queue { dev, events }));
        Ok(self.queues.len() - 1)
    }

    /// The descriptor of queue `q`: readable while it holds events.
    pub(crate) fn fd(&self, q: usize) -> Option<std::os::fd::RawFd> {
        Some(self.queues.get(q)?.as_ref()?.events.fd())
    }

    /// Queues `ev` for every context of device `dev`.
    pub(crate) fn raise(&mut self, dev: usize, ev: AsyncEvent) {
        for q in self.queues.iter_mut().flatten().filter(|q| q.dev == dev) {
            q.events.push(ev);
        }
    }

    /// Queues event `kind` of queue pair `qpn` (of device `dev`) for every context of the
    /// device.
    pub(crate) fn raise_qp(&mut self, dev: usize, qpn: u32, kind: AsyncEventKind) {
        let ev = AsyncEvent {
            kind,
            element: EventElement::Qp(qpn),
        };
        self.raise(dev, ev);
    }

    /// The oldest event of queue `q`.
    pub(crate) fn take(&mut self, q: usize) -> Option<AsyncEvent> {
        self.queues.get_mut(q)?.as_mut()?.events.pop()
    }

    /// Closes queue `q` (its context is gone).
    pub(crate) fn close(&mut self, q: usize) {
        if let Some(slot) = self.queues.get_mut(q) {
            *slot = None;
        }
    }
}
