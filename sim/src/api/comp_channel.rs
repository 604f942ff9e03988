//! Completion channels (`ibv_comp_channel`): how the HCA wakes a host that sleeps.
//!
//! A CQ created on a channel ([`Context::create_cq_on`]) can be armed
//! ([`Cq::req_notify`], `ibv_req_notify_cq`). Arming is one-shot, as on hardware: the next
//! completion pushed into the CQ (armed solicited-only: the next *solicited* one, a
//! receive of a request sent with [`SendFlags::SOLICITED`](crate::SendFlags::SOLICITED) or any completion in error)
//! queues one event on the channel and disarms the CQ. Completions already in the CQ when
//! it is armed raise nothing: the consumer must arm, then poll again, then sleep.
//!
//! The channel's file descriptor ([`CompChannel`] is `AsRawFd`) is readable exactly
//! while events are queued: one byte sits in a socket pair whenever the queue is not
//! empty. It is a side output: events are raised under the world's lock, in the order of
//! the completions that raise them, and enter neither the trace nor any random choice,
//! so a seed still gives the same trace.
//!
//! Time and sleepers: in [`Mode::Stepped`] nothing happens while a thread sleeps (step
//! the fabric, then look at the descriptor). In [`Mode::Threaded`] with a timed link, a
//! clock thread runs the events that fall due (it sleeps until the next one, or until a
//! call schedules one: nothing while nothing is due), so a thread asleep on the
//! descriptor is woken as hardware would wake it; on the untimed fabric work completes
//! inside the call of the thread that makes it possible, which raises the event itself.
//!
//! ```
//! use zverbs_sim::*;
//! let f = Fabric::with_devices(1);
//! let ctx = f.open_device("sim0").unwrap();
//! let ch = ctx.create_comp_channel().unwrap();
//! let cq = ctx.create_cq_on(8, &ch).unwrap();
//! cq.req_notify(false).unwrap();
//! assert_eq!(ch.get_event(), None); // nothing completed yet
//! ```
//!
//! Every event taken ([`CompChannel::get_event`]) must be acknowledged
//! ([`Cq::ack_events`]) before the CQ is destroyed: `ibv_destroy_cq` waits for that
//! forever. The simulator counts what is missing ([`Cq::unacked_events`],
//! [`Fabric::unacked_events_destroyed`]).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;

#[cfg(loom)]
use loom::sync::Arc;
#[cfg(not(loom))]
use std::sync::Arc;

use super::{enter, Context, Cq, Fabric, Shared};
use crate::config::{LinkModel, Mode};
use crate::hca::World;
use crate::types::SimError;

/// A completion channel (`ibv_comp_channel`): a file descriptor that is readable while
/// events of armed CQs are queued: arming is one-shot ([`Cq::req_notify`]), and every
/// event taken must be acknowledged ([`Cq::ack_events`]) before its CQ is destroyed.
#[derive(Debug)]
pub struct CompChannel {
    world: Shared,
    id: usize,
    rx: UnixStream,
}

impl CompChannel {
    /// Takes the oldest event without blocking (`ibv_get_cq_event` on a non-blocking
    /// descriptor): the key of the CQ that raised it ([`Cq::key`]), or `None`.
    ///
    /// The event counts as unacknowledged on its CQ until [`Cq::ack_events`].
    pub fn get_event(&self) -> Option<u64> {
        enter(&self.world).tables.take_channel_event(self.id)
    }

    /// Events queued.
    pub fn pending(&self) -> usize {
        enter(&self.world).tables.notifier.pending(self.id)
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        enter(&self.world).tables.notifier.close(self.id);
    }
}

impl Context {
    /// Creates a completion channel (`ibv_create_comp_channel`); its descriptor is
    /// non-blocking.
    ///
    /// # Errors
    /// [`SimError::QueueFull`] if the process is out of file descriptors.
    pub fn create_comp_channel(&self) -> Result<CompChannel, SimError> {
        let full = |_| SimError::QueueFull;
        let (rx, tx) = UnixStream::pair().map_err(full)?;
        rx.set_nonblocking(true).map_err(full)?;
        tx.set_nonblocking(true).map_err(full)?;
        let inner = rx.try_clone().map_err(full)?;
        let id = enter(&self.world).tables.notifier.open(self.dev, tx, inner);
        Ok(CompChannel {
            world: self.world.clone(),
            id,
            rx,
        })
    }

    /// Creates a completion queue of `depth` entries whose events go to `channel`
    /// (`ibv_create_cq` with a channel).
    ///
    /// # Errors
    /// As [`Context::create_cq`]; [`SimError::Invalid`] for a channel of another device.
    pub fn create_cq_on(&self, depth: u32, channel: &CompChannel) -> Result<Cq, SimError> {
        let ours = Arc::ptr_eq(&channel.world, &self.world);
        {
            let w = enter(&self.world);
            let dev = w.tables.notifier.dev(channel.id);
            if !ours || dev != Some(self.dev) {
                return Err(SimError::Invalid("completion channel of another device"));
            }
        }
        let cq = self.create_cq(depth)?;
        enter(&self.world).tables.attach_channel(cq.id, channel.id);
        Ok(cq)
    }
}

impl Cq {
    /// The key this CQ's events carry (its `cq_context`): unique in the fabric.
    pub fn key(&self) -> u64 {
        enter(&self.world)
            .tables
            .cqs
            .get(self.id)
            .expect("live CQ")
            .notify
            .key
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion pushed into it, or with
    /// `solicited_only` the next solicited one (a receive of a request sent with
    /// [`SendFlags::SOLICITED`](crate::SendFlags::SOLICITED), or any completion in error),
    /// queues one event on its channel. One-shot; completions already queued raise none.
    /// A CQ without a channel may be armed; its events go nowhere.
    ///
    /// # Errors
    /// [`SimError::DeviceFatal`] once the device crashed.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        let cq = w.tables.cqs.get(self.id).expect("live CQ");
        if w.net.wire.ports[cq.dev].crashed {
            return Err(SimError::DeviceFatal);
        }
        let n = &mut w.tables.cqs.get_mut(self.id).expect("live CQ").notify;
        n.arm(solicited_only);
        Ok(())
    }

    /// Acknowledges `n` events taken for this CQ (`ibv_ack_cq_events`). Acknowledging more
    /// than were taken acknowledges those there are.
    pub fn ack_events(&self, n: u32) {
        let mut w = enter(&self.world);
        w.tables
            .cqs
            .get_mut(self.id)
            .expect("live CQ")
            .notify
            .ack(n);
    }

    /// Events taken for this CQ and not yet acknowledged (simulator only: on verbs,
    /// destroying the CQ now would wait for them forever).
    pub fn unacked_events(&self) -> u32 {
        enter(&self.world)
            .tables
            .cqs
            .get(self.id)
            .expect("live CQ")
            .notify
            .unacked()
    }
}

impl Fabric {
    /// Events taken for CQs that were destroyed before acknowledging them (simulator only:
    /// on verbs each such `ibv_destroy_cq` would have waited forever). Should stay 0.
    pub fn unacked_events_destroyed(&self) -> u64 {
        enter(&self.world).tables.notifier.destroyed_unacked
    }
}

/// Whether events can fall due between calls: threaded mode with a link, timers or
/// delays that take time.
#[cfg_attr(loom, allow(dead_code))]
fn timed(w: &World) -> bool {
    let c = &w.net.cfg;
    c.mode == Mode::Threaded
        && (c.link != LinkModel::INSTANT || !c.instant_timers || c.faults.delay > 0.0)
}

/// Starts the clock thread if events can fall due between calls (at the fabric's
/// creation: it then runs for the fabric's life).
#[cfg(not(loom))]
pub(crate) fn start_clock(world: &Shared, w: &mut World) {
    if w.tables.notifier.clock || !timed(w) {
        return;
    }
    let weak = Arc::downgrade(world);
    let spawned = std::thread::Builder::new()
        .name("zverbs-sim-clock".into())
        .spawn(move || clock(weak));
    w.tables.notifier.clock = spawned.is_ok();
}

#[cfg(loom)]
pub(crate) fn start_clock(_: &Shared, _: &mut World) {}

/// The clock thread: runs the events that fall due, as the HCA completes work while the
/// host does anything else (sleeps on a channel, or reads memory a peer writes); ends
/// when the fabric is gone.
///
/// It sleeps until the next scheduled event, or, with none, until one is scheduled: a
/// call that schedules an event earlier than its wake-up unparks it (`Events::clock`),
/// and so does the fabric's end. A parked thread costs nothing while nothing is due.
#[cfg(not(loom))]
fn clock(weak: std::sync::Weak<crate::gate::Gate<World>>) {
    use crate::sched::ClockWake;
    loop {
        let Some(world) = weak.upgrade() else {
            return;
        };
        let sleep = {
            let mut w = crate::api::lock(&world);
            w.run_due();
            let wall = w.net.sched.wall();
            let next = w.net.sched.events.next_time();
            let wake_at = next.unwrap_or(u64::MAX);
            // Kept from turn to turn (a record dropped unparks its thread).
            match &mut w.net.sched.events.clock {
                Some(c) => c.wake_at = wake_at,
                None => {
                    let thread = std::thread::current();
                    w.net.sched.events.clock = Some(ClockWake { thread, wake_at });
                }
            }
            next.map(|t| t.saturating_sub(wall))
        };
        drop(world);
        match sleep {
            Some(ns) => std::thread::park_timeout(std::time::Duration::from_nanos(ns.max(1_000))),
            None => std::thread::park(),
        }
    }
}
