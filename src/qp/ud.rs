//! Unreliable-datagram queue pairs: their creation and transitions (a Q_Key, no peer),
//! and the address handles their datagrams are sent through.
//!
//! Everything else (states, posting, reset) is the [`QueuePair`]'s, whatever its transport.
//! A datagram is a [`SendOp::Datagram`](crate::SendOp::Datagram) whose
//! [`UdDest`](crate::UdDest) names an [`AddressHandle`] by its [key](AddressHandle::key):
//! the handle must stay alive until every datagram sent through it has completed (rxe
//! looks it up as it transmits), which `post_send`'s contract already asks of the memory.
//! Every receive buffer starts with 40 bytes for the global route header; the
//! completion's `byte_len` counts them, `src_qp`, `sl` and `slid` name the sender, and
//! `grh` says whether the header is there (always on RoCE; an InfiniBand sender whose
//! handle goes by LID alone, [`AhAttr::local`], sends none, and the 40 bytes are left as
//! they were).

use super::{check, Init, QpConfig, QueuePair, ReadyToReceive, ReadyToSend, Reset, Transition};
use super::{TransitionError, Ud, MAX_FLOW_LABEL, MAX_SL};
use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::{verb, Error};
use crate::provider::{AhAttr, Provider, UdInitAttr};
use crate::types::{AhKey, Gid, MAX_STATIC_RATE};

/// Attributes of an unreliable-datagram queue pair's RESET → INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdOptions {
    /// The Q_Key its receives accept (and its sends carry when a destination's has the high
    /// bit set, on devices that follow IBTA C10-15; rxe sends that value as it is).
    pub qkey: u32,
    /// P_Key index.
    pub pkey_index: u16,
}

impl<P: Provider> QueuePair<P, Reset, Ud> {
    /// Creates an unreliable-datagram queue pair whose sends complete on `send_cq` and
    /// receives on `recv_cq`. It sends [`SendOp::Datagram`](crate::SendOp::Datagram)s, each
    /// to the queue pair an [`AddressHandle`] and a QPN name, and
    /// every receive buffer starts with 40 bytes of global route header.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::qp::{QpConfig, QueuePair, UdOptions};
    /// use zverbs::{CompletionQueue, Context, QpState};
    /// let sim = Sim::with_devices(1);
    /// let ctx = Context::open(&sim, "sim0").unwrap();
    /// let pd = ctx.alloc_pd().unwrap();
    /// let cq = CompletionQueue::create(&ctx, 16).unwrap();
    /// let qp = QueuePair::create_ud(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    /// let qp = qp.into_init(&UdOptions { qkey: 0x1111, pkey_index: 0 }).unwrap();
    /// let qp = qp.into_rtr().unwrap().into_rts().unwrap();
    /// assert_eq!(qp.state().unwrap(), QpState::ReadyToSend);
    /// # }
    /// ```
    pub fn create_ud(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        send_cq: &CompletionQueue<P>,
        recv_cq: &CompletionQueue<P>,
        config: &QpConfig,
    ) -> Result<Self, Error<P::Error>> {
        Self::create_of(ctx, pd, send_cq, recv_cq, None, config)
    }

    /// RESET → INIT: its port (from the [`QpConfig`]), partition and Q_Key.
    pub fn into_init(
        self,
        opts: &UdOptions,
    ) -> Result<QueuePair<P, Init, Ud>, TransitionError<P, Reset, Ud>> {
        let attr = UdInitAttr {
            port: self.port,
            pkey_index: opts.pkey_index,
            qkey: opts.qkey,
        };
        self.transition(Ok(Transition::InitUd(attr)))
    }
}

impl<P: Provider> QueuePair<P, Init, Ud> {
    /// INIT → RTR: no peer (each datagram names its own).
    pub fn into_rtr(
        self,
    ) -> Result<QueuePair<P, ReadyToReceive, Ud>, TransitionError<P, Init, Ud>> {
        self.transition(Ok(Transition::RtrUd))
    }
}

impl<P: Provider> QueuePair<P, ReadyToReceive, Ud> {
    /// RTR → RTS, its first PSN the endpoint's.
    pub fn into_rts(
        self,
    ) -> Result<QueuePair<P, ReadyToSend, Ud>, TransitionError<P, ReadyToReceive, Ud>> {
        let sq_psn = self.local.psn;
        self.transition(Ok(Transition::RtsUd { sq_psn }))
    }
}

/// An address handle (`ibv_ah`): where the datagrams that name its [key](Self::key) go.
///
/// ```
/// # #[cfg(feature = "sim")] {
/// use zverbs::provider::sim::Sim;
/// use zverbs::qp::{AddressHandle, QpConfig, QueuePair, UdOptions};
/// use zverbs::{AhAttr, CompletionQueue, Context, RecvWr, SendFlags, SendOp, SendWr, UdDest};
/// use zverbs::WorkCompletion;
/// let sim = Sim::with_devices(2);
/// let opts = UdOptions { qkey: 0x11, pkey_index: 0 };
/// let side = |dev| {
///     let ctx = Context::open(&sim, dev).unwrap();
///     let pd = ctx.alloc_pd().unwrap();
///     let cq = CompletionQueue::create(&ctx, 8).unwrap();
///     let qp = QueuePair::create_ud(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
///     let qp = qp.into_init(&opts).unwrap().into_rtr().unwrap().into_rts().unwrap();
///     (pd, cq, qp)
/// };
/// let ((pa, _ca, qa), (pb, cb, qb)) = (side("sim0"), side("sim1"));
/// let to = qb.endpoint();
/// let ah = AddressHandle::create(&pa, &AhAttr::new(1, to.gid, 0, to.lid)).unwrap();
/// let (mut msg, mut inbox) = (*b"datagram", [0u8; 40 + 8]);
/// let msg = pa.register(&mut msg).unwrap();
/// let mut inbox = pb.register(&mut inbox).unwrap();
/// let mut recv = RecvWr::<1>::new(1);
/// (recv.sg_list[0], recv.num_sge) = (inbox.slice_mut(..).unwrap().sge(), 1);
/// let dest = UdDest { ah: ah.key(), remote_qpn: to.qp_num, remote_qkey: 0x11 };
/// let mut send = SendWr::<1>::new(2, SendOp::Datagram { dest, imm: None }, SendFlags::SIGNALED);
/// (send.sg_list[0], send.num_sge) = (msg.slice(..).unwrap().sge(), 1);
/// // SAFETY: both regions outlive the requests and are read only after their completions.
/// unsafe {
///     qb.post_recv(&[recv]).unwrap();
///     qa.post_send(&[send]).unwrap();
/// }
/// let mut wc = [WorkCompletion::EMPTY; 1];
/// assert_eq!(cb.poll(&mut wc).unwrap(), 1);
/// assert_eq!((wc[0].byte_len, wc[0].src_qp, wc[0].grh), (48, qa.qp_num(), true));
/// assert_eq!(&inbox.as_slice()[40..], b"datagram"); // after 40 bytes of header
/// # }
/// ```
pub struct AddressHandle<P: Provider> {
    raw: P::Ah,
}

impl<P: Provider> core::fmt::Debug for AddressHandle<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AddressHandle")
            .field("key", &self.key())
            .finish()
    }
}

/// Bytes of global route header at the start of every UD receive buffer.
pub const GRH_BYTES: usize = 40;

/// The sender's GID, from the global route header a UD receive starts with (when the
/// completion's `grh` says there is one): the IPv6 source address, or for RoCE v2 over
/// IPv4 (20 bytes, then the IPv4 header) the IPv4-mapped source address.
///
/// ```
/// # use zverbs::qp::{sender_gid, GRH_BYTES};
/// # use zverbs::Gid;
/// let mut grh = [0u8; GRH_BYTES];
/// grh[20] = 0x45; // an IPv4 header, from 10.0.0.1
/// grh[32..36].copy_from_slice(&[10, 0, 0, 1]);
/// let v4 = std::net::Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets();
/// assert_eq!(sender_gid(&grh), Gid(v4));
/// ```
pub fn sender_gid(grh: &[u8; GRH_BYTES]) -> Gid {
    header_gids(grh).0
}

/// The source and destination GIDs a global route header names.
fn header_gids(grh: &[u8; GRH_BYTES]) -> (Gid, Gid) {
    let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
    if grh[20] >> 4 == 4 {
        src[10..12].copy_from_slice(&[0xff, 0xff]);
        dst[10..12].copy_from_slice(&[0xff, 0xff]);
        src[12..].copy_from_slice(&grh[32..36]);
        dst[12..].copy_from_slice(&grh[36..40]);
    } else {
        src.copy_from_slice(&grh[8..24]);
        dst.copy_from_slice(&grh[24..40]);
    }
    (Gid(src), Gid(dst))
}

/// The path back to the sender of a datagram received on `port` of `ctx`
/// (`ibv_init_ah_from_wc`): with its global route header (`grh`, when the completion's
/// `grh` says the receive starts with one), to the GID the header names as source, from
/// the local GID it was sent to; without one, to the sender's LID (`slid`). The service
/// level is the sender's (`sl`). With the sender's queue pair (`src_qp`, or what the
/// protocol says) and the Q_Key, it is where a reply goes.
///
/// # Errors
/// [`Error::InvalidAttribute`] when no GID of `port` is the header's destination; the
/// provider's error for the port or GID queries.
pub fn reply_path<P: Provider>(
    ctx: &Context<P>,
    port: u8,
    grh: Option<&[u8; GRH_BYTES]>,
    slid: u16,
    sl: u8,
) -> Result<AhAttr, Error<P::Error>> {
    let mut path = AhAttr::local(port, slid);
    path.sl = sl;
    let Some(grh) = grh else {
        return Ok(path);
    };
    let (them, us) = header_gids(grh);
    let table = u8::try_from(ctx.query_port(port)?.gid_table_len).unwrap_or(u8::MAX);
    // Entries a device cannot report (unpopulated ones, on some) are not it.
    let index = (0..table)
        .find(|&i| ctx.query_gid(port, i).is_ok_and(|g| g == us))
        .ok_or(Error::InvalidAttribute(
            "no local GID is the header's destination",
        ))?;
    let mut back = AhAttr::new(port, them, index, slid);
    back.sl = sl;
    back.hop_limit = 0xff;
    if grh[20] >> 4 == 4 {
        back.traffic_class = grh[21]; // the IPv4 header's type of service
    } else {
        let word = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        back.traffic_class = (word >> 20) as u8;
        back.flow_label = word & 0xf_ffff;
    }
    Ok(back)
}

impl<P: Provider> AddressHandle<P> {
    /// Creates an address handle in `pd` (`ibv_create_ah`): with a global route when
    /// `attr.dgid` is set (RoCE needs one), by LID alone otherwise (InfiniBand).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for an sl above 15, a flow label wider than 20 bits or
    /// a static rate past [`MAX_STATIC_RATE`](crate::types::MAX_STATIC_RATE); the
    /// provider's error ([`ErrorKind::InvalidArgument`](crate::ErrorKind)) for a port or
    /// GID index it does not have, or a handle without a global route on RoCE.
    pub fn create(pd: &ProtectionDomain<P>, attr: &AhAttr) -> Result<Self, Error<P::Error>> {
        check(attr.sl <= MAX_SL, "sl exceeds 15")
            .and(check(
                attr.flow_label <= MAX_FLOW_LABEL,
                "flow_label exceeds 20 bits",
            ))
            .and(check(
                attr.static_rate <= MAX_STATIC_RATE,
                "static_rate is not an ibv_rate",
            ))
            .map_err(Error::InvalidAttribute)?;
        let raw = verb("ibv_create_ah", P::create_ah(&pd.raw, attr))?;
        Ok(AddressHandle { raw })
    }

    /// What a datagram's [`UdDest`](crate::UdDest) names this handle by.
    pub fn key(&self) -> AhKey {
        P::ah_key(&self.raw)
    }
}
