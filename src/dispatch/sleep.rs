//! Sleeping on a shared completion queue without losing a wake-up.
//!
//! One completion channel serves every channel on the queue, and an event taken by one
//! sleeper is gone for the others, so not everyone may sleep on its descriptor. A
//! leader/follower scheme instead (the one of event-driven servers):
//!
//! - A sleeper first says so (its inbox's `asleep` flag and thread handle), then routes
//!   everything pending with the poll right held (so a batch another thread is routing is
//!   finished first), and looks at its inbox: mail there means no sleep.
//! - One sleeper at a time is the *leader*: it arms the queue, routes once more (a
//!   completion that came before the arm raises no event), and sleeps on the descriptor.
//!   Any completion after the arm raises an event and wakes it. On waking it takes the
//!   events, gives up the lead and unparks every other sleeper, so that one of them leads
//!   next.
//! - The others park. Whoever routes a completion to an inbox whose owner sleeps unparks
//!   it. Ordering: the sleeper sets its flag before it takes the poll right, a router
//!   reads it after taking the poll right, and the poll right is handed over with
//!   release/acquire: a completion routed after the sleeper looked at its inbox is routed
//!   by someone who sees the flag. A follower that failed to take the lead did so while a
//!   leader held it, so that leader, when it gives the lead up (`SeqCst`), sees the
//!   follower's flag (set before, `SeqCst`) and unparks it.
//!
//! A sleeper may be a task rather than a thread (the async layer, [`crate::tokio`]): it
//! leaves a [`Waker`] instead of its thread handle, and routing wakes it the same way. The
//! lead is then held for good by the queue's reactor task, which sleeps on the descriptor
//! for everyone: it arms the queue while anyone sleeps (a new sleeper wakes it, so that it
//! arms), and on every event routes what came, which wakes the sleepers it concerns.
//! Threads sleeping on the same queue then park as followers.
//!
//! Every sleep is bounded by the caller's deadline. None of this is on the data path: a
//! router pays one relaxed load per completion to look for a sleeper.
//!
//! Model-checked with loom (`loom_sleep.rs`): sleepers that lead and follow while the
//! device completes their requests, and a router routing for them; each model fails with
//! a wake-up taken out (the resignation's, the router's) or the flag set after the drain.

use core::task::Waker;

use super::{CompletionSource, Dispatcher, Inbox};
use crate::sync::{AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering, Thread};

pub(crate) struct Sleepers {
    slots: Box<[Sleeper]>,
    leader: AtomicBool,
    /// While a reactor task holds the lead for good: its users (the queue's handles and
    /// the inboxes attached since it leads), 0 when none does. It ends when they are gone,
    /// and 0 is final: a reactor that ends is not joined again.
    reactor_users: AtomicUsize,
    /// How many inboxes' owners sleep (flags set).
    asleep: AtomicUsize,
    /// The reactor task that holds the lead for good, while it waits: woken when a sleeper
    /// comes (to arm the queue) and when its last handle goes.
    reactor: Mutex<Option<Waker>>,
}

struct Sleeper {
    asleep: AtomicBool,
    wake: Mutex<Option<Wake>>,
}

/// How a sleeping owner is woken.
pub(crate) enum Wake {
    /// A parked thread.
    Thread(Thread),
    /// A task.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    Task(Waker),
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sleepers {
    pub(super) fn new(inboxes: usize) -> Self {
        Sleepers {
            slots: (0..inboxes)
                .map(|_| Sleeper {
                    asleep: AtomicBool::new(false),
                    wake: Mutex::new(None),
                })
                .collect(),
            leader: AtomicBool::new(false),
            reactor_users: AtomicUsize::new(0),
            asleep: AtomicUsize::new(0),
            reactor: Mutex::new(None),
        }
    }

    /// The owner of inbox `i` is about to sleep, to be woken by `wake`. Then it routes what
    /// the queue holds (poll right held) and looks at its inbox once more before it sleeps.
    pub(crate) fn register(&self, i: usize, wake: Wake) {
        // A dispatcher made without sleepers serves a queue nobody sleeps on.
        let Some(s) = self.slots.get(i) else {
            return;
        };
        *locked(&s.wake) = Some(wake);
        if !s.asleep.swap(true, Ordering::SeqCst) {
            self.asleep.fetch_add(1, Ordering::SeqCst);
        }
        // A reactor that leads arms the queue only while someone sleeps: it looks again.
        self.wake_reactor();
    }

    /// The owner of inbox `i` is awake again.
    pub(crate) fn unregister(&self, i: usize) {
        if self
            .slots
            .get(i)
            .is_some_and(|s| s.asleep.swap(false, Ordering::SeqCst))
        {
            self.asleep.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// One more user of the leading reactor (an inbox attached); `false` if no reactor
    /// leads (or it is ending: its users never come back from 0).
    pub(crate) fn join_reactor(&self) -> bool {
        self.reactor_users
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0).then_some(n + 1)
            })
            .is_ok()
    }

    /// A user of the leading reactor is gone; the last one wakes it, to end.
    pub(crate) fn leave_reactor(&self) {
        if self.reactor_users.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake_reactor();
        }
    }

    /// Wakes the leading reactor, if one waits.
    pub(crate) fn wake_reactor(&self) {
        if let Some(w) = locked(&self.reactor).take() {
            w.wake();
        }
    }

    /// A completion was routed to inbox `i` (poll right held): wakes its owner if it sleeps.
    #[inline]
    pub(super) fn routed(&self, i: usize) {
        if self
            .slots
            .get(i)
            .is_some_and(|s| s.asleep.load(Ordering::Relaxed))
        {
            self.unpark(i);
        }
    }

    #[cold]
    fn unpark(&self, i: usize) {
        match &*locked(&self.slots[i].wake) {
            Some(Wake::Thread(t)) => t.unpark(),
            Some(Wake::Task(w)) => w.wake_by_ref(),
            None => {}
        }
    }

    /// Takes the lead; `false` if another sleeper has it.
    pub(crate) fn try_lead(&self) -> bool {
        self.leader
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Gives up the lead (also a reactor's, when it ends) and wakes every sleeper, so that
    /// one of them leads next.
    pub(crate) fn resign(&self) {
        self.leader.store(false, Ordering::SeqCst);
        for i in 0..self.slots.len() {
            if self.slots[i].asleep.load(Ordering::SeqCst) {
                self.unpark(i);
            }
        }
    }
}

impl Dispatcher {
    /// A thread's sleep on `inbox` (`me`), the scheme above: it says it sleeps, routes what
    /// `cq` holds, and returns at once if mail waits for it; else it parks (`park`, bounded
    /// by the caller) while another sleeper leads, or it leads (`lead`: arm the queue,
    /// route once more, sleep on its descriptor) and then resigns, waking the others.
    /// Whatever woke it, the caller polls after.
    pub(crate) fn sleep_on<C: CompletionSource + ?Sized, E: From<C::Error>>(
        &self,
        cq: &C,
        inbox: &Inbox,
        me: Thread,
        park: impl FnOnce(),
        lead: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let sleepers = &self.sleepers;
        let i = inbox.index() as usize;
        sleepers.register(i, Wake::Thread(me));
        let r = (|| {
            self.drain(cq)?;
            if self.has_mail(inbox) {
                return Ok(());
            }
            if !sleepers.try_lead() {
                park();
                return Ok(());
            }
            let r = lead();
            sleepers.resign();
            r
        })();
        sleepers.unregister(i);
        r
    }
}

/// What only a reactor task that leads for good uses.
#[cfg(feature = "tokio")]
impl Sleepers {
    /// Whether any owner sleeps (a leading reactor keeps the queue armed while one does).
    pub(crate) fn anyone_asleep(&self) -> bool {
        self.asleep.load(Ordering::SeqCst) > 0
    }

    /// Takes the lead for good, for a reactor task, with one user (the queue's handle);
    /// `false` if someone else leads (a thread leads for one sleep at most).
    pub(crate) fn lead_for_good(&self) -> bool {
        if !self.try_lead() {
            return false;
        }
        self.reactor_users.store(1, Ordering::SeqCst);
        true
    }

    /// Whether the leading reactor has users left (else it ends).
    pub(crate) fn reactor_in_use(&self) -> bool {
        self.reactor_users.load(Ordering::SeqCst) > 0
    }

    /// The leading reactor waits: `waker` is woken by the next sleeper (or by
    /// [`wake_reactor`](Self::wake_reactor)). Set before the reactor looks at
    /// [`anyone_asleep`](Self::anyone_asleep) (`SeqCst` both ways): a sleeper that comes
    /// after that look finds the waker.
    pub(crate) fn reactor_waits(&self, waker: &Waker) {
        let mut r = locked(&self.reactor);
        if !r.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *r = Some(waker.clone());
        }
    }
}
