//! Large messages over reliable connections: the engine's zero-copy path
//! ([`EngineConfig::bulk`](super::EngineConfig::bulk)).
//!
//! eRPC moves a message longer than one packet as many datagrams, each copied into the
//! receiver's ring and then into its message buffer; rrppcc sends a control packet and lets
//! the peer fetch the bytes with one RDMA read. An [`Rpc`](super::Rpc) with a bulk path does
//! the latter for messages its caller writes into registered buffers
//! ([`Rpc::alloc_msg`](super::Rpc::alloc_msg), [`Rpc::enqueue_bulk`](super::Rpc::enqueue_bulk)):
//!
//! 1. Once a session is connected, the client connects a reliable-connected (RC) queue
//!    pair of its own to one of the server's, with an internal request ([`CONNECT`])
//!    carrying its endpoint; the server answers with its own. The caller's
//!    `Notice::Session(Connected)` comes after that.
//! 2. A large request is an internal request ([`REQUEST`]) carrying the caller's type and
//!    its buffer's address, remote key and length. The server reads the bytes with one RDMA
//!    read into a buffer of its pool, runs the handler for the type into another, and
//!    answers inline when the response fits one packet, else with that buffer's address,
//!    from which the client reads the response into a buffer of its pool.
//! 3. The server keeps a response buffer until the client's release message (a send with
//!    immediate and no bytes over the connection, after its read, naming the slot and
//!    request), the client's next request on the same slot (sent only after the client
//!    released the response, so after its read), or the end of the session.
//!
//! The sessions' queue pairs take release messages from one shared receive queue of
//! bodiless receives, posted full at creation and refilled one per message taken; the
//! completion's `qp_num` names the session. A server's receive queues thus do not grow
//! with its sessions (the engine needs a device with shared receive queues).
//!
//! No CPU copies a large message's bytes: the caller writes the request into its buffer,
//! the server's handler reads it where the read put it and writes the response in place,
//! and the client's caller reads the response where the second read put it. The internal
//! requests ride on the protocol core, so they are retransmitted, deduplicated and timed
//! out as any request: a handler still runs at most once.
//!
//! Wire format of the internal requests' payloads, version 1, integers big-endian:
//!
//! | message | bytes |
//! |---|---|
//! | connect request | version, endpoint (34 bytes, [`Endpoint::encode`]) |
//! | connect response | version, status, endpoint (with [`OK`]) |
//! | large request | version, caller's type, address (8), remote key (4), length (4) |
//! | large response | version, status, then the bytes ([`OK`]) or address, key, length ([`REMOTE`]), or a work completion status ([`READ_FAILED`], 4) |
//! | release message (RC send with immediate) | slot in the window (8 bits), request number's low 24 bits |
//!
//! **Trust.** A length a peer claims is checked against the bulk `max_msg_size` before a
//! buffer is taken; buffers come from the pool (never the heap); the bounds of a read are
//! enforced by the peer's registration, and a read that fails is an error to the request,
//! not to the engine. **Exposure:** the pool is registered with remote *read* rights and
//! every connected peer holds its key, so a peer can read any byte of it, not only the
//! buffers named to it: keep only message bytes there (memory windows would narrow a grant
//! to one buffer; neither backend has them yet). No peer can write there. A request from device memory
//! ([`Rpc::enqueue_bulk_device`](super::Rpc::enqueue_bulk_device)) hands the server its
//! region's key in the same way: register such regions with REMOTE_READ only, over bytes
//! meant for the peer.
//!
//! **Soundness.** A buffer the device reads into stays here until its read completed or its
//! queue pair was reset (in RESET the device no longer touches the memory its work named);
//! a read's work request id carries its slot's generation, bumped at each reset, so a
//! completion left over from before is ignored.

use std::mem;

mod client;
mod server;

use server::Served;

use super::{
    BulkFailure, Handler, MsgBuf, Notice, RequestHandle, RpcCore, RpcError, ServerHandle, SessionId,
};
use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::pool::{LocalBuf, MrPool};
use crate::provider::Provider;
use crate::qp::{
    Endpoint, Init, InitOptions, QpConfig, QueuePair, RcOnSrq, ReadyToSend, Reset, RtrOptions,
    RtsOptions, State, ENDPOINT_LEN,
};
use crate::srq::SharedReceiveQueue;
use crate::types::{
    AccessFlags, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr, WcStatus, WorkCompletion,
};
use crate::wr_id::RpcId;

/// The internal request type that connects a session's reliable connection.
pub const CONNECT: u8 = 0xFF;
/// The internal request type of a large request.
pub const REQUEST: u8 = 0xFE;
/// The payload format's version.
const VERSION: u8 = 1;
/// Status: connected; or the response follows inline.
pub const OK: u8 = 0;
/// Status: the response is to be read at the address that follows.
pub const REMOTE: u8 = 1;
/// Status: the server has no reliable connection for the session.
const NO_LINK: u8 = 2;
/// Status: the server's pool had no room.
const NO_MEMORY: u8 = 3;
/// Status: the server's read of the request failed; the status follows.
pub const READ_FAILED: u8 = 4;
/// Status: a malformed internal request, or a length beyond the server's limit.
const REJECTED: u8 = 5;
/// Length of a large request's payload.
const REQUEST_LEN: usize = 18;

/// Settings of the large-message path ([`EngineConfig::bulk`](super::EngineConfig::bulk)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BulkConfig {
    /// The largest large message, request or response: 1..=2^31 bytes. Default 1 MiB.
    pub max_msg_size: usize,
    /// Bytes of the registered pool for messages: the requests this endpoint sends and
    /// the responses it receives as a client; the requests it reads and the responses it
    /// holds (each `max_msg_size` while its handler runs) as a server. Default 16 MiB.
    pub pool_bytes: usize,
}

impl Default for BulkConfig {
    fn default() -> Self {
        BulkConfig {
            max_msg_size: 1 << 20,
            pool_bytes: 16 << 20,
        }
    }
}

/// One session's reliable connection.
enum Link<P: Provider> {
    Idle(QueuePair<P, Reset, RcOnSrq>),
    /// Client: the connect request is out.
    Connecting(QueuePair<P, Init, RcOnSrq>),
    Up(QueuePair<P, ReadyToSend, RcOnSrq>),
    /// Client: a read failed, which leaves both queue pairs in error; to connect again.
    Redial(QueuePair<P, Reset, RcOnSrq>, SessionId),
    /// A transition failed and the reset after it too: the queue pair is gone.
    Lost,
}

/// What a large message holds in one slot of the core.
enum Op<P: Provider> {
    Free,
    /// Client: the request is out; the server reads this buffer.
    Sent(MsgBuf<P>),
    /// Client: reading the response into `resp`.
    Reading {
        req: MsgBuf<P>,
        resp: LocalBuf<P>,
        handle: RequestHandle,
    },
    /// Server: reading the request into `buf`.
    Fetching {
        buf: LocalBuf<P>,
        handle: ServerHandle,
        req_type: u8,
    },
    /// Server: a response the client reads (kept alive, never touched) until its release
    /// message or its next request on the slot.
    Held {
        _resp: LocalBuf<P>,
        req_num: u64,
    },
}

/// A client slot's request: the caller's, or one of the bulk path's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Plain,
    /// A connect request; its answer is the caller's `Connected` notice.
    Connect,
    /// A connect request after a failed read: no notice.
    Redial,
    Large,
}

/// The bulk path's state in an engine.
pub(super) struct Bulk<P: Provider> {
    /// By session index. Declared first: the queue pairs are destroyed before the
    /// buffers their work named are freed.
    links: Vec<Link<P>>,
    /// Every link's queue pair number and session index, by number: whose release
    /// message a receive completion of the shared queue is.
    by_qpn: Vec<(u32, u32)>,
    /// The receives for release messages, shared by every link (bodiless: no memory),
    /// posted full at creation and one again per release message taken.
    releases: SharedReceiveQueue<P>,
    /// By slot of the core (`session × window + w`).
    ops: Vec<Op<P>>,
    /// By slot: the generation a read's id carries.
    gens: Vec<u32>,
    /// By slot.
    kinds: Vec<Kind>,
    /// Reads completed since the last dispatch: (slot, generation, status). At most one
    /// read per slot is posted, so this never outgrows its capacity (the slot count).
    done: Vec<(usize, u32, WcStatus)>,
    /// Some link is [`Link::Redial`].
    redial: bool,
    pool: MrPool<P>,
    max: usize,
    window: usize,
    /// The largest response sent inline.
    inline_max: usize,
}

impl<P: Provider> Bulk<P> {
    /// One RC queue pair per session (in RESET) on `cq`, all taking release messages from
    /// one shared receive queue, and the pool.
    pub(super) fn new(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        cq: &CompletionQueue<P>,
        qp: &QpConfig,
        core: &super::Config,
        cfg: &BulkConfig,
    ) -> Result<Self, super::EngineError<P::Error>> {
        if !(1..=1 << 31).contains(&cfg.max_msg_size) || cfg.pool_bytes < cfg.max_msg_size {
            return Err(super::EngineError::InvalidConfig(
                "bulk max_msg_size: 1..=2^31, pool_bytes at least that",
            ));
        }
        // SAFETY: remote *read* rights only: no peer's work writes the slab, and the
        // exposure of its bytes to every peer is the documented contract of the pool.
        let pool = unsafe {
            MrPool::with_access(
                pd,
                cfg.pool_bytes,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
        }?;
        let window = core.window;
        let slots = core.max_sessions * window;
        // A receive per slot for release messages, as the device allows (fewer: a release
        // message waits on RNR for the next refill).
        let max_srq_wr = ctx.query_device()?.max_srq_wr;
        let attr = SrqAttr {
            max_wr: u32::try_from(slots)
                .unwrap_or(u32::MAX)
                .min(max_srq_wr)
                .max(1),
            max_sge: 1,
            srq_limit: 0,
        };
        let releases = SharedReceiveQueue::create(ctx, pd, &attr)?;
        let mut qc = *qp;
        // Per slot a read and a release message.
        qc.caps.max_send_wr = 2 * window as u32;
        (qc.caps.max_send_sge, qc.caps.max_recv_sge) = (1, 1);
        qc.caps.max_inline_data = 0;
        let links: Vec<_> = (0..core.max_sessions)
            .map(|_| QueuePair::create_on_srq(ctx, pd, cq, cq, &releases, &qc).map(Link::Idle))
            .collect::<Result<_, _>>()?;
        let mut by_qpn: Vec<_> = links
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match l {
                Link::Idle(qp) => Some((qp.qp_num(), i as u32)),
                _ => None,
            })
            .collect();
        by_qpn.sort_unstable();
        post_release_recvs(&releases, releases.max_wr() as usize);
        Ok(Bulk {
            links,
            by_qpn,
            releases,
            ops: (0..slots).map(|_| Op::Free).collect(),
            gens: vec![0; slots],
            kinds: vec![Kind::Plain; slots],
            done: Vec::with_capacity(slots),
            redial: false,
            pool,
            max: cfg.max_msg_size,
            window,
            inline_max: core.limits().data_per_pkt - 2,
        })
    }

    /// Completions of the bulk path on the shared queue at most: per slot a read, a
    /// release message sent and one received.
    pub(super) fn cq_entries(core: &super::Config) -> usize {
        3 * core.max_sessions * core.window
    }

    pub(super) fn pool(&self) -> &MrPool<P> {
        &self.pool
    }

    pub(super) fn kind(&self, slot: usize) -> Kind {
        self.kinds[slot]
    }

    /// Whether `session` (by index) has its reliable connection.
    pub(super) fn is_up(&self, session: usize) -> bool {
        matches!(self.links.get(session), Some(Link::Up(_)))
    }

    /// A completion of the bulk path, taken from the shared queue. A read's is noted for
    /// the next dispatch, or ignored when its slot was reset since; a release message
    /// received frees the response it names.
    #[cold]
    #[inline(never)]
    pub(super) fn completed(&mut self, wc: &WorkCompletion) {
        let (slot, gen) = match RpcId::decode(wc.wr_id) {
            RpcId::BulkRead { slot, gen } => (slot as usize, gen),
            RpcId::ReleaseRecv => return self.released(wc),
            _ => return, // a release message sent: nothing was held for it
        };
        let current = self.gens.get(slot) == Some(&gen);
        let reading = matches!(
            self.ops.get(slot),
            Some(Op::Reading { .. } | Op::Fetching { .. })
        );
        if current && reading && self.done.len() < self.done.capacity() {
            self.done.push((slot, gen, wc.status));
        }
    }

    /// Server: a release message arrived on a session's connection (the queue pair the
    /// completion names): the client read the response of the slot and request its
    /// immediate names, which is freed. A receive is posted again to the shared queue.
    fn released(&mut self, wc: &WorkCompletion) {
        post_release_recvs(&self.releases, 1);
        let at = self
            .by_qpn
            .binary_search_by_key(&wc.qp_num, |&(qpn, _)| qpn);
        let Ok(at) = at else {
            return;
        };
        let i = self.by_qpn[at].1 as usize;
        if wc.status != WcStatus::Success {
            return;
        }
        if let Some(imm) = wc.imm {
            let w = (imm >> 24) as usize;
            let slot = i * self.window + w;
            let named = |req_num: u64| (req_num & 0xff_ffff) as u32 == imm & 0xff_ffff;
            if w < self.window
                && matches!(self.ops[slot], Op::Held { req_num, .. } if named(req_num))
            {
                self.ops[slot] = Op::Free;
            }
        }
    }

    /// Client: tells the server (over session `i`'s link) that the response of `handle`
    /// in core slot `slot` was read, so that it frees it now.
    pub(super) fn release_remote(&self, i: usize, slot: usize, handle: RequestHandle) {
        let Some(Link::Up(qp)) = self.links.get(i) else {
            return;
        };
        let w = (slot - i * self.window) as u32; // < window <= 64
        let imm = w << 24 | (handle.req_num() & 0xff_ffff) as u32;
        let wr = SendWr::<1>::new(
            RpcId::ReleaseSend.encode(),
            SendOp::SendWithImm(imm),
            SendFlags::SIGNALED,
        );
        // SAFETY: the send names no memory. A failure is the server's loss: its slot's
        // next request frees the response.
        let _ = unsafe { qp.post_send(&[wr]) };
    }

    /// The largest large message.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// Posts a read of `len` bytes at the peer's `addr` into a new buffer, for `slot` on
    /// session `i`'s connection.
    fn read(
        &mut self,
        i: usize,
        slot: usize,
        addr: u64,
        rkey: u32,
        len: usize,
    ) -> Result<LocalBuf<P>, BulkFailure> {
        if len == 0 || len > self.max {
            return Err(BulkFailure::Rejected);
        }
        let Some(Link::Up(qp)) = self.links.get(i) else {
            return Err(BulkFailure::NoLink);
        };
        let buf = self.pool.alloc(len).map_err(|_| BulkFailure::NoMemory)?;
        let id = RpcId::BulkRead {
            slot: slot as u32,
            gen: self.gens[slot],
        }
        .encode();
        debug_assert!(self.gens[slot] <= RpcId::GEN_MASK);
        let mut wr = SendWr::<1>::new(
            id,
            SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            SendFlags::SIGNALED,
        );
        wr.sg_list[0] = Sge {
            addr: buf.addr(),
            length: len as u32, // len <= max <= 2^31
            lkey: buf.lkey(),
        };
        wr.num_sge = 1;
        // SAFETY: `buf` goes into `ops[slot]` (the caller puts it there), where it stays,
        // untouched, until this read's completion or the queue pair's reset.
        unsafe { qp.post_send(&[wr]) }.map_err(|_| BulkFailure::NoLink)?;
        Ok(buf)
    }

    /// Whether [`finish`](Self::finish) has something to do.
    #[inline]
    pub(super) fn has_work(&self) -> bool {
        !self.done.is_empty() || self.redial
    }

    /// Handles the reads completed since the last call: runs handlers for requests read
    /// whole (their responses go out inline or held), and reports responses read whole;
    /// then connects again the links a failed read broke.
    #[cold]
    #[inline(never)]
    pub(super) fn finish(
        &mut self,
        core: &mut RpcCore,
        handlers: &mut [Option<Handler>],
        tags: &[u64],
        no_handler: &mut u64,
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Result<(), RpcError> {
        for k in 0..self.done.len() {
            let (slot, gen, status) = self.done[k];
            if self.gens[slot] != gen {
                continue; // its link was reset since
            }
            match mem::replace(&mut self.ops[slot], Op::Free) {
                Op::Fetching {
                    buf,
                    handle,
                    req_type,
                } => {
                    if status != WcStatus::Success {
                        // The queue pair is in error: answer, then reset (the client
                        // connects again).
                        drop(buf);
                        let mut r = Reply::status(READ_FAILED);
                        r.buf[2..6].copy_from_slice(&status.raw().to_be_bytes());
                        r.len += 4;
                        core.respond(handle, r.bytes())?;
                        self.reset(slot / self.window, core, tags, notice);
                        continue;
                    }
                    let req = Served {
                        buf,
                        handle,
                        req_type,
                    };
                    self.serve(core, handlers, no_handler, slot, req)?;
                }
                Op::Reading { req, resp, handle } => {
                    self.kinds[slot] = Kind::Plain;
                    let tag = tags[slot];
                    if status == WcStatus::Success {
                        let i = slot / self.window;
                        self.release_remote(i, slot, handle);
                        notice(Notice::Response {
                            tag,
                            bytes: resp.as_slice(),
                            msg: Some(req),
                        });
                        drop(resp); // its read completed: free for the next
                        core.release(handle)?;
                        continue;
                    }
                    drop(resp); // its read completed (in error)
                    core.release(handle)?;
                    notice(Notice::Failed {
                        tag,
                        error: RpcError::Bulk(BulkFailure::Read(status)),
                        msg: Some(req),
                    });
                    let session = handle.session();
                    self.broken(usize::from(session.index()), session, core, tags, notice);
                }
                other => self.ops[slot] = other,
            }
        }
        self.done.clear();
        if self.redial {
            self.redial = false;
            for i in 0..self.links.len() {
                if let Link::Redial(_, session) = self.links[i] {
                    self.connect(core, session, false);
                }
            }
        }
        Ok(())
    }

    /// Session `i` ended (or reconnects): its queue pair back to RESET, so that the device
    /// no longer touches the buffers its reads named, then those freed: a client's read in
    /// flight fails its request, a server's is answered (while the session lasts) with
    /// no link. Requests still out keep their buffers until the core ends them.
    #[cold]
    #[inline(never)]
    pub(super) fn reset(
        &mut self,
        i: usize,
        core: &mut RpcCore,
        tags: &[u64],
        notice: &mut impl FnMut(Notice<'_, P>),
    ) {
        self.links[i] = match mem::replace(&mut self.links[i], Link::Lost) {
            Link::Idle(qp) => Link::Idle(qp),
            Link::Connecting(qp) => idle(qp),
            Link::Up(qp) => idle(qp),
            Link::Redial(qp, _) => Link::Idle(qp),
            Link::Lost => Link::Lost,
        };
        for slot in i * self.window..(i + 1) * self.window {
            self.gens[slot] = (self.gens[slot] + 1) & RpcId::GEN_MASK;
            // A connect request that will have no answer (the session ended) leaves
            // nothing behind: a caller's request there later is plain.
            if !matches!(self.ops[slot], Op::Sent(_)) {
                self.kinds[slot] = Kind::Plain;
            }
            match mem::replace(&mut self.ops[slot], Op::Free) {
                Op::Reading { req, resp, handle } => {
                    notice(Notice::Failed {
                        tag: tags.get(slot).copied().unwrap_or_default(),
                        error: RpcError::Bulk(BulkFailure::NoLink),
                        msg: Some(req),
                    });
                    drop(resp);
                    let _ = core.release(handle); // fails only if the session is gone
                }
                Op::Fetching { buf, handle, .. } => {
                    drop(buf);
                    let _ = core.respond(handle, Reply::status(NO_LINK).bytes());
                }
                Op::Held { .. } | Op::Free => {}
                sent @ Op::Sent(_) => self.ops[slot] = sent, // the core ends it
            }
        }
    }
}

/// Posts `n` receives (no bytes) for release messages to the shared queue.
fn post_release_recvs<P: Provider>(releases: &SharedReceiveQueue<P>, n: usize) {
    let wr = RecvWr::<1>::new(RpcId::ReleaseRecv.encode());
    for _ in 0..n {
        // SAFETY: the receives name no memory. A failure (the queue full) leaves fewer
        // receives: a release message then waits on RNR for the next, and the slot's next
        // request frees the response anyway.
        let _ = unsafe { releases.post_recv(&[wr]) };
    }
}

/// A small internal answer, built on the stack.
struct Reply {
    buf: [u8; 2 + ENDPOINT_LEN],
    len: usize,
}

impl Reply {
    fn status(status: u8) -> Reply {
        let mut buf = [0u8; 2 + ENDPOINT_LEN];
        (buf[0], buf[1]) = (VERSION, status);
        Reply { buf, len: 2 }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The rights a session's queue pair grants its peer: reads of the pool.
fn access() -> InitOptions {
    InitOptions {
        access: AccessFlags::REMOTE_READ,
        pkey_index: 0,
    }
}

/// A queue pair back to RESET, or lost if even that fails.
fn idle<P: Provider, St: State>(qp: QueuePair<P, St, RcOnSrq>) -> Link<P> {
    match qp.reset() {
        Ok(qp) => Link::Idle(qp),
        Err(_) => Link::Lost,
    }
}

/// A queue pair in INIT connected to `ep` (RTR, then RTS), or back to RESET.
fn up<P: Provider>(qp: QueuePair<P, Init, RcOnSrq>, ep: &Endpoint) -> Link<P> {
    match qp.into_rtr(ep, &RtrOptions::default()) {
        Err(e) => idle(e.qp),
        Ok(qp) => match qp.into_rts(&RtsOptions::default()) {
            Ok(qp) => Link::Up(qp),
            Err(e) => idle(e.qp),
        },
    }
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}
