//! [`Op`]: one send-queue operation and the local memory it names, built once and posted
//! by any level: blocking ([`Channel::execute`](super::Channel::execute)), scoped
//! ([`Scope::post`](super::Scope::post)), many peers
//! ([`MultiScope::post`](crate::MultiScope::post)). The list of operations is written
//! here only; the levels' named methods (`write`, `post_write`, ...) are sugar over it.
//!
//! An `Op` borrows its local memory for `'a` (shared for what the device reads, exclusive
//! for what it writes), so a level that posts it holds that borrow until the work is done.
//! The remote region is plain data, copied in.

use core::iter::Once;
use core::marker::PhantomData;

use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::types::{SendFlags, SendOp, Sge};

/// The most local bytes an operation on `remote` may name: its length, less what would
/// wrap past the top of the address space (a peer's region whose end wraps holds nothing
/// there, as `RemoteRegion::slice` says); `u64::MAX` without a remote region.
#[inline(always)]
pub(crate) const fn room(remote: Option<RemoteRegion>) -> u64 {
    match remote {
        Some(r) => {
            let below_top = u64::MAX - r.addr;
            if r.len < below_top {
                r.len
            } else {
                below_top
            }
        }
        None => u64::MAX,
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Local memory an [`Op`] names: a [`LocalSlice`] the device reads (sends, writes), a
/// [`LocalSliceMut`] it writes (reads, an atomic's result), or inline bytes. Sealed.
pub trait Local: sealed::Sealed {
    /// The scatter/gather entry.
    #[doc(hidden)]
    fn entry(&self) -> Sge;
}

impl sealed::Sealed for LocalSlice<'_> {}
impl Local for LocalSlice<'_> {
    #[inline(always)]
    fn entry(&self) -> Sge {
        self.sge()
    }
}

impl sealed::Sealed for LocalSliceMut<'_> {}
impl Local for LocalSliceMut<'_> {
    #[inline(always)]
    fn entry(&self) -> Sge {
        self.sge()
    }
}

/// Bytes an inline send carries: the device copies them when the send is posted, so they
/// need no registration (lkey 0).
#[derive(Clone, Copy, Debug)]
pub struct Inline<'a>(&'a [u8]);

impl sealed::Sealed for Inline<'_> {}
impl Local for Inline<'_> {
    #[inline(always)]
    fn entry(&self) -> Sge {
        Sge {
            addr: self.0.as_ptr() as u64,
            // Saturated: a length past u32 is past any device's inline limit, which refuses
            // the send (the entry stays within the slice either way).
            length: u32::try_from(self.0.len()).unwrap_or(u32::MAX),
            lkey: 0,
        }
    }
}

/// One operation on a send queue and the local memory it names. Built by the functions
/// below; posted by [`Channel::execute`](super::Channel::execute),
/// [`Scope::post`](super::Scope::post) or [`MultiScope::post`](crate::MultiScope::post).
///
/// ```
/// # use zverbs::provider::sim::Sim;
/// # use zverbs::{AccessFlags, Channel, ChannelConfig, Context};
/// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default())?;
/// # let (pa, pb, mut a, _b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
/// use zverbs::Op;
///
/// let mut target = [0u8; 8];
/// // SAFETY: nothing reads `target` until the writes below have completed.
/// let target = unsafe { pb.register_with_access(&mut target, AccessFlags::all())? };
/// let (mut one, mut two) = (*b"abcd", *b"efgh");
/// let (one, two) = (pa.register(&mut one)?, pa.register(&mut two)?);
/// let remote = target.remote();
/// // The same values, posted blocking or in a scope.
/// a.execute(Op::write([one.slice(..)?], &remote))?;
/// a.scope(|s| {
///     s.post(Op::write([two.slice(..)?], &remote.slice(4..)?))?;
///     Ok(())
/// })?;
/// assert_eq!(target.as_slice(), b"abcdefgh");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "an operation does nothing until it is posted"]
#[derive(Debug)]
pub struct Op<'a, L> {
    /// The local memory, in gather/scatter order.
    pub(crate) local: L,
    /// What the work request does (with the remote address and key where it has one).
    pub(crate) op: SendOp,
    /// `INLINE` for an inline send; otherwise empty.
    pub(crate) flags: SendFlags,
    /// The most local bytes the remote side holds: the remote region's length, less
    /// what would wrap past the top of the address space; `u64::MAX` without one.
    pub(crate) room: u64,
    /// The remote region, for the error when the local bytes exceed `room`.
    pub(crate) remote: Option<RemoteRegion>,
    /// An atomic: the device must support atomics and the local result must be 8 bytes.
    pub(crate) atomic: bool,
    _borrow: PhantomData<&'a ()>,
}

impl<'a, L> Op<'a, L> {
    #[inline(always)]
    const fn new(local: L, op: SendOp, remote: Option<RemoteRegion>, atomic: bool) -> Self {
        let room = room(remote);
        Op {
            local,
            op,
            flags: SendFlags::empty(),
            room,
            remote,
            atomic,
            _borrow: PhantomData,
        }
    }
}

impl<'a, I: Iterator<Item = LocalSlice<'a>>> Op<'a, I> {
    /// A send of the concatenation of `data`.
    #[inline(always)]
    pub fn send(data: impl IntoIterator<IntoIter = I>) -> Self {
        Op::new(data.into_iter(), SendOp::Send, None, false)
    }

    /// A send of `data` with 32 bits of immediate data for the receiver.
    #[inline(always)]
    pub fn send_with_imm(data: impl IntoIterator<IntoIter = I>, imm: u32) -> Self {
        Op::new(data.into_iter(), SendOp::SendWithImm(imm), None, false)
    }

    /// An RDMA write of `data` to the start of `remote`.
    #[inline(always)]
    pub fn write(data: impl IntoIterator<IntoIter = I>, remote: &RemoteRegion) -> Self {
        Op::new(data.into_iter(), remote.write_op(), Some(*remote), false)
    }

    /// An RDMA write of `data` to `remote` that hands `imm` to a receive at the peer.
    #[inline(always)]
    pub fn write_with_imm(
        data: impl IntoIterator<IntoIter = I>,
        remote: &RemoteRegion,
        imm: u32,
    ) -> Self {
        let op = remote.write_with_imm_op(imm);
        Op::new(data.into_iter(), op, Some(*remote), false)
    }
}

impl<'a, I: Iterator<Item = LocalSliceMut<'a>>> Op<'a, I> {
    /// An RDMA read from the start of `remote` into `data`.
    #[inline(always)]
    pub fn read(data: impl IntoIterator<IntoIter = I>, remote: &RemoteRegion) -> Self {
        Op::new(data.into_iter(), remote.read_op(), Some(*remote), false)
    }
}

impl<'a> Op<'a, Once<LocalSliceMut<'a>>> {
    /// Adds `add` to the `u64` at the start of `remote`; the previous value lands in
    /// `result`, which must be 8 bytes.
    #[inline(always)]
    pub fn fetch_add(result: LocalSliceMut<'a>, remote: &RemoteRegion, add: u64) -> Self {
        let op = remote.fetch_add_op(add);
        Op::new(core::iter::once(result), op, Some(*remote), true)
    }

    /// Replaces the `u64` at the start of `remote` with `swap` if it equals `compare`; the
    /// previous value lands in `result`, which must be 8 bytes.
    #[inline(always)]
    pub fn compare_swap(
        result: LocalSliceMut<'a>,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Self {
        let op = remote.compare_swap_op(compare, swap);
        Op::new(core::iter::once(result), op, Some(*remote), true)
    }
}

impl<'a> Op<'a, Once<Inline<'a>>> {
    /// A send of `bytes` inline: the device copies them when the send is posted, so they
    /// need no registration. At most the queue pair's `max_inline_data` bytes; the
    /// device refuses more when it is posted.
    #[inline(always)]
    pub fn send_inline(bytes: &'a [u8]) -> Self {
        let mut op = Op::new(core::iter::once(Inline(bytes)), SendOp::Send, None, false);
        op.flags = SendFlags::INLINE;
        op
    }
}
