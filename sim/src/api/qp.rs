//! The queue pair handle and its creation attributes.

use super::*;
use crate::counters::QpCounters;
use crate::hca::rq::SharedRq;
use crate::hca::{SendLane, QPN_BASE};

/// Attributes of a new queue pair (`ibv_qp_init_attr`; its type is the creating call's).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// Completion queue of send work requests.
    pub send_cq: &'a Cq,
    /// Completion queue of receive work requests.
    pub recv_cq: &'a Cq,
    /// Queue capacities.
    pub cap: QpCaps,
    /// Whether every send work request is signaled.
    pub sq_sig_all: bool,
}

impl Pd {
    /// Creates a reliable-connected queue pair in the RESET state.
    ///
    /// The capacities ([`QpCaps`]) must lie in `1..=`[`MAX_QP_WR`] work requests per queue,
    /// `1..=`[`MAX_SGE`] scatter/gather entries per request and `0..=`[`MAX_INLINE`] inline
    /// bytes.
    ///
    /// # Errors
    /// [`SimError::Invalid`] if a capacity is out of range or a CQ belongs to another
    /// device or fabric; [`SimError::QueueFull`] when out of QP numbers.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Qp, SimError> {
        self.create_qp_of(attr, QpType::Rc)
    }

    /// Creates an unreliable-datagram queue pair in the RESET state, with the same
    /// capacities as [`Pd::create_qp`]. It moves to INIT with [`Transition::InitUd`] (its
    /// Q_Key), then [`Transition::RtrUd`] and [`Transition::RtsUd`], and sends
    /// [`SendOp::Datagram`]s only, each to the queue pair its [`UdDest`] names through an
    /// address handle of this PD ([`Pd::create_ah`]).
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// let f = Fabric::with_devices(2);
    /// let (a, b) = (f.open_device("sim0").unwrap(), f.open_device("sim1").unwrap());
    /// let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    /// let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    /// let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    /// let ud = |pd: &Pd, cq: &Cq| {
    ///     let qp = pd.create_ud_qp(&QpInitAttr { send_cq: cq, recv_cq: cq, cap, sq_sig_all: true }).unwrap();
    ///     qp.modify(&Transition::InitUd(UdInitAttr { port: 1, pkey_index: 0, qkey: 0x1111 })).unwrap();
    ///     qp.modify(&Transition::RtrUd).unwrap();
    ///     qp.modify(&Transition::RtsUd { sq_psn: 0 }).unwrap();
    ///     qp
    /// };
    /// let (qa, qb) = (ud(&pa, &ca), ud(&pb, &cb));
    /// // B's receive buffer: 40 bytes of global route header, then the message.
    /// let mut buf = vec![0u8; 40 + 5];
    /// let mr = unsafe { pb.register_mr(buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    /// let sg_list = [Sge { addr: buf.as_ptr() as u64, length: 45, lkey: mr.lkey() }];
    /// qb.post_recv(&[RecvWr { wr_id: 7, sg_list, num_sge: 1 }]).unwrap();
    /// // A sends "hello" inline to B's queue pair, through an address handle to sim1.
    /// let dgid = b.query_gid(1, 0).unwrap();
    /// let ah = pa.create_ah(&AhAttr::new(1, dgid, 0, 0)).unwrap();
    /// let msg = *b"hello";
    /// let dest = UdDest { ah: ah.key(), remote_qpn: qb.qp_num(), remote_qkey: 0x1111 };
    /// let sg_list = [Sge { addr: msg.as_ptr() as u64, length: 5, lkey: 0 }];
    /// let wr = SendWr { wr_id: 1, sg_list, num_sge: 1, op: SendOp::Datagram { dest, imm: None },
    ///     flags: SendFlags::INLINE };
    /// // SAFETY: `msg` is readable for the call.
    /// unsafe { qa.post_send_raw(&[wr]) }.unwrap();
    /// let mut wc = [WorkCompletion::EMPTY; 1];
    /// assert_eq!(cb.poll(&mut wc).unwrap(), 1);
    /// assert_eq!((wc[0].byte_len, wc[0].src_qp, wc[0].grh), (45, qa.qp_num(), true));
    /// drop(mr);
    /// assert_eq!(&buf[40..], b"hello");
    /// ```
    ///
    /// # Errors
    /// As [`Pd::create_qp`].
    pub fn create_ud_qp(&self, attr: &QpInitAttr<'_>) -> Result<Qp, SimError> {
        self.create_qp_of(attr, QpType::Ud)
    }

    fn create_qp_of(&self, attr: &QpInitAttr<'_>, ty: QpType) -> Result<Qp, SimError> {
        self.create_qp_on(attr, ty, None)
    }

    /// A queue pair of transport `ty`, on the SRQ in slot `srq` if one is given.
    pub(super) fn create_qp_on(
        &self,
        attr: &QpInitAttr<'_>,
        ty: QpType,
        srq: Option<usize>,
    ) -> Result<Qp, SimError> {
        let same = |cq: &Cq| Arc::ptr_eq(&cq.world, &self.world);
        if !same(attr.send_cq) || !same(attr.recv_cq) {
            return Err(SimError::Invalid("CQ of another fabric"));
        }
        let cqs = (attr.send_cq.id, attr.recv_cq.id);
        let (cap, sig_all) = (attr.cap, attr.sq_sig_all);
        let (qpn, rq, lane) = enter(&self.world).create_qp(self.id, cqs, cap, sig_all, ty, srq)?;
        Ok(Qp {
            world: self.world.clone(),
            qpn,
            ty,
            rq,
            lane,
        })
    }

    /// Creates an address handle (`ibv_create_ah`): datagrams sent with its
    /// [`key`](Ah::key) go to the device holding `attr.dgid` (or nowhere, if no device
    /// does: they are lost on the wire, as unroutable packets are).
    ///
    /// # Errors
    /// [`SimError::Invalid`] for a port other than 1, an sgid_index other than 0 or 1, an
    /// sl above 15 or a flow label wider than 20 bits.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah, SimError> {
        let mut w = enter(&self.world);
        let personality = w.net.cfg.personality;
        let key = w.tables.create_ah(self.id, attr, personality)?;
        Ok(Ah {
            world: self.world.clone(),
            key,
        })
    }
}

/// An address handle (`ibv_ah`); dropping it destroys it. A datagram posted with its key
/// after that is refused.
#[derive(Debug)]
pub struct Ah {
    world: Shared,
    key: AhKey,
}

impl Ah {
    /// What a datagram's [`UdDest`] names it by.
    pub fn key(&self) -> AhKey {
        self.key
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        enter(&self.world).tables.destroy_ah(self.key);
    }
}

/// A reliable-connected queue pair (`ibv_qp`); dropping it destroys it, discarding
/// outstanding work without completions.
#[derive(Debug)]
pub struct Qp {
    // A handle: what the world keeps of the queue pair (its capacities, say) is read
    // there, so that a handle stays small (a node of many peers holds two per peer).
    pub(super) world: Shared,
    /// Its number, which names its slot in the world too (`QPN_BASE` + index).
    pub(super) qpn: u32,
    pub(super) ty: QpType,
    /// Its receive queue, which it posts to without the world's lock while it may
    /// (threaded mode: `hca/rq.rs`).
    pub(super) rq: Option<std::sync::Arc<SharedRq>>,
    /// Its send lane, on which the untimed fabric's direct path runs without the world
    /// held exclusively (threaded mode, RC: `gate.rs`, `hca/direct.rs`).
    pub(super) lane: Option<std::sync::Arc<SendLane>>,
}

impl Qp {
    /// Its slot in the world's table.
    #[inline]
    fn id(&self) -> usize {
        (self.qpn - QPN_BASE) as usize
    }

    /// The queue pair number, unique in the fabric.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        enter(&self.world)
            .tables
            .qps
            .get(self.id())
            .expect("live QP")
            .state
    }

    /// Its transport.
    pub fn qp_type(&self) -> QpType {
        self.ty
    }

    /// Capacities granted (exactly those asked).
    pub fn cap(&self) -> QpCaps {
        enter(&self.world)
            .tables
            .qps
            .get(self.id())
            .expect("live QP")
            .cap()
    }

    /// What the queue pair did so far: doorbells, posts, send completions (see
    /// [`QpCounters`]).
    pub fn counters(&self) -> QpCounters {
        enter(&self.world)
            .tables
            .qps
            .get(self.id())
            .map(|qp| qp.rq.counted(*qp.counters))
            .expect("live QP")
    }

    /// The queue pair's attributes (`ibv_query_qp`): the state, the attributes of the RTR
    /// and RTS transitions as applied, and the PSNs in use now.
    pub fn query(&self) -> QpAttr {
        let w = enter(&self.world);
        let qp = w.tables.qps.get(self.id()).expect("live QP");
        QpAttr {
            state: qp.state,
            rtr: qp.rtr,
            rts: qp.rts,
            sq_psn: qp.req.next_psn,
            rq_psn: qp.resp.epsn,
        }
    }

    /// Moves the queue pair to another state (see [`Transition`] for the legal transitions).
    ///
    /// The simulated device has port 1 only, P_Key index 0 and two GIDs (indexes 0 and 1);
    /// its active MTU is 4096, so any path MTU fits.
    ///
    /// # Errors
    /// [`SimError::Invalid`] for an illegal transition or attribute; the state is unchanged.
    pub fn modify(&self, m: &Transition) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        let res = w.modify(self.id(), m);
        w.run_due();
        res
    }

    /// Posts send work requests in order, read where they lie; each goes on the wire at
    /// once. INLINE entries are copied now; their SGEs must lie in memory registered in
    /// this QP's PD (their lkeys are not checked). See [`Qp::post_send_raw`] for inline
    /// data from unregistered memory.
    ///
    /// In ERR the requests are accepted and complete at once with `WrFlushErr`.
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// # let f = Fabric::with_devices(1);
    /// # let ctx = f.open_device("sim0").unwrap();
    /// # let pd = ctx.alloc_pd().unwrap();
    /// # let cq = ctx.create_cq(8).unwrap();
    /// # let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    /// # let qp = pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false }).unwrap();
    /// let wr = SendWr::<1>::new(1, SendOp::Send, SendFlags::SIGNALED);
    /// // In RESET a post is refused; the error names request 0.
    /// assert_eq!(qp.post_send(&[wr, wr]).unwrap_err().index, 0);
    /// ```
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] outside RTS/ERR or once
    /// the device crashed, for too many SGEs (more than `max_send_sge`, or than the
    /// request holds), or for bad inline data; [`SimError::QueueFull`] when all
    /// `max_send_wr` slots are held (an unsignaled request holds its slot until a later one
    /// completes with a completion).
    pub fn post_send<const SGES: usize>(
        &self,
        wrs: &[SendWr<SGES>],
    ) -> Result<(), PostError<SimError>> {
        self.post_sends(wrs, None)
    }

    /// Like [`Qp::post_send`], but INLINE SGEs are read straight from their addresses, as
    /// a real driver does, and need not be registered.
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// For every request with [`SendFlags::INLINE`], each SGE's `addr..addr + length` must
    /// be valid for reads during this call.
    pub unsafe fn post_send_raw<const SGES: usize>(
        &self,
        wrs: &[SendWr<SGES>],
    ) -> Result<(), PostError<SimError>> {
        // SAFETY: the caller vouches for the inline SGE ranges, which are read only inside
        // this call.
        let raw = unsafe { RawInline::new() };
        self.post_sends(wrs, Some(&raw))
    }

    /// The intake of every send post. On the queue pair's send lane, beside the other
    /// lanes (`hca/direct.rs`), when the lane is to be had and the direct path takes the
    /// list; otherwise, or for what the direct path leaves, with the world held
    /// exclusively (`World::post_sends`).
    fn post_sends<const SGES: usize>(
        &self,
        wrs: &[SendWr<SGES>],
        raw: Option<&RawInline>,
    ) -> Result<(), PostError<SimError>> {
        let on_lane = self.lane.as_ref().and_then(|l| {
            let w = self.world.lane(&l.flag, self.id())?;
            w.post_direct(self.id(), wrs)
        });
        let res = match on_lane {
            Some(taken) if taken.done == taken.admitted => taken.res,
            taken => {
                let mut w = enter(&self.world);
                let res = match taken {
                    Some(taken) => w.post_queued(self.id(), taken, wrs, raw),
                    None => w.post_sends(self.id(), wrs, raw),
                };
                w.run_due();
                res
            }
        };
        res.map_err(|(index, error)| PostError { index, error })
    }

    /// Posts receive work requests in order, read where they lie.
    ///
    /// In ERR the requests are accepted and complete at once with `WrFlushErr`.
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// # let f = Fabric::with_devices(1);
    /// # let ctx = f.open_device("sim0").unwrap();
    /// # let pd = ctx.alloc_pd().unwrap();
    /// # let cq = ctx.create_cq(8).unwrap();
    /// # let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    /// # let qp = pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false }).unwrap();
    /// // In RESET a receive is refused; the error names request 0.
    /// let res = qp.post_recv(&[RecvWr::<1>::new(7)]);
    /// assert_eq!(res.unwrap_err().index, 0);
    /// ```
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] in RESET or for too many
    /// SGEs (more than `max_recv_sge`, or than the request holds); [`SimError::QueueFull`]
    /// when `max_recv_wr` requests are queued.
    pub fn post_recv<const SGES: usize>(
        &self,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<SimError>> {
        let id = self.id();
        post_receives(&self.world, self.rq.as_deref(), wrs, |w| {
            w.post_recvs(id, wrs)
        })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        enter(&self.world).destroy_qp(self.id());
    }
}

/// Posts receives `wrs` to `fast` without the world's lock if it is open (`hca/rq.rs`), else
/// through the world with `post`, running the events then due.
pub(super) fn post_receives<const SGES: usize>(
    world: &Shared,
    fast: Option<&SharedRq>,
    wrs: &[RecvWr<SGES>],
    post: impl FnOnce(&mut World) -> Result<(), (usize, SimError)>,
) -> Result<(), PostError<SimError>> {
    let res = match fast.and_then(|q| q.post(wrs)) {
        Some(res) => res,
        None => {
            let mut w = enter(world);
            let res = post(&mut w);
            w.run_due();
            res
        }
    };
    res.map_err(|(index, error)| PostError { index, error })
}
