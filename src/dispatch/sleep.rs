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
//! Every sleep is bounded by the caller's deadline. None of this is on the data path: a
//! router pays one relaxed load per completion to look for a sleeper.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::Thread;

pub(crate) struct Sleepers {
    slots: Box<[Sleeper]>,
    leader: AtomicBool,
}

struct Sleeper {
    asleep: AtomicBool,
    thread: Mutex<Option<Thread>>,
}

impl Sleepers {
    pub(super) fn new(inboxes: usize) -> Self {
        Sleepers {
            slots: (0..inboxes)
                .map(|_| Sleeper {
                    asleep: AtomicBool::new(false),
                    thread: Mutex::new(None),
                })
                .collect(),
            leader: AtomicBool::new(false),
        }
    }

    /// The owner of inbox `i` is about to sleep, on this thread.
    pub(crate) fn register(&self, i: usize) {
        let s = &self.slots[i];
        *s.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
        s.asleep.store(true, Ordering::SeqCst);
    }

    /// The owner of inbox `i` is awake again.
    pub(crate) fn unregister(&self, i: usize) {
        self.slots[i].asleep.store(false, Ordering::SeqCst);
    }

    /// A completion was routed to inbox `i` (poll right held): wakes its owner if it sleeps.
    #[inline]
    pub(super) fn routed(&self, i: usize) {
        if self.slots[i].asleep.load(Ordering::Relaxed) {
            self.unpark(i);
        }
    }

    #[cold]
    fn unpark(&self, i: usize) {
        if let Some(t) = &*self.slots[i]
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            t.unpark();
        }
    }

    /// Takes the lead; `false` if another sleeper has it.
    pub(crate) fn try_lead(&self) -> bool {
        self.leader
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Gives up the lead and unparks every sleeper, so that one of them leads next.
    pub(crate) fn resign(&self) {
        self.leader.store(false, Ordering::SeqCst);
        for i in 0..self.slots.len() {
            if self.slots[i].asleep.load(Ordering::SeqCst) {
                self.unpark(i);
            }
        }
    }
}
