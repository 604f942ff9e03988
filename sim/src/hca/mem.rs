//! Raw access to registered memory: the simulator's only `unsafe` module.
//!
//! A [`Region`] is created (unsafely) when memory is registered and lives in the world's MR
//! table until the MR is dropped. Spans ([`Src`], [`Dst`]) borrow a region, or a Rust slice,
//! and are bounds-checked at creation, so copying between them is safe to call.
//!
//! **Concurrent access.** Copies and atomics run with the world held exclusively or on a
//! queue pair's send lane (`gate.rs`), and lanes of different queue pairs run beside each
//! other: two lanes may read and write the same bytes of one region at once (two peers'
//! RDMA WRITEs to overlapping bytes, a WRITE beside a READ of them, two atomics on one
//! word). Every access the simulator makes to memory is therefore atomic:
//!
//! - a copy moves the bytes with relaxed atomic loads and stores, a word (8 bytes) at a
//!   time where source and destination share their alignment, else a byte at a time
//!   ([`copy`]). Two copies into overlapping bytes leave each byte (each word, where both
//!   are aligned alike) from one of them, and a read beside a write sees each byte old or
//!   new: what hardware promises for racing DMA (nothing about the order between bytes),
//!   and no data race in Rust's memory model, where racing non-atomic accesses are
//!   undefined behaviour;
//! - a fetch-and-add or compare-and-swap is one read-modify-write instruction on the word
//!   ([`atomic`]: `AtomicU64`, sequentially consistent): indivisible against every other
//!   atomic the simulator executes on that word, from any queue pair of any device, and
//!   against the host's own `AtomicU64` operations on it. Devices report
//!   `IBV_ATOMIC_HCA` by default, as hardware and rxe do (`FabricConfig::atomic_cap`).
//!
//! A region is never accessed beside its deregistration: a lane reads the MR table with
//! the world shared, and a deregistration removes the region only with the world held
//! exclusively, after every lane has drained (`gate.rs`).

use core::marker::PhantomData;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};
use core::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Arc;

/// Registered memory `base..base + len`, named by the addresses `va..va + len` in work
/// requests, readable, and writable when `writable`. Process memory is named by its own
/// addresses (`va == base`); device memory by the I/O virtual address it was registered
/// at, and the region holds its block (`device`) alive.
#[derive(Debug)]
pub(crate) struct Region {
    base: *mut u8,
    va: u64,
    len: usize,
    writable: bool,
    device: Option<Arc<DeviceBlock>>,
}

/// A device's own memory (an accelerator's, exported as a dmabuf): bytes the host reaches
/// only through explicit copies ([`DeviceBlock::copy_in`], [`DeviceBlock::copy_out`]),
/// 8-byte aligned so that atomics on its words are `AtomicU64` operations. Zeroed when
/// allocated.
#[derive(Debug)]
pub(crate) struct DeviceBlock {
    storage: Storage,
    len: usize,
}

/// Where a block's bytes are: process memory standing for the device's, or (feature
/// `cuda`) a GPU's managed memory (`gpu.rs`).
#[derive(Debug)]
enum Storage {
    Host(Box<[AtomicU64]>),
    #[cfg(feature = "cuda")]
    Gpu(crate::gpu::Managed),
}

impl DeviceBlock {
    pub(crate) fn new(len: usize) -> DeviceBlock {
        DeviceBlock {
            storage: Storage::Host((0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect()),
            len,
        }
    }

    /// `len` bytes of GPU `ordinal`'s managed memory.
    #[cfg(feature = "cuda")]
    pub(crate) fn gpu(ordinal: usize, len: usize) -> Result<DeviceBlock, crate::SimError> {
        let storage = Storage::Gpu(crate::gpu::Managed::alloc(ordinal, len)?);
        Ok(DeviceBlock { storage, len })
    }

    /// The GPU's pointer to the bytes, if they are a GPU's.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_ptr(&self) -> Option<u64> {
        match &self.storage {
            Storage::Gpu(m) => Some(m.device_ptr()),
            Storage::Host(_) => None,
        }
    }

    /// The first byte. Host words are interior-mutable and every access to a block is
    /// atomic (module docs), so writes through this pointer are sound; managed memory is
    /// ordinary memory on the host's side.
    fn base(&self) -> *mut u8 {
        match &self.storage {
            Storage::Host(words) => words.as_ptr() as *mut u8,
            #[cfg(feature = "cuda")]
            Storage::Gpu(m) => m.base(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A region over `offset..offset + len` of the block, named by `va..`; `None` past
    /// its end.
    pub(crate) fn region(
        self: &Arc<Self>,
        offset: usize,
        len: usize,
        va: u64,
        writable: bool,
    ) -> Option<Region> {
        (offset.checked_add(len)? <= self.len).then(|| Region {
            // The `Arc` in the region keeps the bytes alive.
            base: self.base().wrapping_add(offset),
            va,
            len,
            writable,
            device: Some(self.clone()),
        })
    }

    /// Copies `data` to `offset..`; false past the end.
    pub(crate) fn copy_in(self: &Arc<Self>, offset: usize, data: &[u8]) -> bool {
        let Some(r) = self.region(offset, data.len(), 0, true) else {
            return false;
        };
        let dst = r.dst(0, data.len()).expect("inside the region");
        copy(&[Src::slice(data)], &[dst], data.len());
        true
    }

    /// Copies `offset..offset + out.len()` to `out`; false past the end.
    pub(crate) fn copy_out(self: &Arc<Self>, offset: usize, out: &mut [u8]) -> bool {
        let Some(r) = self.region(offset, out.len(), 0, false) else {
            return false;
        };
        let n = out.len();
        let src = r.src(0, n).expect("inside the region");
        copy(&[src], &[Dst::slice(out)], n);
        true
    }
}

// SAFETY: a `Region` only names memory: process memory that the contract of `Region::new`
// makes usable from any thread, or a device block (atomic words) it holds alive.
unsafe impl Send for Region {}
// SAFETY: `&Region` only hands out spans, and every access through a span is atomic (module
// docs), so threads sharing a region never race.
unsafe impl Sync for Region {}

impl Region {
    /// Wraps registered memory.
    ///
    /// # Safety
    /// `base..base + len` must be valid for reads, and for writes when `writable`, for as
    /// long as the returned value lives, and must not be accessed through Rust references
    /// while the simulator may touch it.
    pub(crate) unsafe fn new(base: *mut u8, len: usize, writable: bool) -> Region {
        Region {
            base,
            va: base as u64,
            len,
            writable,
            device: None,
        }
    }

    /// Whether the region is process memory (not a device's).
    pub(crate) fn is_host(&self) -> bool {
        self.device.is_none()
    }

    /// Offset of `addr..addr + len` inside the region, if it lies fully inside.
    #[inline]
    fn offset(&self, addr: u64, len: usize) -> Option<usize> {
        let off = usize::try_from(addr.checked_sub(self.va)?).ok()?;
        (off.checked_add(len)? <= self.len).then_some(off)
    }

    /// Whether `addr..addr + len` lies inside the region.
    #[inline]
    pub(crate) fn contains(&self, addr: u64, len: usize) -> bool {
        self.offset(addr, len).is_some()
    }

    /// A readable span of `addr..addr + len`, if inside the region.
    #[inline]
    pub(crate) fn src(&self, addr: u64, len: usize) -> Option<Src<'_>> {
        let off = self.offset(addr, len)?;
        Some(Src {
            ptr: self.base.wrapping_add(off),
            len,
            _life: PhantomData,
        })
    }

    /// A writable span of `addr..addr + len`, if inside the region and the region is writable.
    #[inline]
    pub(crate) fn dst(&self, addr: u64, len: usize) -> Option<Dst<'_>> {
        let off = self.offset(addr, len).filter(|_| self.writable)?;
        Some(Dst {
            ptr: self.base.wrapping_add(off),
            len,
            _life: PhantomData,
        })
    }
}

/// The spans a gather or scatter list resolves to, in list order, entries of no length
/// left out (so at most [`MAX_SGE`](crate::types::MAX_SGE)): filled in place, the room past them never written.
pub(crate) type Spans<T> = heapless::Vec<T, { crate::types::MAX_SGE }>;

/// Bytes that may be read for `'a`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Src<'a> {
    ptr: *const u8,
    len: usize,
    _life: PhantomData<&'a [u8]>,
}

impl<'a> Src<'a> {
    /// The empty span.
    #[cfg(test)]
    pub(crate) const EMPTY: Src<'static> = Src {
        ptr: core::ptr::null(),
        len: 0,
        _life: PhantomData,
    };

    /// A span over a slice.
    pub(crate) fn slice(s: &'a [u8]) -> Src<'a> {
        Src {
            ptr: s.as_ptr(),
            len: s.len(),
            _life: PhantomData,
        }
    }
}

/// Bytes that may be written (and read) for `'a`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dst<'a> {
    ptr: *mut u8,
    len: usize,
    _life: PhantomData<&'a mut [u8]>,
}

impl<'a> Dst<'a> {
    /// The empty span.
    #[cfg(test)]
    pub(crate) const EMPTY: Dst<'static> = Dst {
        ptr: core::ptr::null_mut(),
        len: 0,
        _life: PhantomData,
    };

    /// A span over a mutable slice.
    pub(crate) fn slice(s: &'a mut [u8]) -> Dst<'a> {
        Dst {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: PhantomData,
        }
    }
}

/// `dst` without its first `n` bytes.
pub(crate) fn skip<'a>(dst: &[Dst<'a>], mut n: usize) -> Spans<Dst<'a>> {
    let mut out = Spans::new();
    for d in dst {
        let cut = n.min(d.len);
        n -= cut;
        if cut < d.len {
            // `wrapping_add` keeps this free of unsafe; the pointer stays inside the span.
            let rest = Dst {
                ptr: d.ptr.wrapping_add(cut),
                len: d.len - cut,
                _life: PhantomData,
            };
            // As many spans as `dst` has, which fits.
            let _ = out.push(rest);
        }
    }
    out
}

/// Proof that the caller of an `unsafe` entry point vouched for raw inline source addresses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawInline(());

impl RawInline {
    /// # Safety
    /// Every address range later passed to [`RawInline::src`] must be valid for reads while
    /// the span is used (the caller of `Qp::post_send_raw` promises this for inline SGEs).
    pub(crate) unsafe fn new() -> RawInline {
        RawInline(())
    }

    /// A readable span of unregistered memory (an inline SGE); `None` for a null address.
    pub(crate) fn src(&self, addr: u64, len: usize) -> Option<Src<'_>> {
        let ptr = usize::try_from(addr).ok().filter(|&a| a != 0)? as *const u8;
        Some(Src {
            ptr,
            len,
            _life: PhantomData,
        })
    }
}

/// Copies `len` bytes from the concatenation of `src` to the concatenation of `dst`,
/// range by range, with atomic accesses (see the module docs). Overlapping memory is
/// copied as by `memmove` per range.
///
/// # Panics
/// If either list holds fewer than `len` bytes (callers check lengths first).
#[inline(always)]
pub(crate) fn copy(src: &[Src<'_>], dst: &[Dst<'_>], len: usize) {
    if let (Some(s), Some(d)) = (src.first(), dst.first()) {
        if s.len >= len && d.len >= len {
            // The common case, one span each way.
            // SAFETY: `len <= s.len` and `len <= d.len`; spans are valid for their
            // lifetime, which outlives this call, and are accessed only atomically.
            unsafe { move_bytes(s.ptr, d.ptr, len) }
            return;
        }
    }
    copy_spans(src, dst, len);
}

/// [`copy`] across spans.
#[inline(never)]
fn copy_spans(src: &[Src<'_>], dst: &[Dst<'_>], mut len: usize) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    while len > 0 {
        let (s, d) = (&src[si], &dst[di]);
        let n = (s.len - so).min(d.len - doff).min(len);
        if n > 0 {
            // SAFETY: `so + n <= s.len` and `doff + n <= d.len`, and spans are only created
            // over memory valid for reads (`Src`) or writes (`Dst`) for their lifetime, which
            // outlives this call, and are accessed only atomically.
            unsafe { move_bytes(s.ptr.add(so), d.ptr.add(doff), n) }
        }
        (so, doff, len) = (so + n, doff + n, len - n);
        if so == s.len {
            (si, so) = (si + 1, 0);
        }
        if doff == d.len {
            (di, doff) = (di + 1, 0);
        }
    }
}

/// Moves `n` bytes from `src` to `dst` with relaxed atomic loads and stores: words where
/// the two share their alignment modulo 8, bytes elsewhere; backwards when `dst` lies
/// inside `src..src + n` (as `memmove` does).
///
/// # Safety
/// `src..src + n` must be valid for reads and `dst..dst + n` for writes, and neither may be
/// accessed non-atomically by another thread meanwhile.
#[inline(always)]
unsafe fn move_bytes(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    if d > s && d - s < n {
        // SAFETY: the caller's contract, passed on.
        return unsafe { move_back(src, dst, n) };
    }
    let mut i = 0;
    if (s ^ d) % 8 == 0 {
        let head = ((8 - s % 8) % 8).min(n);
        while i < head {
            // SAFETY: `i < n`: inside both ranges (the caller's contract).
            unsafe { move_byte(src.add(i), dst.add(i)) };
            i += 1;
        }
        let words = (n - i) / 8;
        // SAFETY: `i + 8 * words <= n`: inside both ranges (the caller's contract); both
        // are 8-aligned at `i` (they share their alignment and `i` passed `head`).
        let (mut s, mut d) = unsafe { (src.add(i).cast::<u64>(), dst.add(i).cast::<u64>()) };
        // SAFETY: one past the last word, inside or at the end of the source range.
        let end = unsafe { s.add(words) };
        while s != end {
            // SAFETY: `s < end`: a word inside both ranges, aligned; every access to them
            // is atomic (the caller's contract).
            unsafe {
                let w = AtomicU64::from_ptr(s.cast_mut()).load(Relaxed);
                AtomicU64::from_ptr(d).store(w, Relaxed);
                (s, d) = (s.add(1), d.add(1));
            }
        }
        i += 8 * words;
    }
    while i < n {
        // SAFETY: `i < n`: inside both ranges (the caller's contract).
        unsafe { move_byte(src.add(i), dst.add(i)) };
        i += 1;
    }
}

/// [`move_bytes`] from the last byte to the first, a byte at a time (overlapping ranges
/// with `dst` after `src`: a copy within one region, which programs rarely make).
///
/// # Safety
/// As [`move_bytes`].
#[inline(never)]
unsafe fn move_back(src: *const u8, dst: *mut u8, n: usize) {
    for i in (0..n).rev() {
        // SAFETY: `i < n`: inside both ranges (the caller's contract).
        unsafe { move_byte(src.add(i), dst.add(i)) };
    }
}

/// One byte moved with a relaxed atomic load and store.
///
/// # Safety
/// `src` valid for reads, `dst` for writes, neither accessed non-atomically meanwhile.
#[inline(always)]
unsafe fn move_byte(src: *const u8, dst: *mut u8) {
    // SAFETY: the caller's contract; `AtomicU8` has the size and alignment of `u8`.
    unsafe {
        let b = AtomicU8::from_ptr(src.cast_mut()).load(Relaxed);
        AtomicU8::from_ptr(dst).store(b, Relaxed);
    }
}

/// The read-modify-write of a remote atomic.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rmw {
    /// Fetch-and-add (wrapping).
    Add(u64),
    /// Compare-and-swap: `swap` is stored when the word equals `compare`.
    Cas {
        /// Expected value.
        compare: u64,
        /// Stored on a match.
        swap: u64,
    },
}

/// Applies `op` to the native-endian `u64` under `dst` (8 bytes, 8-aligned) as one
/// indivisible operation (see the module docs); returns the old value.
///
/// # Panics
/// If `dst` is not 8 bytes long or not 8-byte aligned (callers check alignment first).
pub(crate) fn atomic(dst: &Dst<'_>, op: Rmw) -> u64 {
    assert!(
        dst.len == 8 && dst.ptr as usize % 8 == 0,
        "bad atomic target"
    );
    // SAFETY: `dst` covers 8 writable bytes (span invariant) for its lifetime, which
    // outlives `word`; `ptr` is 8-aligned (checked); every access the simulator makes to
    // registered memory is atomic (module docs).
    let word = unsafe { AtomicU64::from_ptr(dst.ptr.cast()) };
    match op {
        Rmw::Add(add) => word.fetch_add(add, SeqCst),
        Rmw::Cas { compare, swap } => match word.compare_exchange(compare, swap, SeqCst, SeqCst) {
            Ok(old) | Err(old) => old,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_walks_ranges_and_leaves_the_rest() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        let mut x = [0u8; 2];
        let mut y = [0u8; 4];
        let src = [Src::slice(&a), Src::EMPTY, Src::slice(&b)];
        let dst = [Dst::slice(&mut x), Dst::EMPTY, Dst::slice(&mut y)];
        copy(&src, &dst, 4);
        assert_eq!(x, [1, 2]);
        assert_eq!(y, [3, 4, 0, 0]);
    }

    #[test]
    fn region_bounds() {
        let mut m = [0u8; 16];
        let base = m.as_mut_ptr() as u64;
        // SAFETY: `m` outlives `r` and is only used through `r` meanwhile.
        let r = unsafe { Region::new(m.as_mut_ptr(), 16, false) };
        assert!(r.contains(base, 16) && r.contains(base + 16, 0));
        assert!(!r.contains(base + 1, 16) && !r.contains(base - 1, 1));
        assert!(!r.contains(u64::MAX, 2));
        assert!(r.src(base, 4).is_some() && r.dst(base, 4).is_none());
    }
}
