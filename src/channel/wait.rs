//! Waiting for completions: spin first (one pause between polls), then spin on, yield or
//! sleep ([`WaitPolicy`]), until a deadline; then, after a timeout, a bounded grace for the
//! flush.

use core::time::Duration;

/// Polls this many times one `spin_loop` hint apart before yielding between polls. A
/// completion arriving in the first microseconds of a wait is noticed within one pause;
/// after that, a thread that may be keeping the one it waits for off a core yields.
const SPIN_POLLS: u32 = 1 << 7;

/// What a waiting thread does once the first polls (128, one `spin_loop` hint apart) found
/// nothing. Every policy is bounded by the call's timeout plus the grace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitPolicy {
    /// Keep polling, a `spin_loop` hint apart: the lowest latency, one core per waiter.
    Spin,
    /// Poll, yielding the core between polls: low latency while the waiter has a core to
    /// itself, and the thread it may be waiting for gets one when cores are scarce.
    #[default]
    SpinYield,
    /// Arm the completion queue, poll once more, and sleep on its completion channel
    /// until an event (or the deadline): a thread that waits long uses almost no CPU, and
    /// wakes within a scheduler's latency of its completion. On a completion queue shared
    /// by several threads, one sleeper leads (sleeps on the channel) and the others park
    /// until a completion is routed to them ([`crate::dispatch`]).
    SpinSleep,
}

/// The bound of one call: a timeout that starts at the call's first slow pause and is
/// shared by every wait inside the call, then at most one grace added to it for the flush
/// after an abort. Without `std` there is no clock: the bound is counted in pauses (one
/// pause ≈ one microsecond is assumed), and the thread never yields.
///
/// A call that waits for many requests (a scope, a collective over many peers, a barrier)
/// threads one `Waiter` through all of its waits, so the whole call returns within
/// `timeout + grace`, never one timeout per request or per peer.
pub(crate) struct Waiter {
    round: u32,
    policy: WaitPolicy,
    timeout: Option<Duration>,
    grace: Duration,
    graced: bool,
    #[cfg(feature = "std")]
    deadline: Option<std::time::Instant>,
    #[cfg(not(feature = "std"))]
    left: Option<u128>,
}

impl Waiter {
    /// A bound of `timeout` (`None`: none) plus `grace` for the flush after an abort.
    #[inline]
    pub(crate) fn new(timeout: Option<Duration>, grace: Duration) -> Self {
        Waiter {
            round: 0,
            policy: WaitPolicy::SpinYield,
            timeout,
            grace,
            graced: false,
            #[cfg(feature = "std")]
            deadline: None,
            #[cfg(not(feature = "std"))]
            left: None,
        }
    }

    /// The same bound, waiting by `policy`.
    #[inline]
    pub(crate) fn with_policy(mut self, policy: WaitPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Whether the next pause should be a sleep on a completion channel: the policy says
    /// so and the spinning is over.
    #[inline]
    #[cfg_attr(not(all(feature = "std", unix)), allow(dead_code))]
    pub(crate) fn wants_sleep(&self) -> bool {
        self.policy == WaitPolicy::SpinSleep && self.round >= SPIN_POLLS
    }

    /// Time left before the bound passes (`None`: no bound).
    #[cfg(feature = "std")]
    pub(crate) fn remaining(&mut self) -> Option<Duration> {
        if self.expired() {
            return Some(Duration::ZERO);
        }
        let end = self.deadline?;
        Some(end.saturating_duration_since(std::time::Instant::now()))
    }

    /// The grace this waiter adds after a timeout.
    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    /// Starts a new wait within the same bound: it spins first again.
    #[inline]
    pub(crate) fn rearm(&mut self) {
        self.round = 0;
    }

    /// Pauses before the next poll; `false` once the bound has passed.
    #[inline]
    pub(crate) fn pause(&mut self) -> bool {
        #[cfg(loom)]
        if self.timeout.is_none() {
            // Under loom every pause is a yield, so the explorer can switch threads.
            loom::thread::yield_now();
            return true;
        }
        if self.round < SPIN_POLLS {
            core::hint::spin_loop();
            self.round += 1;
            return true;
        }
        self.slow_pause()
    }

    /// Whether the bound has passed (without pausing).
    pub(crate) fn expired(&mut self) -> bool {
        let Some(timeout) = self.timeout else {
            return false;
        };
        #[cfg(feature = "std")]
        {
            let now = std::time::Instant::now();
            if self.deadline.is_none() {
                // A timeout past what `Instant` can hold is no bound at all.
                let Some(end) = now.checked_add(timeout) else {
                    self.timeout = None;
                    return false;
                };
                self.deadline = Some(end);
            }
            self.deadline.is_some_and(|end| now >= end)
        }
        #[cfg(not(feature = "std"))]
        {
            let left = self.left.get_or_insert(timeout.as_micros());
            *left == 0
        }
    }

    /// Extends the bound by the grace, once per call: a timed-out call waits this much
    /// longer for the flush of the queue pair it moved to the error state. A call without
    /// a timeout gets only the grace from now.
    pub(crate) fn enter_grace(&mut self) {
        if core::mem::replace(&mut self.graced, true) {
            return;
        }
        self.round = SPIN_POLLS;
        #[cfg(feature = "std")]
        {
            let now = std::time::Instant::now();
            let end = self.deadline.map_or(now, |d| d.max(now));
            self.deadline = end.checked_add(self.grace);
            if self.deadline.is_none() {
                self.timeout = None; // a grace past what `Instant` holds: no bound
                return;
            }
        }
        #[cfg(not(feature = "std"))]
        {
            self.left = Some(self.grace.as_micros());
        }
        self.timeout.get_or_insert(self.grace);
    }

    #[cold]
    fn slow_pause(&mut self) -> bool {
        if self.timeout.is_some() && self.expired() {
            return false;
        }
        #[cfg(not(feature = "std"))]
        if let Some(left) = self.left.as_mut() {
            *left -= 1;
        }
        match self.policy {
            WaitPolicy::Spin => core::hint::spin_loop(),
            // A sleep without a completion channel to sleep on is a yield.
            _ => yield_now(),
        }
        true
    }
}

fn yield_now() {
    #[cfg(feature = "std")]
    std::thread::yield_now();
    #[cfg(not(feature = "std"))]
    core::hint::spin_loop();
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn deadline_expires_and_none_never_does() {
        let mut w = Waiter::new(Some(Duration::from_millis(20)), Duration::ZERO);
        let start = Instant::now();
        while w.pause() {}
        assert!(start.elapsed() >= Duration::from_millis(20));

        let mut forever = Waiter::new(None, Duration::ZERO);
        for _ in 0..10_000 {
            assert!(forever.pause());
        }
    }

    #[test]
    fn one_bound_for_many_waits_and_one_grace() {
        let mut w = Waiter::new(Some(Duration::from_millis(20)), Duration::from_millis(30));
        let start = Instant::now();
        for _ in 0..5 {
            w.rearm();
            while w.pause() {}
        }
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert!(
            waited < Duration::from_millis(200),
            "five waits share one bound: {waited:?}"
        );
        w.enter_grace();
        w.enter_grace(); // once per call
        while w.pause() {}
        let total = start.elapsed();
        assert!(total >= Duration::from_millis(50), "{total:?}");
        assert!(total < Duration::from_millis(400), "{total:?}");
    }

    #[test]
    fn huge_durations_mean_no_bound_not_a_panic() {
        let mut w = Waiter::new(Some(Duration::MAX), Duration::MAX);
        for _ in 0..1000 {
            assert!(w.pause());
        }
        w.enter_grace();
        assert!(w.pause());
    }

    #[test]
    fn grace_bounds_a_call_without_timeout() {
        let mut w = Waiter::new(None, Duration::from_millis(10));
        let start = Instant::now();
        w.enter_grace();
        while w.pause() {}
        assert!(start.elapsed() >= Duration::from_millis(10));
    }
}
