//! The engine's clock: nanoseconds since it started, read once per busy pass.
//!
//! `Instant::now` (the vDSO's `clock_gettime`) is a noticeable part of a simulated RPC
//! round trip (BENCHMARKS.md), and an RPC reads the clock three times. On x86_64 with an
//! invariant TSC (CPUID leaf 0x8000_0007, EDX bit 8: constant rate, ticking in every
//! C-state) the clock is the TSC instead, scaled by a rate measured against `Instant` over
//! 2 ms when the engine starts; elsewhere it is `Instant`. Its readings serve timers of
//! milliseconds (retransmission, session timeouts): an error of parts per million in the
//! measured rate is immaterial.

use std::time::{Duration, Instant};

/// Nanoseconds since [`Clock::new`].
pub(super) struct Clock {
    start: Instant,
    /// The TSC at `start` and nanoseconds per 2^32 ticks, where the TSC serves.
    tsc: Option<(u64, u64)>,
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock {
            start: Instant::now(),
            tsc: None,
        }
        .calibrated()
    }

    pub(super) fn now(&self) -> u64 {
        match self.tsc {
            Some((t0, scale)) => {
                let ticks = u128::from(tsc().wrapping_sub(t0));
                u64::try_from((ticks * u128::from(scale)) >> 32).unwrap_or(u64::MAX)
            }
            None => u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn calibrated(mut self) -> Clock {
        if !invariant_tsc() {
            return self;
        }
        let (i0, t0) = (Instant::now(), tsc());
        while i0.elapsed() < Duration::from_millis(2) {
            core::hint::spin_loop();
        }
        let (ns, t1) = (i0.elapsed().as_nanos(), tsc());
        let ticks = u128::from(t1.wrapping_sub(t0));
        if ticks == 0 {
            return self;
        }
        let scale = u64::try_from((ns << 32) / ticks).unwrap_or(0);
        if scale > 0 {
            // Zero is now, for both readings.
            (self.start, self.tsc) = (Instant::now(), Some((tsc(), scale)));
        }
        self
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn calibrated(self) -> Clock {
        let _ = Duration::ZERO;
        self
    }
}

#[cfg(target_arch = "x86_64")]
fn tsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86_64 (user mode may read it unless the
    // kernel forbids it, which Linux does not by default).
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(dead_code)]
fn tsc() -> u64 {
    0
}

/// Whether CPUID reports an invariant TSC.
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use core::arch::x86_64::__cpuid;
    // SAFETY: CPUID exists on every x86_64 processor; leaf 0x8000_0000 gives the highest
    // extended leaf, so 0x8000_0007 is asked only where it exists.
    #[allow(unused_unsafe)]
    unsafe {
        __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock follows `Instant` to within a fraction of a millisecond over 20 ms.
    #[test]
    fn follows_instant() {
        let c = Clock::new();
        let (i0, c0) = (Instant::now(), c.now());
        std::thread::sleep(Duration::from_millis(20));
        let (di, dc) = (i0.elapsed().as_nanos() as i128, i128::from(c.now() - c0));
        assert!((di - dc).abs() < 500_000, "instant {di} ns, clock {dc} ns");
        assert!(c.now() >= c0);
    }
}
