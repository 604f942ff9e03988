//! The queue pair handle, its creation attributes and its posting error.

use super::*;
use crate::counters::QpCounters;
use crate::hca::rq::SharedRq;
use crate::hca::Scratch;
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
    /// let mut sg_list = [Sge::default(); MAX_SGE];
    /// sg_list[0] = Sge { addr: buf.as_ptr() as u64, length: 45, lkey: mr.lkey() };
    /// qb.post_recv([RecvWr { wr_id: 7, sg_list, num_sge: 1 }]).unwrap();
    /// // A sends "hello" inline to B's queue pair, through an address handle to sim1.
    /// let dgid = b.query_gid(1, 0).unwrap();
    /// let ah = pa.create_ah(&AhAttr::new(1, dgid, 0, 0)).unwrap();
    /// let msg = *b"hello";
    /// let dest = UdDest { ah: ah.key(), remote_qpn: qb.qp_num(), remote_qkey: 0x1111 };
    /// sg_list[0] = Sge { addr: msg.as_ptr() as u64, length: 5, lkey: 0 };
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
        let same = |cq: &Cq| Arc::ptr_eq(&cq.world, &self.world);
        if !same(attr.send_cq) || !same(attr.recv_cq) {
            return Err(SimError::Invalid("CQ of another fabric"));
        }
        let cqs = (attr.send_cq.id, attr.recv_cq.id);
        let (qpn, rq, lane) =
            enter(&self.world).create_qp(self.id, cqs, attr.cap, attr.sq_sig_all, ty)?;
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
        let key = enter(&self.world).tables.create_ah(self.id, attr)?;
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

/// A synchronous posting error (`bad_wr` plus `errno`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Position of the first work request NOT posted; the earlier ones were posted.
    pub index: usize,
    /// Why it was refused.
    pub error: SimError,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} not posted: {}", self.index, self.error)
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
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

    /// Posts send work requests in order; each goes on the wire at once. INLINE entries are copied
    /// now; their SGEs must lie in memory registered in this QP's PD (their lkeys are not
    /// checked). See [`Qp::post_send_raw`] for inline data from unregistered memory.
    ///
    /// In ERR the requests are accepted and complete at once with `WrFlushErr`.
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] outside RTS/ERR or once
    /// the device crashed, for too
    /// many SGEs, or for bad inline data; [`SimError::QueueFull`] when all `max_send_wr`
    /// slots are held (an unsignaled request holds its slot until a later one completes
    /// with a completion).
    pub fn post_send<I: IntoIterator<Item = SendWr>>(&self, wrs: I) -> Result<(), PostError> {
        self.post_sends(wrs, None)
    }

    fn post_sends<I: IntoIterator<Item = SendWr>>(
        &self,
        wrs: I,
        raw: Option<&RawInline>,
    ) -> Result<(), PostError> {
        let mut wrs = wrs.into_iter();
        // A request alone may run on the lane (a list needs each request twice: posted
        // through `post_send_raw`, it is read where it lies).
        let first = wrs.next();
        let second = first.and_then(|_| wrs.next());
        if let (Some(wr), None) = (first, second) {
            if let Some(res) = self.post_on_lane(core::slice::from_ref(&wr), raw) {
                return res.map_err(|(index, error)| PostError { index, error });
            }
        }
        let mut wrs = first.into_iter().chain(second).chain(wrs);
        let next = |slot: &mut SendWr| wrs.next().map(|wr| *slot = wr).is_some();
        self.post_send_list(next, raw)
    }

    /// Posts the send requests `wrs` on the queue pair's lane, beside the other lanes
    /// (`hca/direct.rs`); `None`, having posted nothing, when the lane is not to be had
    /// or its direct path declines the list (the caller then posts it with the world held
    /// exclusively).
    fn post_on_lane(
        &self,
        wrs: &[impl SendRequest],
        raw: Option<&RawInline>,
    ) -> Option<Result<(), (usize, SimError)>> {
        let l = self.lane.as_ref()?;
        let w = self.world.lane(&l.flag, self.id())?;
        let taken = w.post_direct(self.id(), wrs)?;
        if taken.done == taken.admitted {
            return Some(taken.res);
        }
        drop(w);
        let mut w = enter(&self.world);
        let res = w.post_rest(self.id(), taken, wrs, raw);
        w.run_due();
        Some(res)
    }

    /// Like [`Qp::post_send`], but the requests are read where they lie (any
    /// [`SendRequest`]: an adapter's own request type posts without a copy of each
    /// request), and INLINE SGEs are read straight from their addresses, as a real driver
    /// does, and need not be registered.
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// # let f = Fabric::with_devices(1);
    /// # let ctx = f.open_device("sim0").unwrap();
    /// # let pd = ctx.alloc_pd().unwrap();
    /// # let cq = ctx.create_cq(8).unwrap();
    /// # let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    /// # let qp = pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false }).unwrap();
    /// let wr = SendWr { wr_id: 1, sg_list: [Sge::default(); MAX_SGE], num_sge: 0, op: SendOp::Send, flags: SendFlags::SIGNALED };
    /// // In RESET a post is refused; the error names request 0.
    /// let res = unsafe { qp.post_send_raw(&[wr, wr]) };
    /// assert_eq!(res.unwrap_err().index, 0);
    /// ```
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// For every request with [`SendFlags::INLINE`], each SGE's `addr..addr + length` must
    /// be valid for reads during this call.
    pub unsafe fn post_send_raw(&self, wrs: &[impl SendRequest]) -> Result<(), PostError> {
        // SAFETY: the caller vouches for the inline SGE ranges, which are read only inside
        // this call.
        let raw = unsafe { RawInline::new() };
        let res = match self.post_on_lane(wrs, Some(&raw)) {
            Some(res) => res,
            None => {
                let mut w = enter(&self.world);
                let res = w.post_send_slice(self.id(), wrs, Some(&raw));
                w.run_due();
                res
            }
        };
        res.map_err(|(index, error)| PostError { index, error })
    }

    fn post_send_list(
        &self,
        next: impl FnMut(&mut SendWr) -> bool,
        raw: Option<&RawInline>,
    ) -> Result<(), PostError> {
        let mut w = enter(&self.world);
        let res = w.post_send_list(self.id(), next, raw);
        w.run_due();
        res.map_err(|(index, error)| PostError { index, error })
    }

    /// Posts receive work requests in order.
    ///
    /// In ERR the requests are accepted and complete at once with `WrFlushErr`.
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] in RESET or for too many
    /// SGEs; [`SimError::QueueFull`] when `max_recv_wr` requests are queued.
    pub fn post_recv<I: IntoIterator<Item = RecvWr>>(&self, wrs: I) -> Result<(), PostError> {
        let mut wrs = wrs.into_iter();
        self.post_recv_list(|slot| wrs.next().map(|wr| *slot = wr).is_some())
    }

    /// Posts receive work requests built in place: `fill(i, wr)` writes request `i` (of
    /// `n`) into a scratch request whose scatter entries past the `num_sge` it sets are
    /// left over from earlier requests (only the first `num_sge` are read).
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
    /// let res = qp.post_recv_with(3, |i, wr| (wr.wr_id, wr.num_sge) = (i as u64, 0));
    /// assert_eq!(res.unwrap_err().index, 0);
    /// ```
    ///
    /// # Errors
    /// As [`Qp::post_recv`].
    pub fn post_recv_with(
        &self,
        n: usize,
        mut fill: impl FnMut(usize, &mut RecvWr),
    ) -> Result<(), PostError> {
        let mut i = 0;
        self.post_recv_list(|slot| {
            let more = i < n;
            if more {
                fill(i, slot);
                i += 1;
            }
            more
        })
    }

    fn post_recv_list(&self, mut next: impl FnMut(&mut RecvWr) -> bool) -> Result<(), PostError> {
        if let Some(done) = self.rq.as_ref().and_then(|rq| rq.post(&mut next)) {
            return done.map_err(|r| PostError {
                index: r.index,
                error: r.error,
            });
        }
        let mut w = enter(&self.world);
        // Built in the world's scratch request (see `World::scratch`).
        let mut scratch = w.scratch.take().unwrap_or_else(Scratch::new);
        let wr = &mut scratch.recv;
        let mut res = Ok(());
        let mut posted = 0;
        for index in 0.. {
            if !next(wr) {
                break;
            }
            if let Err(error) = w.post_recv(self.id(), wr) {
                res = Err(PostError { index, error });
                break;
            }
            posted += 1;
        }
        w.scratch = Some(scratch);
        w.count_posts(self.id(), false, posted);
        w.run_due();
        res
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        enter(&self.world).destroy_qp(self.id());
    }
}
