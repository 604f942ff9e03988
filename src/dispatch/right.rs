//! The poll right: who may poll the shared queue and route, one thread at a time.
//!
//! A compare-and-swap per turn is the plain way, and it is what contended dispatchers use.
//! But a locked instruction per wait is about 7 % of a simulated ping-pong (measured: the
//! same build with the compare-and-swap replaced by plain loads and stores goes from 1.08×
//! to 1.03× the per-channel layout), and most shared queues are driven by one thread (a
//! `MultiChannel`, a `Node`). So the right is **biased** to a thread that took
//! [`REBIAS_AFTER`] turns in a row, as JVM monitors were: that thread's turns take no
//! locked instruction, and the first turn another thread asks for revokes the bias, with
//! an asymmetric fence (one `membarrier`, a few microseconds). Threads that take turns by
//! phases so pay at most one revocation per [`REBIAS_AFTER`] turns; threads that interleave
//! their turns never bias it.
//!
//! The protocol (`bias` is a thread token, [`UNBIASED`] or [`NEVER`]):
//!
//! Every thread that takes a turn has a `'static` turn counter of its own (`turns`, from a
//! static pool), written only by that thread; its address is the thread's token.
//!
//! - A **biased turn** (bias is the caller's token): raise the caller's `turns`, a
//!   compiler-only fence, load `bias` again; still ours → the turn runs, and ends with a
//!   release store lowering `turns`. Revoked meanwhile → lower `turns` and take the word
//!   instead.
//! - An **exclusive turn**: compare-and-swap `word` 0 → 1; then look at `bias`: another
//!   thread's → revoke it; unbiased → count the turn in the caller's streak, and at
//!   [`REBIAS_AFTER`] bias it to the caller (only a holder of `word` sets the bias or the
//!   streak, so two threads never both do). Ends with a release store of `word = 0`.
//! - **Revoking**: swap `bias` to [`UNBIASED`], then `membarrier(PRIVATE_EXPEDITED)`, which
//!   runs a full fence on every thread of the process that is running (and a thread that
//!   is not passes one when it is scheduled), then read the biased thread's `turns`. The
//!   biased thread either loaded `bias` after its fence point (it sees the revocation and
//!   does not start a turn) or before it, in which case its earlier raise of `turns` is
//!   visible now. Zero: the exclusive turn runs. Not zero: a biased turn is under way, so
//!   this is no turn (the right is busy, as a failed compare-and-swap says); the owner is
//!   written down (`revoked`) and every exclusive turn after it first reads that counter
//!   again, until zero. No turn ever waits for another thread, and a biased turn and an
//!   exclusive turn never overlap. (While `revoked` is set, nobody biases the right: the
//!   old owner, seeing no bias, starts no biased turn.) (A counter per thread, not one flag per right: a
//!   thread that was preempted between its two loads of `bias` writes only its own
//!   counter when it resumes, never the flag of the thread biased since.)
//!
//! Where `membarrier` is missing (not Linux, an old kernel, a seccomp filter, valgrind) the
//! right is never biased. Under loom the two fences are replaced by read-modify-writes on
//! `turns` and `bias`, which order the same accesses, so the model checks the protocol
//! (not the kernel's fence).

use crate::sync::{AtomicUsize, Ordering};

/// `bias` while every turn is exclusive.
const UNBIASED: usize = 0;
/// `bias` where `membarrier` is missing: never biased.
const NEVER: usize = usize::MAX;
/// Exclusive turns in a row by one thread that bias the right to it. Under loom one, so
/// the models' few turns bias, revoke and bias again.
#[cfg(not(loom))]
pub(super) const REBIAS_AFTER: usize = 256;
#[cfg(loom)]
pub(super) const REBIAS_AFTER: usize = 1;

/// The poll right of one dispatcher.
pub(super) struct PollRight {
    word: AtomicUsize,
    /// The biased thread's token (the address of its `turns`), [`UNBIASED`] or [`NEVER`].
    bias: AtomicUsize,
    /// The thread of the last exclusive turn and how many it took in a row; only with
    /// `word` held.
    streak_of: AtomicUsize,
    streak: AtomicUsize,
    /// A thread whose bias was revoked while it was inside a biased turn: no exclusive turn
    /// starts until that turn has ended. Only with `word` held.
    revoked: AtomicUsize,
}

/// One turn; ends when dropped, with one release store and no test of which turn it was:
/// a biased turn gives the caller's turn counter its value from before the turn back
/// (`fence::leave`), an exclusive turn gives the right's `word` its 0 back.
#[must_use]
pub(super) struct Turn<'a> {
    /// The caller's turn counter (biased), or the right's `word` (exclusive).
    ends: &'a AtomicUsize,
    /// What the end stores there.
    restore: usize,
    /// Under loom a biased turn ends with `fence::leave`'s read-modify-write.
    #[cfg(loom)]
    biased: bool,
}

impl Drop for Turn<'_> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(loom)]
        if self.biased {
            fence::leave(self.ends, self.restore);
            return;
        }
        self.ends.store(self.restore, Ordering::Release);
    }
}

impl PollRight {
    pub(super) fn new() -> Self {
        PollRight {
            word: AtomicUsize::new(0),
            bias: AtomicUsize::new(if fence::available() { UNBIASED } else { NEVER }),
            streak_of: AtomicUsize::new(0),
            streak: AtomicUsize::new(0),
            revoked: AtomicUsize::new(UNBIASED),
        }
    }

    /// A turn if nobody else has one. Never waits: revoking another thread's bias costs one
    /// `membarrier`, and if that thread is inside a turn, the answer is `None` (it is
    /// polling) until its turn ends.
    #[inline(always)]
    pub(super) fn try_turn(&self) -> Option<Turn<'_>> {
        match self.try_biased_turn() {
            Ok(turn) => Some(turn),
            Err(me) => self.exclusive_turn(me),
        }
    }

    /// A biased turn, if the right is biased to the calling thread: then no other thread
    /// has taken a turn since it was biased (the first one revokes the bias). Otherwise the
    /// caller's token, for [`exclusive_turn`](Self::exclusive_turn).
    #[inline(always)]
    pub(super) fn try_biased_turn(&self) -> Result<Turn<'_>, usize> {
        let Some(turns) = this_thread() else {
            return Err(UNBIASED);
        };
        let me = token(turns);
        if self.bias.load(Ordering::Relaxed) == me {
            if let Some(turn) = self.biased_turn(turns, me) {
                return Ok(turn);
            }
        }
        Err(me)
    }

    /// A turn, waiting for it.
    pub(super) fn turn(&self) -> Turn<'_> {
        loop {
            if let Some(turn) = self.try_turn() {
                return turn;
            }
            crate::sync::spin();
        }
    }

    /// Whether the right is biased to a thread.
    #[cfg_attr(loom, allow(dead_code))]
    pub(super) fn is_biased(&self) -> bool {
        !matches!(self.bias.load(Ordering::Relaxed), UNBIASED | NEVER)
    }

    #[inline(always)]
    fn biased_turn(&self, turns: &'static AtomicUsize, me: usize) -> Option<Turn<'_>> {
        let depth = fence::enter(turns);
        if fence::load_bias(&self.bias) == me {
            return Some(Turn {
                ends: turns,
                restore: depth,
                #[cfg(loom)]
                biased: true,
            });
        }
        fence::leave(turns, depth);
        None
    }

    /// A turn taken with a compare-and-swap, for the thread with token `me`
    /// ([`try_biased_turn`](Self::try_biased_turn)'s error).
    #[inline(never)]
    pub(super) fn exclusive_turn(&self, me: usize) -> Option<Turn<'_>> {
        self.word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        // Dropped on every `None` below: gives `word` back.
        let turn = Turn {
            ends: &self.word,
            restore: 0,
            #[cfg(loom)]
            biased: false,
        };
        let revoked = self.revoked.load(Ordering::Relaxed);
        if revoked != UNBIASED {
            if in_turn(revoked) {
                return None;
            }
            self.revoked.store(UNBIASED, Ordering::Relaxed);
        }
        match self.bias.load(Ordering::Acquire) {
            NEVER => {}
            // A thread without a counter (`me` unbiased) never takes the bias.
            UNBIASED if me != UNBIASED => self.count_streak(me),
            UNBIASED => {}
            b if b == me => {}
            b => {
                if !self.revoke(b) {
                    return None;
                }
            }
        }
        Some(turn)
    }

    /// Counts an exclusive turn of `me` (with `word` held); biases the right to `me` at
    /// [`REBIAS_AFTER`] in a row.
    #[inline]
    fn count_streak(&self, me: usize) {
        let n = if self.streak_of.load(Ordering::Relaxed) == me {
            self.streak.load(Ordering::Relaxed) + 1
        } else {
            self.streak_of.store(me, Ordering::Relaxed);
            1
        };
        if n >= REBIAS_AFTER {
            self.streak.store(0, Ordering::Relaxed);
            self.bias.store(me, Ordering::Release);
        } else {
            self.streak.store(n, Ordering::Relaxed);
        }
    }

    /// Ends the bias to the thread with token `owner` (with `word` held). `true` if that
    /// thread is in no biased turn (and can start none); `false` if a turn of its is under
    /// way: its end is awaited by the next exclusive turn (`revoked`), so no call waits.
    #[cold]
    #[inline(never)]
    fn revoke(&self, owner: usize) -> bool {
        self.streak.store(0, Ordering::Relaxed);
        fence::revoke(&self.bias, UNBIASED);
        if in_turn(owner) {
            self.revoked.store(owner, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// Whether the thread with token `owner` is inside a biased turn: after the revocation's
/// fence, its counter says so (release store at a turn's end, acquire here).
fn in_turn(owner: usize) -> bool {
    // SAFETY: a token is the address of a turn counter that lives for the rest of the
    // process (`this_thread`: a static, or leaked under loom).
    let turns = unsafe { &*(owner as *const AtomicUsize) };
    fence::load_turns(turns) != 0
}

/// Threads that can hold a bias: each gets a turn counter from this pool on its first turn,
/// for the rest of the process (a counter must outlive its thread: a revoker may still read
/// it). Later threads get no counter, and their turns are all exclusive. 128 KiB of zeroed
/// static memory, touched only as threads claim counters.
#[cfg(not(loom))]
const THREADS: usize = 1024;

/// A turn counter alone on its cache-line pair (it is written at every biased turn).
#[cfg(not(loom))]
#[repr(align(128))]
struct Counter(AtomicUsize);

/// Whether rights can be biased in this process (`membarrier` works).
#[cfg(all(test, not(loom)))]
pub(super) fn biasing_available() -> bool {
    fence::available()
}

/// The calling thread's turn counter, `None` once the pool is used up. Allocation-free, so
/// a thread's first turn may be on the data path.
#[inline(always)]
fn this_thread() -> Option<&'static AtomicUsize> {
    use core::cell::Cell;
    #[cfg(not(loom))]
    {
        static POOL: [Counter; THREADS] = [const { Counter(AtomicUsize::new(0)) }; THREADS];
        static CLAIMED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        // The counter alone (one word, so the usual turn makes one test); whether the
        // thread asked the pool already is kept apart, looked at only without a counter.
        std::thread_local!(static TURNS: Cell<Option<&'static AtomicUsize>> = const { Cell::new(None) });
        std::thread_local!(static ASKED: Cell<bool> = const { Cell::new(false) });
        #[cold]
        #[inline(never)]
        fn claim(t: &Cell<Option<&'static AtomicUsize>>) -> Option<&'static AtomicUsize> {
            if ASKED.with(|asked| asked.replace(true)) {
                return None; // the pool was used up when this thread asked
            }
            let i = CLAIMED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let turns = POOL.get(i).map(|c| &c.0);
            t.set(turns);
            turns
        }
        TURNS.with(|t| t.get().or_else(|| claim(t)))
    }
    #[cfg(loom)]
    {
        // Under loom a counter is leaked per model thread (allocation is not measured).
        loom::thread_local!(static TURNS: Cell<Option<&'static AtomicUsize>> = Cell::new(None));
        TURNS.with(|t| {
            Some(t.get().unwrap_or_else(|| {
                let turns = &*std::boxed::Box::leak(std::boxed::Box::new(AtomicUsize::new(0)));
                t.set(Some(turns));
                turns
            }))
        })
    }
}

#[inline]
fn token(turns: &'static AtomicUsize) -> usize {
    turns as *const AtomicUsize as usize
}

/// The two sides of the asymmetric fence.
#[cfg(not(loom))]
mod fence {
    use super::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// Whether `membarrier(PRIVATE_EXPEDITED)` works here (registered once per process).
    pub(super) fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(register)
    }

    #[cfg(target_os = "linux")]
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;

    #[cfg(target_os = "linux")]
    fn register() -> bool {
        const QUERY: libc::c_long = 0;
        const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
        // SAFETY: membarrier takes integers and touches no memory of ours.
        let supported = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0, 0) };
        // SAFETY: the register command, too, takes integers and touches no memory of ours.
        supported > 0
            && supported & PRIVATE_EXPEDITED != 0
            && unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0) } == 0
    }

    #[cfg(not(target_os = "linux"))]
    fn register() -> bool {
        false
    }

    /// The light side, entering a biased turn: raises `turns` (only its thread writes it),
    /// ordered before the next load by the heavy side's `membarrier`, so a compiler fence
    /// is enough here. Returns the value before.
    #[inline(always)]
    pub(super) fn enter(turns: &AtomicUsize) -> usize {
        let depth = turns.load(Ordering::Relaxed);
        turns.store(depth + 1, Ordering::Relaxed);
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
        depth
    }

    /// Leaving a biased turn (or an attempt at one): `turns` back to `depth`, released.
    #[inline(always)]
    pub(super) fn leave(turns: &AtomicUsize, depth: usize) {
        turns.store(depth, Ordering::Release);
    }

    #[inline(always)]
    pub(super) fn load_bias(bias: &AtomicUsize) -> usize {
        bias.load(Ordering::Acquire)
    }

    /// The heavy side: publish the revocation, then a fence on every thread.
    pub(super) fn revoke(bias: &AtomicUsize, unbiased: usize) {
        bias.swap(unbiased, Ordering::SeqCst);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: as in `register`. It cannot fail once registered, and only a biased
            // right (which `available` allowed) is ever revoked.
            let r = unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0) };
            debug_assert_eq!(r, 0, "membarrier failed after it registered");
        }
    }

    #[inline]
    pub(super) fn load_turns(turns: &AtomicUsize) -> usize {
        turns.load(Ordering::Acquire)
    }
}

/// Under loom: read-modify-writes, which always see the latest value, stand in for the
/// fences (the model checks the protocol, not `membarrier`).
#[cfg(loom)]
mod fence {
    use super::{AtomicUsize, Ordering};

    pub(super) fn available() -> bool {
        true
    }

    pub(super) fn enter(turns: &AtomicUsize) -> usize {
        turns.fetch_add(1, Ordering::AcqRel)
    }

    pub(super) fn leave(turns: &AtomicUsize, depth: usize) {
        turns.swap(depth, Ordering::AcqRel);
    }

    pub(super) fn load_bias(bias: &AtomicUsize) -> usize {
        bias.fetch_add(0, Ordering::AcqRel)
    }

    pub(super) fn revoke(bias: &AtomicUsize, unbiased: usize) {
        bias.swap(unbiased, Ordering::AcqRel);
    }

    pub(super) fn load_turns(turns: &AtomicUsize) -> usize {
        turns.fetch_add(0, Ordering::AcqRel)
    }
}
