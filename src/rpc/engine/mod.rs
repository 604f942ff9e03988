//! [`Rpc`]: the protocol core ([`RpcCore`]) driven over one unreliable-datagram queue
//! pair, with request handlers by type.
//!
//! One `Rpc` per thread, as in eRPC: it owns a UD queue pair, one completion queue, a
//! registered pool holding a ring of receive slots (40 bytes of global route header plus
//! one [`mtu`](Config::mtu) each) and a ring of send slots, and the address handles of its
//! peers. [`run_event_loop_once`](Rpc::run_event_loop_once) does one pass:
//!
//! 1. polls the completion queue: each received datagram goes to the core
//!    ([`RpcCore::handle_packet`]), named by its sender (the GID in its global route
//!    header and its source QPN); send completions free send slots;
//! 2. reposts the receives it consumed as one chain (one doorbell);
//! 3. fires the core's timers;
//! 4. serves requests (the handler registered for the type writes the response) and hands
//!    everything else (responses, failures, session events) to the caller's closure as a
//!    [`Notice`];
//! 5. writes every datagram the core has to send straight into send slots and posts them
//!    as one chain: one doorbell per pass, and a chain's last request signaled only once
//!    half the ring of send slots went unsignaled (its completion frees every slot before
//!    it, since a send queue completes in order; eRPC's selective signaling).
//!
//! A pass that receives nothing, after no new request or session from the caller, has
//! nothing to send but what a timer resends: it polls the completion queue and returns,
//! and only every 32nd such pass reads the clock (the invariant TSC where there is one)
//! and looks at the core's timers, milliseconds apart.
//!
//! After [`Rpc::new`] nothing allocates: requests and responses live in the core's arena,
//! datagrams in the pool's slots, and the handlers and peers were set up before.
//!
//! A sender the engine does not know is accepted only with a connect request (a peer's
//! address handle is made then, up to [`max_sessions`](Config::max_sessions) peers);
//! anything else from a stranger is counted ([`EngineStats::unknown_sender`]) and dropped.
//! A peer's handle is released once no session names it and its last datagram has left
//! (a refused connect's peer right after the refusal), so peers that come and go do not
//! fill the table. Session packets are always signaled; a peer whose session ended
//! without one (an idle client dropped) waits for the next signaled send.
//!
//! Map (one file: the event loop's steps share the engine's rings and counters): [`Rpc`]
//! and its API (`new`, sessions, handlers, `enqueue_request`, `run_event_loop*`); the peer
//! table (`peer`); the loop's steps in order: `post_receives`, `receive` (completions to
//! the core), `dispatch` (events to handlers), `transmit` (the core's datagrams, one
//! doorbell). Settings and errors are in `config.rs`, the bulk path's hooks in `large.rs`.

use std::time::{Duration, Instant};

use super::bulk::{Bulk, Kind, CONNECT, REQUEST};
use super::clock::Clock;
use super::header::{Header, PktType};
use super::peers::Peers;
use super::{Event, RequestHandle, RpcCore, SessionId};
use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::{within, Error};
use crate::event::CompletionChannel;
use crate::pool::{LocalBuf, MrPool};
use crate::provider::{AhAttr, Provider};
use crate::qp::{sender_gid, UdOptions, GRH_BYTES};
use crate::qp::{AddressHandle, Endpoint, QueuePair, ReadyToSend, Ud};
use crate::types::WorkCompletion;
use crate::types::{Gid, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus};
use crate::wr_id::RpcId;

/// Bytes of global route header at the start of every UD receive.
const GRH: usize = GRH_BYTES;
/// Receives reposted at once (eRPC's `kRecvSlack`).
const REPOST: usize = 32;
/// Send requests per doorbell at most.
const CHAIN: usize = 16;
/// Completions taken per poll.
const POLL: usize = 32;
/// Idle passes between two looks at the timers (a few microseconds of spinning; the
/// retransmission timeout is milliseconds).
const TIMER_PASSES: u32 = 32;

mod config;
mod large;

pub use config::{EngineConfig, EngineError, EngineStats, Handler, MsgBuf, Notice};

/// One thread's RPC endpoint over a UD queue pair: it owns the queue pair, its completion
/// queue, registered rings of receive and send slots, and its peers' address handles; each
/// [`run_event_loop_once`](Self::run_event_loop_once) polls, reposts, fires timers, serves
/// requests, reports the rest and sends what is due with one doorbell.
///
/// ```
/// # #[cfg(feature = "sim")] {
/// use zverbs::provider::sim::Sim;
/// use zverbs::rpc::{EngineConfig, Event, Notice, Rpc};
/// use zverbs::Context;
/// let sim = Sim::with_devices(2);
/// let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
/// let mut server = Rpc::new(&cb, cb.alloc_pd().unwrap(), EngineConfig::default()).unwrap();
/// server.register_handler(1, |req, resp| {
///     resp[..req.len()].copy_from_slice(req);
///     req.len()
/// }).unwrap();
/// let mut client = Rpc::new(&ca, ca.alloc_pd().unwrap(), EngineConfig::default()).unwrap();
/// let session = client.create_session(&server.addr()).unwrap();
/// let (mut sent, mut answer) = (false, None);
/// while answer.is_none() {
///     server.run_event_loop_once(&mut |_| {}).unwrap();
///     let mut connected = false;
///     client
///         .run_event_loop_once(&mut |n| match n {
///             Notice::Session(Event::Connected(_)) => connected = true,
///             Notice::Response { tag, bytes, .. } => answer = Some((tag, bytes.to_vec())),
///             _ => {}
///         })
///         .unwrap();
///     if connected && !sent {
///         client.enqueue_request(session, 1, b"ping", 7).unwrap(); // 7: our tag
///         sent = true;
///     }
/// }
/// assert_eq!(answer, Some((7, b"ping".to_vec())));
/// # }
/// ```
pub struct Rpc<P: Provider> {
    core: RpcCore,
    handlers: Vec<Option<Handler>>,
    /// The tag of each client slot (`session × window + slot`).
    tags: Vec<u64>,
    peers: Peers<P>,
    /// Before the queues: its queue pairs are on `cq`.
    bulk: Option<Box<Bulk<P>>>,
    qp: QueuePair<P, ReadyToSend, Ud>,
    cq: CompletionQueue<P>,
    /// After the queue: its events' channel, when asked for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    events: Option<CompletionChannel<P>>,
    rx: LocalBuf<P>,
    tx: LocalBuf<P>,
    /// Receive slots consumed, to repost.
    repost: Vec<u64>,
    /// Where polls, reposts and sends are built: kept, so a pass initialises no array.
    wcs: [WorkCompletion; POLL],
    recv_chain: [RecvWr<1>; REPOST],
    send_chain: [SendWr<1>; CHAIN],
    /// Something the caller did (a request, a session) may have given the core packets
    /// to send; the next pass runs whole.
    dirty: bool,
    /// Passes in a row that had nothing to do.
    idle: u32,
    /// Sends posted and sends completed (slot = seq mod `send_slots`).
    tx_next: u64,
    tx_done: u64,
    /// One past the last signaled send: at most half the ring goes unsignaled.
    tx_signaled: u64,
    /// `tx_next % send_slots`, kept so that a pass divides nothing.
    tx_slot: usize,
    stride: usize,
    cfg: EngineConfig,
    clock: Clock,
    stats: EngineStats,
    _pool: MrPool<P>,
    /// Last: everything above was made in it.
    pd: ProtectionDomain<P>,
}

impl<P: Provider> Rpc<P> {
    /// Creates the queue pair (in RTS), the completion queue and the pool in `pd`, which
    /// the engine keeps (its peers' address handles are made in it), and posts every
    /// receive.
    pub fn new(
        ctx: &Context<P>,
        pd: ProtectionDomain<P>,
        mut cfg: EngineConfig,
    ) -> Result<Self, EngineError<P::Error>> {
        let ok = |n: usize| (1..=1 << 14).contains(&n);
        if !ok(cfg.recv_slots) || !ok(cfg.send_slots) {
            return Err(EngineError::InvalidConfig(
                "recv_slots and send_slots: 1..=16384",
            ));
        }
        let core = RpcCore::new(cfg.core.clone())?;
        let mtu = cfg.core.mtu;
        // A datagram longer than the port's active MTU is dropped by the device: refuse
        // the configuration here rather than time out on the first full datagram.
        let port_mtu = ctx.query_port(cfg.qp.port)?.active_mtu.bytes();
        within("core.mtu", mtu as u64, port_mtu.into()).map_err(EngineError::Device)?;
        // Slots 64-byte aligned, as the pool's blocks are.
        let stride = (GRH + mtu).next_multiple_of(64);
        let tx_stride = mtu.next_multiple_of(64);
        let (rx_len, tx_len) = (stride * cfg.recv_slots, tx_stride * cfg.send_slots);
        // Buddy blocks: each ring takes a power of two; twice the larger holds both.
        let block = rx_len.next_power_of_two().max(tx_len.next_power_of_two());
        let pool = MrPool::new(&pd, 2 * block)?;
        let alloc = |n| {
            pool.alloc(n)
                .map_err(|_| EngineError::InvalidConfig("rings larger than a pool can hold"))
        };
        let (rx, tx) = (alloc(rx_len)?, alloc(tx_len)?);
        let reads = cfg
            .bulk
            .as_ref()
            .map_or(0, |_| Bulk::<P>::cq_entries(&cfg.core));
        let depth = u32::try_from(cfg.recv_slots + cfg.send_slots + reads).unwrap_or(u32::MAX);
        let events = cfg
            .events
            .then(|| CompletionChannel::create(ctx))
            .transpose()?;
        let cq = match &events {
            Some(ch) => CompletionQueue::create_on(ctx, depth, ch)?,
            None => CompletionQueue::create(ctx, depth)?,
        };
        let caps = &mut cfg.qp.caps;
        (caps.max_send_wr, caps.max_recv_wr) = (cfg.send_slots as u32, cfg.recv_slots as u32);
        (caps.max_send_sge, caps.max_recv_sge) = (1, 1);
        let qp = QueuePair::create_ud(ctx, &pd, &cq, &cq, &cfg.qp)?;
        let opts = UdOptions {
            qkey: cfg.qkey,
            pkey_index: 0,
        };
        let qp = qp.into_init(&opts).map_err(|e| e.error)?;
        let qp = qp
            .into_rtr()
            .map_err(|e| e.error)?
            .into_rts()
            .map_err(|e| e.error)?;
        let bulk = match &cfg.bulk {
            Some(b) => Some(Box::new(Bulk::new(ctx, &pd, &cq, &cfg.qp, &cfg.core, b)?)),
            None => None,
        };
        let sessions = cfg.core.max_sessions;
        let mut rpc = Rpc {
            handlers: (0..256).map(|_| None).collect(),
            tags: vec![0; sessions * cfg.core.window],
            peers: Peers::new(sessions, sessions),
            bulk,
            qp,
            cq,
            events,
            rx,
            tx,
            repost: (0..cfg.recv_slots as u64).collect(),
            wcs: [WorkCompletion::EMPTY; POLL],
            recv_chain: [RecvWr::new(0); REPOST],
            send_chain: [SendWr::new(0, SendOp::Send, SendFlags::empty()); CHAIN],
            dirty: false,
            idle: 0,
            tx_next: 0,
            tx_done: 0,
            tx_signaled: 0,
            tx_slot: 0,
            stride,
            clock: Clock::new(),
            stats: EngineStats::default(),
            core,
            cfg,
            _pool: pool,
            pd,
        };
        rpc.post_receives()?;
        Ok(rpc)
    }

    /// This endpoint's address, for peers' [`create_session`](Self::create_session).
    pub fn addr(&self) -> Endpoint {
        self.qp.endpoint()
    }

    /// The protocol core (its statistics, sessions).
    pub fn core(&self) -> &RpcCore {
        &self.core
    }

    /// What the engine counted.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Registers `handler` for requests of type `req_type`, replacing any before. The
    /// same handler serves small requests and large ones ([`Rpc::enqueue_bulk`]): it gets
    /// the request and a response buffer of the largest message of the path taken.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] for types `0xFE` and `0xFF`, the bulk path's own.
    pub fn register_handler(
        &mut self,
        req_type: u8,
        handler: impl FnMut(&[u8], &mut [u8]) -> usize + Send + 'static,
    ) -> Result<(), EngineError<P::Error>> {
        if req_type == CONNECT || req_type == REQUEST {
            return Err(EngineError::InvalidConfig(
                "request types 0xFE and 0xFF are reserved",
            ));
        }
        self.handlers[usize::from(req_type)] = Some(Box::new(handler));
        Ok(())
    }

    /// Opens a session to the `Rpc` at `remote`; [`Notice::Session`] tells when it is
    /// connected (or refused).
    pub fn create_session(
        &mut self,
        remote: &Endpoint,
    ) -> Result<SessionId, EngineError<P::Error>> {
        let peer = self.peer(remote.gid, remote.qp_num, remote.lid)?;
        self.dirty = true;
        let session = self.core.connect(peer)?;
        self.peers.attach(usize::from(session.index()), peer);
        Ok(session)
    }

    /// Closes `session` (its peer is told; [`Notice::Session`] reports the end).
    pub fn disconnect(&mut self, session: SessionId) -> Result<(), EngineError<P::Error>> {
        self.core.disconnect(session)?;
        self.dirty = true;
        Ok(())
    }

    /// Enqueues a request of `req_type` on `session`; its [`Notice::Response`] or
    /// [`Notice::Failed`] carries `tag`.
    pub fn enqueue_request(
        &mut self,
        session: SessionId,
        req_type: u8,
        req: &[u8],
        tag: u64,
    ) -> Result<RequestHandle, EngineError<P::Error>> {
        let h = self.core.enqueue_request(session, req_type, req)?;
        self.dirty = true;
        let i = self.tag_index(h);
        self.tags[i] = tag;
        Ok(h)
    }

    /// Runs passes until `timeout` passes, handing each notice to `notice`.
    pub fn run_event_loop(
        &mut self,
        timeout: Duration,
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Result<(), EngineError<P::Error>> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            self.run_event_loop_once(notice)?;
        }
        Ok(())
    }

    /// One pass (see the module docs); returns how many completions it took.
    pub fn run_event_loop_once(
        &mut self,
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Result<usize, EngineError<P::Error>> {
        let taken = self.cq.poll(&mut self.wcs)?;
        // A pass with nothing received and nothing new from the caller has nothing to
        // send but what a timer resends: it reads neither the clock nor the core, except
        // every `TIMER_PASSES`-th such pass, which looks at the timers.
        if taken == 0 && !self.dirty {
            self.idle += 1;
            if self.idle % TIMER_PASSES != 0 {
                return Ok(0);
            }
        }
        self.idle = 0;
        self.dirty = false;
        let now = self.now();
        self.receive(now, taken)?;
        self.post_receives()?;
        self.core.handle_timeout(now); // a comparison unless a timer is due
        self.dispatch(notice)?;
        self.transmit(now)?;
        Ok(taken)
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The next pass runs whole (reads the clock, fires due timers), idle or not.
    #[cfg(feature = "tokio")]
    pub(crate) fn wake(&mut self) {
        self.dirty = true;
    }

    /// When the core's next timer is due, from now; `None` if none is armed.
    #[cfg(feature = "tokio")]
    pub(crate) fn next_timeout(&self) -> Option<Duration> {
        let now = self.now();
        self.core
            .next_timeout()
            .map(|t| Duration::from_nanos(t.saturating_sub(now)))
    }

    /// The completion channel and its queue, with [`EngineConfig::events`].
    #[cfg(feature = "tokio")]
    pub(crate) fn events(&self) -> Option<(&CompletionChannel<P>, &CompletionQueue<P>)> {
        self.events.as_ref().map(|ch| (ch, &self.cq))
    }

    /// The core's slot of a request, where its tag is kept.
    fn tag_index(&self, h: RequestHandle) -> usize {
        self.core
            .slot_of(usize::from(h.session().index()), h.req_num())
    }

    /// The peer at (`gid`, `qpn`), made (with its address handle) if new; its id.
    fn peer(&mut self, gid: Gid, qpn: u32, lid: u16) -> Result<u64, EngineError<P::Error>> {
        if let Some(id) = self.peers.find(gid, qpn) {
            return Ok(id);
        }
        if self.peers.is_full() {
            return Err(EngineError::TooManyPeers);
        }
        let attr = AhAttr::new(self.qp.port(), gid, self.qp.gid_index(), lid);
        let ah = AddressHandle::create(&self.pd, &attr)?;
        self.peers
            .insert(gid, qpn, ah)
            .ok_or(EngineError::TooManyPeers)
    }

    /// How many peers the engine holds address handles for.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Posts the consumed receive slots again, in chains of [`REPOST`].
    fn post_receives(&mut self) -> Result<(), EngineError<P::Error>> {
        let (base, lkey, len) = (
            self.rx.addr(),
            self.rx.lkey(),
            (GRH + self.cfg.core.mtu) as u32,
        );
        for chunk in self.repost.chunks(REPOST) {
            let wrs = &mut self.recv_chain;
            for (wr, &slot) in wrs.iter_mut().zip(chunk) {
                wr.wr_id = RpcId::DatagramRecv(slot).encode();
                wr.sg_list[0] = Sge {
                    addr: base + slot * self.stride as u64,
                    length: len,
                    lkey,
                };
                wr.num_sge = 1;
            }
            // SAFETY: each slot lies in `rx`, which the engine owns and never reads while
            // the slot is posted (only after its completion, before it is posted again).
            unsafe { self.qp.post_recv(&self.recv_chain[..chunk.len()]) }.map_err(|e| {
                Error::Provider {
                    op: "ibv_post_recv",
                    source: e.error,
                }
            })?;
        }
        self.repost.clear();
        Ok(())
    }

    /// Takes the completions there are: datagrams to the core, send slots freed.
    fn receive(&mut self, now: u64, n: usize) -> Result<(), EngineError<P::Error>> {
        for i in 0..n {
            let wc = self.wcs[i];
            let slot = match RpcId::decode(wc.wr_id) {
                RpcId::DatagramRecv(slot) => slot,
                // The chain's signaled last request: every earlier one is done too.
                RpcId::DatagramSend(seq) => {
                    self.tx_done = seq + 1;
                    continue;
                }
                _ => {
                    if let Some(b) = &mut self.bulk {
                        b.completed(&wc); // a read or a release message
                    }
                    continue;
                }
            };
            self.repost.push(slot);
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                self.stats.recv_errors += 1;
                continue;
            }
            let slot = slot as usize * self.stride;
            let len = (wc.byte_len as usize).clamp(GRH, GRH + self.cfg.core.mtu);
            // SAFETY: the slot's receive completed and it is reposted only after this pass;
            // `slot + len` is within the ring (`len` clamped to one slot).
            let bytes = unsafe { self.rx.part(slot, len) };
            // `len >= GRH` (clamped): the header is always there.
            let Some((grh, msg)) = bytes.split_first_chunk::<GRH>() else {
                continue;
            };
            let gid = sender_gid(grh);
            let known = self.peers.find(gid, wc.src_qp);
            let from = match known {
                Some(i) => i,
                None => {
                    let connect =
                        Header::decode(msg).is_ok_and(|h| h.pkt_type == PktType::ConnectReq);
                    if !connect {
                        self.stats.unknown_sender += 1;
                        continue;
                    }
                    match self.peer(gid, wc.src_qp, 0) {
                        Ok(i) => i,
                        Err(EngineError::TooManyPeers) => {
                            self.stats.unknown_sender += 1;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            // SAFETY: the same completed slot as `bytes` above, not yet reposted; `len >= GRH`
            // (clamped) keeps the part inside it.
            let bytes = unsafe { self.rx.part(slot + GRH, len - GRH) };
            self.core.handle_packet(now, from, bytes);
        }
        Ok(())
    }

    /// Serves requests and hands the rest to `notice`.
    fn dispatch(
        &mut self,
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Result<(), EngineError<P::Error>> {
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::Request { handle, req_type } => {
                    if let Some(b) = &mut self.bulk {
                        if b.on_request(&mut self.core, handle, req_type, &self.tags, notice)? {
                            continue;
                        }
                    }
                    // The handler writes the response straight into the core's buffer.
                    match &mut self.handlers[usize::from(req_type)] {
                        Some(h) => self.core.respond_with(handle, |req, out| h(req, out))?,
                        None => {
                            self.stats.no_handler += 1;
                            self.core.respond_with(handle, |_, _| 0)?;
                        }
                    }
                }
                Event::Response { handle, .. } => {
                    let slot = self.tag_index(handle);
                    if let Some(b) = self.bulk.as_mut().filter(|b| b.kind(slot) != Kind::Plain) {
                        b.on_response(&mut self.core, handle, slot, &self.tags, notice)?;
                        continue;
                    }
                    notice(Notice::Response {
                        tag: self.tags[slot],
                        bytes: self.core.response(handle)?,
                        msg: None,
                    });
                    self.core.release(handle)?;
                }
                Event::Failed { handle, error } => {
                    let slot = self.tag_index(handle);
                    let i = usize::from(handle.session().index());
                    let msg = self.bulk.as_mut().and_then(|b| b.on_failed(i, slot));
                    notice(Notice::Failed {
                        tag: self.tags[slot],
                        error,
                        msg,
                    });
                }
                other => {
                    match other {
                        Event::Connected(session) => {
                            // With a bulk path, reported once its connection is set up.
                            if let Some(b) = &mut self.bulk {
                                if b.connect(&mut self.core, session, true) {
                                    continue;
                                }
                            }
                        }
                        Event::Accepted { session, from } => {
                            self.peers.attach(usize::from(session.index()), from);
                        }
                        Event::ConnectFailed { session, .. } | Event::Disconnected(session) => {
                            let i = usize::from(session.index());
                            if let Some(b) = &mut self.bulk {
                                b.reset(i, &mut self.core, &self.tags, notice);
                            }
                            self.peers.detach(i);
                        }
                        _ => {}
                    }
                    crate::trace::event!(info, event = ?other, "an RPC session changed");
                    notice(Notice::Session(other));
                }
            }
        }
        if let Some(b) = self.bulk.as_mut().filter(|b| b.has_work()) {
            let no_handler = &mut self.stats.no_handler;
            b.finish(
                &mut self.core,
                &mut self.handlers,
                &self.tags,
                no_handler,
                notice,
            )?;
        }
        Ok(())
    }

    /// Writes what the core has to send into free send slots, one chain per doorbell.
    fn transmit(&mut self, now: u64) -> Result<(), EngineError<P::Error>> {
        let slots = self.cfg.send_slots;
        let stride = self.cfg.core.mtu.next_multiple_of(64);
        let mut drained = false;
        while !drained {
            let mut n = 0;
            // The chain holds a session packet (connect, disconnect): its peer may be
            // released soon after, once the packet's send has completed.
            let mut session_pkt = false;
            while n < CHAIN && self.tx_next + (n as u64) - self.tx_done < slots as u64 {
                let seq = self.tx_next + n as u64;
                // `tx_slot + n < 2 * slots`: at most `slots` sends are in flight.
                let slot = self.tx_slot + n;
                let off = if slot >= slots { slot - slots } else { slot } * stride;
                // SAFETY: slot `seq` is free: its last send completed (`tx_done`), and no
                // other is posted from it; `off + mtu` is within the ring.
                let out = unsafe { self.tx.part_mut(off, self.cfg.core.mtu) };
                let Some(t) = self.core.poll_transmit(now, out) else {
                    drained = true;
                    break;
                };
                // Byte 2 of a header is its type; the session packets are 1..=4.
                session_pkt |= out[2] <= PktType::DisconnectResp as u8;
                let Some(peer) = self.peers.get(t.to) else {
                    continue; // a peer gone since (its slot's generation moved on)
                };
                let dest = UdDest {
                    ah: peer.ah.key(),
                    remote_qpn: peer.qpn,
                    remote_qkey: self.cfg.qkey,
                };
                self.peers.used(t.to, seq);
                let wr = &mut self.send_chain[n];
                wr.wr_id = RpcId::DatagramSend(seq).encode();
                (wr.op, wr.flags) = (SendOp::Datagram { dest, imm: None }, SendFlags::empty());
                wr.sg_list[0] = Sge {
                    addr: self.tx.addr() + off as u64,
                    length: t.len as u32,
                    lkey: self.tx.lkey(),
                };
                wr.num_sge = 1;
                n += 1;
            }
            if n == 0 {
                break;
            }
            // Selective signaling: a completion once half the ring went unsignaled (it
            // frees every slot before it: a send queue completes in order), and for a
            // session packet or while a departed peer waits for its last datagram.
            let end = self.tx_next + n as u64;
            let half = end - self.tx_signaled >= (slots as u64 / 2).max(1);
            if half || session_pkt || self.peers.pending() {
                self.send_chain[n - 1].flags = SendFlags::SIGNALED;
                self.tx_signaled = end;
                self.stats.signaled_sends += 1;
            }
            // SAFETY: each request's bytes lie in `tx`, which the engine owns and does not
            // write again until a later signaled completion (`tx_done`); a peer's address
            // handle lives until every send through it completed (`Peers`).
            unsafe { self.qp.post_send(&self.send_chain[..n]) }.map_err(|e| Error::Provider {
                op: "ibv_post_send",
                source: e.error,
            })?;
            self.tx_next += n as u64;
            self.tx_slot += n;
            if self.tx_slot >= slots {
                self.tx_slot -= slots;
            }
            self.stats.send_doorbells += 1;
        }
        self.peers.release(self.tx_done);
        Ok(())
    }
}
