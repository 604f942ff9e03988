//! The pool's allocator: a binary buddy allocator over a slab of `64 << top` bytes, in units
//! of 64-byte blocks, with every piece of metadata in side arrays allocated at set-up.
//!
//! Block `i` of order `k` covers units `i .. i + 2^k` and is aligned to `2^k` units; its
//! buddy is `i ^ 2^k`. Invariants (checked by `check` in the tests):
//!
//! - The live and free blocks partition the slab; `tag[i]` is right for every block head
//!   `i` (the order, plus [`FREE`] for a free block); entries of other units are stale.
//! - A free block of order `k` is on list `k` (doubly linked through `next`/`prev`), and
//!   bit `k` of `nonempty` is set exactly when that list is non-empty.
//! - No free block has a free buddy of the same order: frees coalesce eagerly, so after
//!   every block is freed the slab is one free block again.
//!
//! The buddy of a block being freed is always a block head: a block that covers it and is
//! larger would cover the freed block too. So `tag` at the buddy's index is never stale.

/// log2 of the smallest block, in bytes.
pub(crate) const MIN_SHIFT: u32 = 6;
/// The smallest block, in bytes.
pub(crate) const MIN_BLOCK: usize = 1 << MIN_SHIFT;
/// The largest slab order: `2^31` blocks of 64 bytes (128 GiB), so that a unit index fits
/// a `u32` with [`NIL`] to spare.
pub(crate) const MAX_ORDER: u8 = 31;

const NIL: u32 = u32::MAX;
/// `tag` bit of a free block head; the low bits hold the order.
const FREE: u8 = 0x80;

/// Why a slab size cannot be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SetupError {
    /// A capacity of zero bytes.
    Zero,
    /// More than `64 << MAX_ORDER` bytes, or more than the address space holds.
    TooLarge,
    /// The side arrays could not be allocated.
    OutOfMemory,
}

/// The order of the smallest block that holds `len` bytes (`len >= 1`), if any does.
/// Total: every `usize` gives an answer, none wraps.
pub(crate) fn order_for(len: usize) -> Option<u8> {
    let units = len.div_ceil(MIN_BLOCK).max(1).checked_next_power_of_two()?;
    let order = units.trailing_zeros();
    (order <= u32::from(MAX_ORDER)).then_some(order as u8)
}

/// Bytes in a block of `order`, if the address space holds it.
pub(crate) fn block_bytes(order: u8) -> Option<usize> {
    1usize.checked_shl(u32::from(order) + MIN_SHIFT)
}

/// The allocator state; see the module docs. Plain data, no provider, no lock.
pub(crate) struct Buddy {
    /// The slab is one block of this order.
    top: u8,
    /// Bit `k`: the free list of order `k` is non-empty.
    nonempty: u32,
    /// Head of each order's free list, or [`NIL`].
    heads: [u32; MAX_ORDER as usize + 1],
    next: Vec<u32>,
    prev: Vec<u32>,
    tag: Vec<u8>,
    /// Free units.
    free: usize,
    /// Blocks handed out and not yet freed.
    live: usize,
}

impl core::fmt::Debug for Buddy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Buddy")
            .field("top", &self.top)
            .field("free_units", &self.free)
            .field("live", &self.live)
            .field("nonempty", &format_args!("{:#b}", self.nonempty))
            .finish()
    }
}

fn filled<T: Copy>(n: usize, v: T) -> Result<Vec<T>, SetupError> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| SetupError::OutOfMemory)?;
    out.resize(n, v);
    Ok(out)
}

impl Buddy {
    /// An allocator over a slab of at least `capacity` bytes (rounded up to `64 << k`),
    /// all of it free. Its side arrays take 9 bytes per 64-byte unit.
    pub(crate) fn new(capacity: usize) -> Result<Self, SetupError> {
        if capacity == 0 {
            return Err(SetupError::Zero);
        }
        let top = order_for(capacity).ok_or(SetupError::TooLarge)?;
        block_bytes(top).ok_or(SetupError::TooLarge)?;
        let units = 1usize << top;
        let mut b = Buddy {
            top,
            nonempty: 0,
            heads: [NIL; MAX_ORDER as usize + 1],
            next: filled(units, NIL)?,
            prev: filled(units, NIL)?,
            tag: filled(units, 0u8)?,
            free: 0,
            live: 0,
        };
        b.push(0, top);
        b.free = units;
        Ok(b)
    }

    /// The slab's order: it is `64 << top()` bytes.
    pub(crate) fn top(&self) -> u8 {
        self.top
    }

    /// Free units.
    pub(crate) fn free_units(&self) -> usize {
        self.free
    }

    /// Blocks handed out and not yet freed.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The order of the largest free block, if any block is free.
    pub(crate) fn largest_free(&self) -> Option<u8> {
        (self.nonempty != 0).then(|| (31 - self.nonempty.leading_zeros()) as u8)
    }

    /// Takes a block of `order`: its first unit. `None` exactly when no free block has that
    /// order or a larger one.
    pub(crate) fn alloc(&mut self, order: u8) -> Option<u32> {
        // Orders past `top` have no list; shifting by 32 or more would be an overflow.
        let mask = self.nonempty.checked_shr(u32::from(order))? << order;
        if mask == 0 {
            return None;
        }
        let mut k = mask.trailing_zeros() as u8;
        let i = self.heads[usize::from(k)];
        self.unlink(i, k);
        // Split: keep the lower half, free the upper one, down to the order asked for.
        while k > order {
            k -= 1;
            self.push(i + (1 << k), k);
        }
        self.tag[i as usize] = order;
        self.free -= 1 << order;
        self.live += 1;
        Some(i)
    }

    /// Gives back block `i` of `order`, coalescing it with free buddies.
    ///
    /// `i` and `order` must be a block returned by [`alloc`](Self::alloc) and not freed
    /// since (the pool's buffers own their blocks, so this holds by construction); checked
    /// in debug builds.
    pub(crate) fn free(&mut self, mut i: u32, order: u8) {
        debug_assert_eq!(self.tag.get(i as usize), Some(&order), "not a live block");
        self.free += 1 << order;
        self.live -= 1;
        let mut k = order;
        while k < self.top {
            let buddy = i ^ (1 << k);
            if self.tag[buddy as usize] != FREE | k {
                break;
            }
            self.unlink(buddy, k);
            // The upper half is no block head any more.
            self.tag[(i | buddy) as usize] = 0;
            i &= buddy;
            k += 1;
        }
        self.push(i, k);
    }

    /// Puts free block `i` of order `k` at the head of list `k`.
    fn push(&mut self, i: u32, k: u8) {
        let head = self.heads[usize::from(k)];
        self.next[i as usize] = head;
        self.prev[i as usize] = NIL;
        if head != NIL {
            self.prev[head as usize] = i;
        }
        self.heads[usize::from(k)] = i;
        self.nonempty |= 1 << k;
        self.tag[i as usize] = FREE | k;
    }

    /// Takes free block `i` of order `k` off list `k`.
    fn unlink(&mut self, i: u32, k: u8) {
        let (next, prev) = (self.next[i as usize], self.prev[i as usize]);
        if prev == NIL {
            self.heads[usize::from(k)] = next;
            if next == NIL {
                self.nonempty &= !(1 << k);
            }
        } else {
            self.next[prev as usize] = next;
        }
        if next != NIL {
            self.prev[next as usize] = prev;
        }
        self.tag[i as usize] = k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the partition and the free lists and checks every invariant of the module
    /// docs; returns the blocks as `(unit, order, free)`.
    fn check(b: &Buddy) -> Vec<(u32, u8, bool)> {
        let units = 1usize << b.top;
        let mut blocks = Vec::new();
        let (mut u, mut free, mut live) = (0usize, 0usize, 0usize);
        while u < units {
            let t = b.tag[u];
            let (k, is_free) = (t & !FREE, t & FREE != 0);
            assert!(k <= b.top && u % (1 << k) == 0, "bad head {u}: tag {t:#x}");
            if is_free {
                free += 1 << k;
            } else {
                live += 1;
            }
            blocks.push((u as u32, k, is_free));
            u += 1 << k;
        }
        assert_eq!(u, units);
        assert_eq!((free, live), (b.free, b.live));
        for k in 0..=b.top {
            let mut n = 0;
            let (mut i, mut prev) = (b.heads[usize::from(k)], NIL);
            while i != NIL {
                assert_eq!(b.tag[i as usize], FREE | k);
                assert_eq!(b.prev[i as usize], prev);
                n += 1;
                (prev, i) = (i, b.next[i as usize]);
            }
            let listed = blocks.iter().filter(|&&(_, o, f)| f && o == k).count();
            assert_eq!(n, listed, "list {k}");
            assert_eq!(b.nonempty & (1 << k) != 0, n > 0);
        }
        for &(u, k, f) in &blocks {
            if f && k < b.top {
                let buddy = u ^ (1 << k);
                assert!(
                    !blocks.contains(&(buddy, k, true)),
                    "free buddies {u} and {buddy} of order {k} not coalesced"
                );
            }
        }
        blocks
    }

    #[test]
    fn order_for_is_total() {
        assert_eq!(order_for(1), Some(0));
        assert_eq!(order_for(64), Some(0));
        assert_eq!(order_for(65), Some(1));
        assert_eq!(order_for(4096), Some(6));
        assert_eq!(order_for(4097), Some(7));
        assert_eq!(order_for(64 << 31), Some(31));
        assert_eq!(order_for((64 << 31) + 1), None);
        assert_eq!(order_for(usize::MAX), None);
        assert_eq!(order_for(usize::MAX / 2 + 2), None);
    }

    #[test]
    fn setup_rounds_up_and_rejects_absurd_sizes() {
        assert_eq!(Buddy::new(0).unwrap_err(), SetupError::Zero);
        assert_eq!(Buddy::new(usize::MAX).unwrap_err(), SetupError::TooLarge);
        assert_eq!(
            Buddy::new((64 << 31) + 1).unwrap_err(),
            SetupError::TooLarge
        );
        let b = Buddy::new(1000).unwrap();
        assert_eq!(
            (b.top(), b.free_units(), b.largest_free()),
            (4, 16, Some(4))
        );
        check(&b);
    }

    #[test]
    fn splits_and_coalesces() {
        let mut b = Buddy::new(64 * 16).unwrap();
        let a = b.alloc(0).unwrap();
        assert_eq!(a, 0);
        // 16 = 1 (live) + 1 + 2 + 4 + 8 (free).
        assert_eq!(
            check(&b),
            [
                (0, 0, false),
                (1, 0, true),
                (2, 1, true),
                (4, 2, true),
                (8, 3, true)
            ]
        );
        let c = b.alloc(3).unwrap();
        assert_eq!(c, 8);
        assert_eq!(b.largest_free(), Some(2));
        assert_eq!(b.alloc(3), None);
        b.free(a, 0);
        // Unit 0 merges with 1, then 0..2 with 2..4, then 0..4 with 4..8.
        assert_eq!(check(&b), [(0, 3, true), (8, 3, false)]);
        b.free(c, 3);
        assert_eq!(check(&b), [(0, 4, true)]);
        assert_eq!((b.free_units(), b.live()), (16, 0));
    }

    #[test]
    fn fills_with_smallest_blocks_and_empties() {
        let mut b = Buddy::new(64 * 64).unwrap();
        let mut got: Vec<u32> = (0..64).map(|_| b.alloc(0).unwrap()).collect();
        assert_eq!(b.alloc(0), None);
        assert_eq!(b.largest_free(), None);
        got.sort_unstable();
        assert_eq!(got, (0..64).collect::<Vec<_>>());
        // Free the odd ones, then the even ones: nothing coalesces until the second pass.
        for &i in got.iter().filter(|&&i| i % 2 == 1) {
            b.free(i, 0);
        }
        assert_eq!(b.largest_free(), Some(0));
        check(&b);
        for &i in got.iter().filter(|&&i| i % 2 == 0) {
            b.free(i, 0);
        }
        assert_eq!(check(&b), [(0, 6, true)]);
    }

    #[test]
    fn orders_past_the_slab_fail() {
        let mut b = Buddy::new(64).unwrap();
        assert_eq!(b.alloc(1), None);
        assert_eq!(b.alloc(31), None);
        assert_eq!(b.alloc(40), None);
        assert_eq!(b.alloc(0), Some(0));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Alloc(u8),
            Free(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..8).prop_map(Op::Alloc),
                any::<usize>().prop_map(Op::Free)
            ]
        }

        proptest! {
            /// Every operation keeps every invariant; a failed allocation means no free
            /// block was large enough.
            #[test]
            fn invariants_hold(top in 0u8..9, ops in proptest::collection::vec(op(), 0..200)) {
                let mut b = Buddy::new(64 << top).unwrap();
                let mut live: Vec<(u32, u8)> = Vec::new();
                for op in ops {
                    match op {
                        Op::Alloc(k) => match b.alloc(k) {
                            Some(i) => live.push((i, k)),
                            None => prop_assert!(
                                check(&b).iter().all(|&(_, o, f)| !f || o < k)
                            ),
                        },
                        Op::Free(n) if !live.is_empty() => {
                            let (i, k) = live.swap_remove(n % live.len());
                            b.free(i, k);
                        }
                        Op::Free(_) => {}
                    }
                    check(&b);
                }
                for (i, k) in live.drain(..) {
                    b.free(i, k);
                }
                prop_assert_eq!(check(&b), vec![(0, top, true)]);
            }
        }
    }
}
