//! Completion queues shared by async channels: one queue (and its dispatcher) for many
//! channels, with one reactor task that sleeps on its completion channel for all of them.
//!
//! The reactor holds the queue's lead for good (the leader/follower scheme of
//! `dispatch/sleep.rs`, with tasks as sleepers): a channel's reactor that has nothing to
//! poll leaves its waker at its inbox; this one arms the queue while any owner sleeps,
//! and on every event routes what came, which wakes the owners it concerns. Arm, then
//! route again: a completion that came before the arm raises no event, and that pass
//! routes it. Threads that sleep on the same queue (blocking channels with
//! [`WaitPolicy::SpinSleep`](crate::WaitPolicy)) park as followers and are woken the same
//! way.

use core::future::poll_fn;
use core::task::Poll;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;

use super::reactor::{register, Fd};
use crate::device::Context;
use crate::dispatch::SharedCompletionQueue;
use crate::error::Error;
use crate::provider::Provider;

/// A completion queue shared by async channels (one per peer of a group, say), with the
/// reactor that sleeps on its events. Prepare channels on it with
/// [`AsyncChannel::prepare_shared`](super::AsyncChannel::prepare_shared).
///
/// A handle: clones share the queue. The reactor runs while a handle is left or a channel
/// prepared on the queue while it ran is attached, then gives the lead back to sleeping
/// threads. (So the handle may go before the channels made on it.)
///
/// ```
/// # #[cfg(feature = "sim")] {
/// use zverbs::provider::sim::Sim;
/// use zverbs::tokio::{AsyncChannel, AsyncQueue};
/// use zverbs::{ChannelConfig, Context, MrPool};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let sim = Sim::with_devices(3);
/// let ctx: Vec<_> = (0..3).map(|i| Context::open(&sim, &format!("sim{i}")).unwrap()).collect();
/// let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
/// let cfg = ChannelConfig::default();
/// // One queue for both directions of rank 0's two channels (depth 64 each).
/// let q = AsyncQueue::<Sim>::create(&ctx[0], 4, 64).unwrap();
/// let mut ends = Vec::new();
/// for peer in 1..3 {
///     let a = AsyncChannel::<Sim>::prepare_shared(&ctx[0], &pd[0], &cfg, &q, &q).unwrap();
///     let b = AsyncChannel::<Sim>::prepare(&ctx[peer], &pd[peer], &cfg).unwrap();
///     let (ea, eb) = (a.endpoint(), b.endpoint());
///     ends.push((AsyncChannel::new(a.connect(&eb).unwrap()).unwrap(),
///                AsyncChannel::new(b.connect(&ea).unwrap()).unwrap()));
/// }
/// let pools: Vec<_> = pd.iter().map(|p| MrPool::new(p, 1 << 16).unwrap()).collect();
/// for (peer, (to, at)) in ends.iter().enumerate() {
///     let mut msg = pools[0].alloc(2).unwrap();
///     msg.copy_from_slice(&[peer as u8; 2]);
///     let (got, sent) = tokio::join!(at.receive(pools[peer + 1].alloc(8).unwrap()), to.send(msg));
///     assert!(sent.0.is_ok());
///     assert_eq!(got.0.unwrap().byte_len, 2);
///     assert_eq!(&got.1[..2], &[peer as u8; 2]);
/// }
/// # });
/// # }
/// ```
pub struct AsyncQueue<P: Provider> {
    handle: Arc<QueueHandle<P>>,
}

impl<P: Provider> Clone for AsyncQueue<P> {
    fn clone(&self) -> Self {
        AsyncQueue {
            handle: self.handle.clone(),
        }
    }
}

/// The handles' share of the reactor: one user while any handle is left.
struct QueueHandle<P: Provider> {
    queue: Arc<SharedCompletionQueue<P>>,
}

impl<P: Provider> Drop for QueueHandle<P> {
    fn drop(&mut self) {
        self.queue.dispatcher().sleepers().leave_reactor();
    }
}

impl<P: Provider + 'static> AsyncQueue<P> {
    /// A queue for up to `channels` channels of up to `depth` requests in flight each (as
    /// [`SharedCompletionQueue::create`] sizes it: it does not overflow), on a completion
    /// channel of its own, with its reactor spawned on the current tokio runtime.
    ///
    /// # Errors
    /// As [`SharedCompletionQueue::create_with_events`]; outside a runtime, or if the
    /// runtime's I/O driver refuses the descriptor, [`Error::InvalidAttribute`].
    pub fn create(ctx: &Context<P>, channels: usize, depth: u32) -> Result<Self, Error<P::Error>> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::InvalidAttribute(
                "an async queue is made inside a tokio runtime",
            ));
        };
        let queue = Arc::new(SharedCompletionQueue::create_with_events(
            ctx, channels, depth,
        )?);
        let Some(events) = queue.events() else {
            return Err(Error::InvalidAttribute("a queue made with events has none"));
        };
        // SAFETY: the completion channel belongs to `queue`, which keeps it open while it
        // lives; the reactor holds `queue` and drops this registration first (field order
        // of `QueueReactor`).
        let fd = unsafe { register(events.as_raw_fd()) }.map_err(|_| {
            Error::InvalidAttribute("the completion channel cannot join the tokio reactor")
        })?;
        // A fresh queue: nobody leads yet.
        if !queue.dispatcher().sleepers().lead_for_good() {
            return Err(Error::InvalidAttribute("a fresh queue is led already"));
        }
        runtime.spawn(run(QueueReactor {
            fd,
            queue: queue.clone(),
        }));
        Ok(AsyncQueue {
            handle: Arc::new(QueueHandle { queue }),
        })
    }

    /// The shared queue: its dispatcher's counts, or blocking channels on it.
    pub fn queue(&self) -> &Arc<SharedCompletionQueue<P>> {
        &self.handle.queue
    }
}

/// The reactor's state: the registration drops before the queue (fields drop in order).
struct QueueReactor<P: Provider> {
    fd: AsyncFd<Fd>,
    queue: Arc<SharedCompletionQueue<P>>,
}

/// Routes, arms while anyone sleeps, sleeps on the descriptor; until no handle and no
/// channel attached while it led is left, then gives the lead back.
async fn run<P: Provider>(reactor: QueueReactor<P>) {
    let QueueReactor { fd, queue } = &reactor;
    let (cq, sleepers) = (queue.queue(), queue.dispatcher().sleepers());
    // Whether the queue was armed and no event taken since.
    let mut armed = false;
    loop {
        // Everything the queue holds, to its inboxes: wakes the owners it concerns. A
        // failure (a dead device) is met again by the channels' own polls.
        let _ = queue.dispatcher().drain(cq);
        let go_on = poll_fn(|cx| {
            // First the waker, then the looks (`SeqCst` both sides): a sleeper or the last
            // user that comes after them finds the waker.
            sleepers.reactor_waits(cx.waker());
            if !sleepers.reactor_in_use() {
                return Poll::Ready(false);
            }
            if !armed && sleepers.anyone_asleep() {
                // A failed arm is not retried until an event (it would spin); the
                // sleepers' deadlines bound them meanwhile.
                let _ = cq.arm(false);
                armed = true;
                return Poll::Ready(true);
            }
            if let Poll::Ready(Ok(mut ready)) = fd.poll_read_ready(cx) {
                // Readiness is cleared only once the descriptor said would-block.
                let _ = ready.try_io(|_| {
                    let _ = queue.take_events();
                    Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                });
                // An event disarms the queue.
                armed = false;
                return Poll::Ready(true);
            }
            Poll::Pending
        })
        .await;
        if !go_on {
            break;
        }
    }
    // The lead goes back to sleeping threads (every sleeper is woken, to lead next).
    sleepers.resign();
}
