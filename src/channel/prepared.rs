//! A channel before `connect`: its endpoint to hand to the peer, and receives posted
//! early, as C verbs programs post them in INIT so the peer's first message finds one
//! (held by a scope on the connected channel, [`PreparedChannel::connect_scope`], or
//! unpolled).

use super::post::{collect_sges, post_recv_one};
use super::scope::{self, PostedReceive, Scope};
use super::{Channel, ChannelTransport, Owner, Pending, PostedBy, Queue};
use crate::error::Error;
use crate::mr::LocalSliceMut;
use crate::provider::Provider;
use crate::qp::{Connected, Endpoint, Init, QueuePair, Rc};
use crate::ring::Ring;
use crate::types::{RecvWr, Sge, WorkCompletion};

/// A channel whose queue pair is created but not connected: hand its
/// [`endpoint`](PreparedChannel::endpoint) to the peer, then [`connect`](PreparedChannel::connect).
pub struct PreparedChannel<
    P: Provider,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
    T: ChannelTransport = Rc,
> {
    pub(super) owner: Owner,
    pub(super) qp: QueuePair<P, Init, T>,
    pub(super) send_cq: super::source::Completions<P>,
    pub(super) sq: Ring<P::SendEntry<SGES>, DEPTH>,
    pub(super) rx: T::Rx<P, DEPTH, SGES>,
    pub(super) config: super::Config,
}

impl<P: Provider, T: ChannelTransport + Connected, const DEPTH: usize, const SGES: usize>
    PreparedChannel<P, DEPTH, SGES, T>
{
    /// This side's endpoint.
    pub fn endpoint(&self) -> Endpoint {
        self.qp.endpoint()
    }

    /// Takes what a connection manager decided for this side (see
    /// [`QueuePair::take_path`](crate::qp::QueuePair)): the source GID's index and the
    /// first PSN.
    #[cfg(all(feature = "std", unix))]
    pub(crate) fn take_path(&mut self, sgid_index: u8, psn: u32) {
        self.qp.take_path(sgid_index, psn);
    }

    /// The configuration it was prepared with.
    #[cfg(all(feature = "std", unix))]
    pub(crate) fn config(&self) -> &super::ChannelConfig {
        &self.config
    }

    /// Connects to the peer at `remote` (INIT → RTR → RTS).
    pub fn connect(self, remote: &Endpoint) -> Result<Channel<P, DEPTH, SGES, T>, Error<P::Error>> {
        crate::trace::span!(
            DEBUG,
            "connect",
            qp = self.qp.qp_num(),
            peer_qp = remote.qp_num
        );
        let qp = self
            .qp
            .into_rtr(remote, &self.config.rtr)
            .map_err(|e| e.error)?;
        let qp = qp.into_rts(&self.config.rts).map_err(|e| e.error)?;
        Ok(Channel {
            owner: self.owner,
            qp,
            send_cq: self.send_cq,
            sq: self.sq,
            rx: self.rx,
            config: self.config,
            wc: WorkCompletion::EMPTY,
        })
    }
}

impl<P: Provider, const DEPTH: usize, const SGES: usize> PreparedChannel<P, DEPTH, SGES> {
    /// Posts a receive before the channel is connected, as C verbs programs do in INIT, so
    /// that the peer's first message, which may come the moment the peer is connected,
    /// finds a receive. Redeem the handle on the connected channel
    /// ([`Channel::wait`], [`Channel::try_complete`]): it keeps its owner across
    /// [`connect`](Self::connect). The same without `unsafe`, the receives held by a scope:
    /// [`connect_scope`](Self::connect_scope).
    ///
    /// # Safety
    /// As [`Channel::post_receive_unpolled`]: the memory named by `sges` must stay valid and
    /// must not be accessed through Rust references until the handle is redeemed (also if
    /// `connect` fails: the channel is gone then, and with it the work).
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context};
    /// # let sim = Sim::with_devices(2);
    /// # let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
    /// # let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    /// let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default()).unwrap();
    /// let mut b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default()).unwrap();
    /// let mut inbox = [0u8; 8];
    /// let mut inbox = pb.register(&mut inbox).unwrap();
    /// // SAFETY: `inbox` is not touched before the receive is redeemed below.
    /// let first = unsafe { b.post_receive_unpolled(&[inbox.slice_mut(..).unwrap().sge()]) }.unwrap();
    /// let (ea, eb) = (a.endpoint(), b.endpoint());
    /// let mut a = a.connect(&eb).unwrap();
    /// let mut msg = *b"early";
    /// let msg = pa.register(&mut msg).unwrap();
    /// // Sent while b is still in INIT; b's device takes it once b is connected.
    /// // SAFETY: `msg` outlives the wait below.
    /// let sent = unsafe {
    ///     a.post_send_unpolled(&[msg.slice(..).unwrap().sge()], zverbs::SendOp::Send, zverbs::SendFlags::empty())
    /// }.unwrap();
    /// let mut b = b.connect(&ea).unwrap();
    /// a.wait(sent).unwrap();
    /// assert_eq!(b.wait(first).unwrap().byte_len, 5);
    /// assert_eq!(&inbox.as_slice()[..5], b"early");
    /// ```
    pub unsafe fn post_receive_unpolled(
        &mut self,
        sges: &[Sge],
    ) -> Result<Pending, Error<P::Error>> {
        let (sg_list, num_sge) = collect_sges::<SGES>(sges.iter().copied())
            .map_err(|(given, max)| Error::TooManySges { given, max })?;
        let wr = RecvWr {
            wr_id: 0,
            sg_list,
            num_sge,
        };
        let qp = &self.qp;
        // SAFETY: the caller keeps the memory valid and untouched until the handle is
        // redeemed, which is after the request completes.
        let seq = post_recv_one(&mut self.rx.ring, wr, |wr| unsafe { qp.post_recv(wr) })?;
        Ok(Pending {
            seq,
            queue: Queue::Recv,
            by: PostedBy {
                owner: self.owner,
                qp_num: self.qp.qp_num(),
            },
        })
    }

    /// Posts a receive into each of `early` while the queue pair is still in INIT (as C
    /// verbs programs do, so that the peer's first message, which may come the moment the
    /// peer is connected, finds one), connects to `remote`, and runs `f` in a scope on the
    /// connected channel that holds those receives (their handles are `f`'s second
    /// argument, in order) and whatever `f` posts. As any [scope](Channel::scope), it
    /// returns only once all of that has completed, so `early`'s memory stays borrowed until
    /// the device is done with it: the safe form of
    /// [`post_receive_unpolled`](Self::post_receive_unpolled). Returns the connected
    /// channel and `f`'s value.
    ///
    /// A receive refused, or a failed connection, ends the call with its error; the queue
    /// pair is destroyed before it returns, and with it the early receives.
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context};
    /// # let sim = Sim::with_devices(2);
    /// # let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
    /// # let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
    /// let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default())?;
    /// let b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default())?;
    /// let (ea, eb) = (a.endpoint(), b.endpoint());
    /// let mut a = a.connect(&eb)?;
    /// let mut msg = *b"early";
    /// let msg = pa.register(&mut msg)?;
    /// let mut inbox = [0u8; 8];
    /// let mut inbox = pb.register(&mut inbox)?;
    /// let (_b, len) = b.connect_scope(&ea, [inbox.slice_mut(..)?], |s, [first]| {
    ///     a.send([msg.slice(..)?])?; // finds the receive posted in INIT
    ///     Ok(s.wait_receive(first)?.byte_len)
    /// })?;
    /// assert_eq!((len, &inbox.as_slice()[..5]), (5, &b"early"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_scope<'env, R, const N: usize>(
        mut self,
        remote: &Endpoint,
        early: [LocalSliceMut<'env>; N],
        f: impl for<'ch> FnOnce(
            &mut Scope<'ch, 'env, P, DEPTH, SGES>,
            [PostedReceive; N],
        ) -> Result<R, Error<P::Error>>,
    ) -> Result<(Channel<P, DEPTH, SGES>, R), Error<P::Error>> {
        let recv_from = self.rx.ring.next_seq();
        for data in early {
            // SAFETY: `data` stays borrowed for `'env`, past this call, which returns only
            // once the receive has completed in the scope below (or the queue pair that
            // holds it is destroyed, on an error before it).
            // The handle is not needed: the scope takes the outcome by sequence number.
            drop(unsafe { self.post_receive_unpolled(&[data.sge()]) }?);
        }
        let mut ch = self.connect(remote)?;
        let handles = core::array::from_fn(|i| PostedReceive {
            seq: recv_from + i as u64,
        });
        let r = scope::run(&mut ch, recv_from, |s| f(s, handles))?;
        Ok((ch, r))
    }
}
