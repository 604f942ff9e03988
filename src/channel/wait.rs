//! Waiting for completions: spin first (one pause between polls), then yield, until a
//! deadline.

use core::time::Duration;

/// Polls this many times one `spin_loop` hint apart before yielding between polls. A
/// completion arriving in the first few microseconds of a wait is noticed within one pause
/// (an exponential backoff instead slept up to 512 pauses, ~10 µs, on the latency path);
/// after that, a thread that may be keeping the one it waits for off a core yields. 4096
/// polls before the first yield made oversubscribed barriers (more ranks than cores) 4-10x
/// slower; 128 kept the ping-pong as fast and made every barrier faster than before.
const SPIN_POLLS: u32 = 1 << 7;

/// Backoff with an optional deadline. Without `std` there is no clock: the deadline is
/// counted in polls (one poll ≈ one microsecond is assumed), and the thread never yields.
pub(crate) struct Waiter {
    round: u32,
    timeout: Option<Duration>,
    #[cfg(feature = "std")]
    deadline: Option<std::time::Instant>,
    #[cfg(not(feature = "std"))]
    polls: u64,
}

impl Waiter {
    pub(crate) fn new(timeout: Option<Duration>) -> Self {
        Waiter {
            round: 0,
            timeout,
            #[cfg(feature = "std")]
            deadline: None,
            #[cfg(not(feature = "std"))]
            polls: 0,
        }
    }

    /// Pauses before the next poll; `false` once the deadline has passed.
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

    #[cold]
    fn slow_pause(&mut self) -> bool {
        let Some(timeout) = self.timeout else {
            yield_now();
            return true;
        };
        #[cfg(feature = "std")]
        {
            let now = std::time::Instant::now();
            let deadline = *self.deadline.get_or_insert(now + timeout);
            if now >= deadline {
                return false;
            }
        }
        #[cfg(not(feature = "std"))]
        {
            self.polls += 1;
            if u128::from(self.polls) >= timeout.as_micros() {
                return false;
            }
        }
        yield_now();
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

    #[test]
    fn deadline_expires_and_none_never_does() {
        let mut w = Waiter::new(Some(Duration::from_millis(20)));
        let start = std::time::Instant::now();
        while w.pause() {}
        assert!(start.elapsed() >= Duration::from_millis(20));

        let mut forever = Waiter::new(None);
        for _ in 0..10_000 {
            assert!(forever.pause());
        }
    }
}
