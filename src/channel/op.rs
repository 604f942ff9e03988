//! [`Op`]: one send-queue operation and the local memory it names, built once and posted
//! by any level: blocking ([`Channel::execute`](super::Channel::execute)), scoped
//! ([`Scope::post`](super::Scope::post)), many peers
//! ([`MultiScope::post`](crate::MultiScope::post)), async (`AsyncChannel::post`, feature
//! `tokio`). The list of operations is written here only; the levels' named methods
//! (`write`, `post_write`, ...) are sugar over it.
//!
//! The local memory is borrowed registered slices, for `'a` (shared for what the device
//! reads, exclusive for what it writes), so a level that posts them holds that borrow until
//! the work is done; or an [`Owned`] buffer, which the async level keeps until the device is
//! done and then gives back. Which kinds an operation takes is said by the sealed traits
//! [`Slices`] (slices the device reads or writes, or an owned buffer) and [`AtomicResult`]
//! (an atomic's 8-byte result). The remote region is plain data, copied in.

use core::iter::Once;
use core::marker::PhantomData;

use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::qp::{AddressHandle, Rc, Transport, Ud};
use crate::types::{SendFlags, SendOp, Sge, UdDest};

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
    pub trait Slices<S> {}
    pub trait AtomicResult {}
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

/// An owned buffer as an operation's local memory: what the async level posts
/// (`AsyncChannel::post`, feature `tokio`), which holds the buffer until the device is done
/// with it and then gives it back.
#[derive(Debug)]
pub struct Owned<B>(pub B);

/// The entry of a buffer the posting level holds (an [`Owned`] one, once taken out of its
/// operation), lent to the device: the level keeps the memory until the work is done.
#[cfg(feature = "tokio")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent(pub(crate) Sge);

#[cfg(feature = "tokio")]
impl sealed::Sealed for Lent {}
#[cfg(feature = "tokio")]
impl Local for Lent {
    #[inline(always)]
    fn entry(&self) -> Sge {
        self.0
    }
}

/// Local memory an operation names: registered slices of kind `S`, in gather or scatter
/// order ([`LocalSlice`]s for what the device reads: sends, writes; [`LocalSliceMut`]s for
/// what it writes: reads), or an [`Owned`] buffer. Sealed.
pub trait Slices<S>: sealed::Slices<S> {
    /// What the operation holds.
    #[doc(hidden)]
    type Local;
    #[doc(hidden)]
    fn into_local(self) -> Self::Local;
}

impl<S, T: IntoIterator<Item = S>> sealed::Slices<S> for T {}
impl<S, T: IntoIterator<Item = S>> Slices<S> for T {
    type Local = T::IntoIter;
    #[inline(always)]
    fn into_local(self) -> T::IntoIter {
        self.into_iter()
    }
}

/// Where an atomic's result lands: one registered slice, or an [`Owned`] buffer, of 8
/// bytes (checked when posted). Sealed.
pub trait AtomicResult<'a>: sealed::AtomicResult {
    /// What the operation holds.
    #[doc(hidden)]
    type Local;
    #[doc(hidden)]
    fn into_local(self) -> Self::Local;
}

impl sealed::AtomicResult for LocalSliceMut<'_> {}
impl<'a> AtomicResult<'a> for LocalSliceMut<'a> {
    type Local = Once<LocalSliceMut<'a>>;
    #[inline(always)]
    fn into_local(self) -> Self::Local {
        core::iter::once(self)
    }
}

impl<B, S> sealed::Slices<S> for Owned<B> {}
impl<B> sealed::AtomicResult for Owned<B> {}
impl<B, S> Slices<S> for Owned<B> {
    type Local = Owned<B>;
    #[inline(always)]
    fn into_local(self) -> Owned<B> {
        self
    }
}
impl<B> AtomicResult<'_> for Owned<B> {
    type Local = Owned<B>;
    #[inline(always)]
    fn into_local(self) -> Owned<B> {
        self
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
#[derive(Clone, Debug)]
pub struct Op<'a, L, T: Transport = Rc> {
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
    /// The borrow of the local memory (and of a datagram's address handle), and the
    /// transport whose channels post it.
    _marker: PhantomData<(&'a (), T)>,
}

impl<'a, L, T: Transport> Op<'a, L, T> {
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
            _marker: PhantomData,
        }
    }

    /// The same operation over `local` instead; the memory it named. The new operation's
    /// lifetime is its new memory's: the caller holds what `local` names (an [`Owned`]
    /// buffer taken out, a [`Lent`] entry) until the work is done.
    #[cfg(feature = "tokio")]
    #[inline(always)]
    pub(crate) fn relocate<'b, M>(self, local: M) -> (L, Op<'b, M, T>) {
        let Op {
            local: was,
            op,
            flags,
            room,
            remote,
            atomic,
            ..
        } = self;
        let op = Op {
            local,
            op,
            flags,
            room,
            remote,
            atomic,
            _marker: PhantomData,
        };
        (was, op)
    }
}

impl<'a, L> Op<'a, L> {
    /// A send of `data` (the concatenation of its slices).
    #[inline(always)]
    pub fn send<D: Slices<LocalSlice<'a>, Local = L>>(data: D) -> Self {
        Op::new(data.into_local(), SendOp::Send, None, false)
    }

    /// A send of `data` with 32 bits of immediate data for the receiver.
    #[inline(always)]
    pub fn send_with_imm<D: Slices<LocalSlice<'a>, Local = L>>(data: D, imm: u32) -> Self {
        Op::new(data.into_local(), SendOp::SendWithImm(imm), None, false)
    }

    /// An RDMA write of `data` to the start of `remote`.
    #[inline(always)]
    pub fn write<D: Slices<LocalSlice<'a>, Local = L>>(data: D, remote: &RemoteRegion) -> Self {
        Op::new(data.into_local(), remote.write_op(), Some(*remote), false)
    }

    /// An RDMA write of `data` to `remote` that hands `imm` to a receive at the peer.
    #[inline(always)]
    pub fn write_with_imm<D: Slices<LocalSlice<'a>, Local = L>>(
        data: D,
        remote: &RemoteRegion,
        imm: u32,
    ) -> Self {
        let op = remote.write_with_imm_op(imm);
        Op::new(data.into_local(), op, Some(*remote), false)
    }

    /// An RDMA read from the start of `remote` into `data`.
    #[inline(always)]
    pub fn read<D: Slices<LocalSliceMut<'a>, Local = L>>(data: D, remote: &RemoteRegion) -> Self {
        Op::new(data.into_local(), remote.read_op(), Some(*remote), false)
    }

    /// Adds `add` to the `u64` at the start of `remote`; the previous value lands in
    /// `result`, which must be 8 bytes.
    #[inline(always)]
    pub fn fetch_add<R: AtomicResult<'a, Local = L>>(
        result: R,
        remote: &RemoteRegion,
        add: u64,
    ) -> Self {
        let op = remote.fetch_add_op(add);
        Op::new(result.into_local(), op, Some(*remote), true)
    }

    /// Replaces the `u64` at the start of `remote` with `swap` if it equals `compare`; the
    /// previous value lands in `result`, which must be 8 bytes.
    #[inline(always)]
    pub fn compare_swap<R: AtomicResult<'a, Local = L>>(
        result: R,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Self {
        let op = remote.compare_swap_op(compare, swap);
        Op::new(result.into_local(), op, Some(*remote), true)
    }
}

/// Where a datagram goes: the queue pair `qpn` behind an address handle, and the Q_Key
/// that queue pair checks. It borrows the handle for `'a`: the device reads the handle as
/// it transmits, so the handle outlives every datagram sent through it.
#[derive(Clone, Copy, Debug)]
pub struct Destination<'a> {
    dest: UdDest,
    _ah: PhantomData<&'a ()>,
}

impl<'a> Destination<'a> {
    /// The queue pair `qpn` behind `ah`, which checks `qkey`.
    pub fn new<P: Provider>(ah: &'a AddressHandle<P>, qpn: u32, qkey: u32) -> Self {
        Destination {
            dest: UdDest {
                ah: ah.key(),
                remote_qpn: qpn,
                remote_qkey: qkey,
            },
            _ah: PhantomData,
        }
    }
}

impl<'a, L> Op<'a, L, Ud> {
    /// A datagram of `data` (the concatenation of its slices, at most one packet of the
    /// path MTU) to `to`. It consumes a receive there if there is one, and is lost if not.
    #[inline(always)]
    pub fn datagram<D: Slices<LocalSlice<'a>, Local = L>>(data: D, to: &Destination<'a>) -> Self {
        let op = SendOp::Datagram {
            dest: to.dest,
            imm: None,
        };
        Op::new(data.into_local(), op, None, false)
    }

    /// A datagram of `data` to `to` with 32 bits of immediate data for the receiver.
    #[inline(always)]
    pub fn datagram_with_imm<D: Slices<LocalSlice<'a>, Local = L>>(
        data: D,
        to: &Destination<'a>,
        imm: u32,
    ) -> Self {
        let op = SendOp::Datagram {
            dest: to.dest,
            imm: Some(imm),
        };
        Op::new(data.into_local(), op, None, false)
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
