//! Connections through the RDMA connection manager (`librdmacm`), the way RoCE
//! deployments connect: a [`Channel`] to a peer named by its IP address and port, with a
//! few bytes of private data each way, instead of an endpoint exchange of our own.
//!
//! [`CmConnection::connect`] resolves the address and the route, prepares a channel on
//! the caller's context (which must be the device the route leaves from), connects with
//! its queue pair's number and the caller's private data, and on the peer's answer moves
//! the queue pair INIT → RTR → RTS with the attributes the manager decided
//! ([`CmPath`]), then establishes. [`CmListener::accept`]
//! takes the next connect request, lets the caller accept (with a reply) or reject (with
//! a reason) it from its private data, and for an accepted one does the same on its side.
//! One timeout bounds each call. Any program that connects through the manager (`rping`,
//! a `librdmacm` program in C) is a peer.
//!
//! **When to use it instead of the TCP exchange**: on RoCE, where peers know each other's
//! IP addresses and the manager resolves devices, GIDs and paths (no GID index to choose),
//! and to talk to programs that are not zverbs. The TCP exchange
//! ([`bootstrap`](crate::bootstrap)) needs no manager (InfiniBand without IPoIB, the
//! simulator's fabric without addresses) and connects a whole world in one round.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use std::time::Duration;
//! use zverbs::cm::{Answer, CmConnection, CmListener};
//! use zverbs::provider::sim::Sim;
//! use zverbs::{ChannelConfig, Context};
//!
//! let sim = Sim::with_devices(2);
//! let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
//! let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
//! let cfg = ChannelConfig::default();
//! let t = Duration::from_secs(5);
//! // sim1 answers to 10.0.0.2, sim0 to 10.0.0.1.
//! let listener = CmListener::<Sim>::bind(&sim, "10.0.0.2:7471".parse()?)?;
//! std::thread::scope(|s| {
//!     let server = s.spawn(|| {
//!         // Private data arrives padded with zeros to its field (56 bytes here).
//!         listener.accept_with::<64, 4>(&cb, &pb, &cfg, t, |hello| match hello.starts_with(b"hello") {
//!             true => Answer::accept(b"welcome"),
//!             false => Answer::reject(b"who?"),
//!         })
//!     });
//!     let from = Some("10.0.0.1".parse().unwrap());
//!     let client = CmConnection::<Sim>::connect(&sim, &ca, &pa, from, "10.0.0.2:7471".parse().unwrap(), b"hello", &cfg, t)
//!         .unwrap();
//!     assert!(client.peer_data().starts_with(b"welcome"));
//!     server.join().unwrap().unwrap();
//! });
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod datagram;
mod error;
pub(crate) mod wait;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use datagram::{resolve_datagram, CmDatagramPeer};
pub use error::CmError;

use crate::channel::{Channel, ChannelConfig, PreparedChannel};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::provider::cm::{
    private_data_limit, CmEventKind, CmPath, ConnParam, ConnectionManager, PortSpace, PrivateData,
    MAX_PRIVATE_DATA,
};
use crate::qp::Endpoint;
use wait::{next_event, Deadline};

/// How long address and route resolution may take at most, each (the manager's own
/// timeout; the call's deadline bounds the wait for its event).
pub(crate) const RESOLVE_MS: u32 = 2000;

/// The answer to a connect request ([`CmListener::accept_with`]): accept with a reply, or
/// reject with a reason. Private data past the message's limit is not cut: the listener
/// refuses that request and its call fails with [`CmError::PrivateDataTooLong`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    accept: bool,
    /// The data, whole when it is at most [`MAX_PRIVATE_DATA`] bytes.
    data: PrivateData,
    /// Its length as given.
    len: usize,
}

impl Answer {
    /// Accept with `reply` (at most [`private_data_limit::ACCEPT`] bytes on a reliable
    /// connection, [`private_data_limit::UD_ACCEPT`] for a datagram service).
    pub fn accept(reply: &[u8]) -> Answer {
        Answer::of(true, reply)
    }

    /// Reject with `reason` (at most [`private_data_limit::REJECT`] bytes on a reliable
    /// connection, [`private_data_limit::UD_ACCEPT`] for a datagram service).
    pub fn reject(reason: &[u8]) -> Answer {
        Answer::of(false, reason)
    }

    fn of(accept: bool, data: &[u8]) -> Answer {
        let n = data.len().min(MAX_PRIVATE_DATA);
        Answer {
            accept,
            data: PrivateData::new(&data[..n], n).unwrap_or(PrivateData::EMPTY),
            len: data.len(),
        }
    }

    /// Whether it accepts, and its data if within the limit of the message that carries
    /// it (`limits`: an accept's and a reject's).
    pub(crate) fn checked<E>(
        self,
        limits: (usize, usize),
    ) -> (bool, Result<PrivateData, CmError<E>>) {
        let max = if self.accept { limits.0 } else { limits.1 };
        let data = match self.len <= max {
            true => Ok(self.data),
            false => Err(CmError::PrivateDataTooLong { len: self.len, max }),
        };
        (self.accept, data)
    }
}

/// What keeps a connection made through the manager: its id and event channel. Dropping
/// it ends the connection (the peer sees it disconnect).
pub struct CmLink<P: ConnectionManager> {
    pub(crate) id: P::CmId,
    pub(crate) events: P::CmChannel,
    /// The peer's disconnect was seen (its event is taken once).
    gone: AtomicBool,
}

impl<P: ConnectionManager> CmLink<P> {
    /// Whether the peer has disconnected (or its id is gone), without waiting.
    ///
    /// # Errors
    /// A verb's error.
    pub fn peer_disconnected(&self) -> Result<bool, CmError<P::Error>> {
        while !self.gone.load(Ordering::Relaxed) {
            match P::get_cm_event(&self.events).map_err(CmError::Verbs)? {
                Some(ev) if ev.kind == CmEventKind::Disconnected => {
                    self.gone.store(true, Ordering::Relaxed)
                }
                Some(_) => {}
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Ends the connection and waits (by `timeout`) until the manager says it is down
    /// here; the peer sees `Disconnected` too.
    ///
    /// # Errors
    /// A verb's error; [`CmError::Timeout`].
    pub fn disconnect(&self, timeout: Duration) -> Result<(), CmError<P::Error>> {
        let deadline = Deadline::after(timeout);
        P::cm_disconnect(&self.id).map_err(CmError::Verbs)?;
        expect::<P>(&self.events, CmEventKind::Disconnected, deadline).map(drop)
    }

    /// The event channel's descriptor: readable when the manager has news (the peer
    /// disconnecting), for an event loop.
    pub fn fd(&self) -> std::os::fd::RawFd {
        P::cm_channel_fd(&self.events)
    }
}

/// A channel connected through the manager, with its link: dropping it ends the
/// connection (the peer sees it disconnect).
pub struct CmConnection<P: ConnectionManager, const DEPTH: usize = 64, const SGES: usize = 4> {
    // Fields drop in order: the queue pair first, then the link (the peer learns of the
    // end).
    channel: Channel<P, DEPTH, SGES>,
    link: CmLink<P>,
    peer_data: PrivateData,
}

impl<P: ConnectionManager, const DEPTH: usize, const SGES: usize> CmConnection<P, DEPTH, SGES> {
    /// Connects to the listener at `dst` from `ctx` (from `src`'s device when given; else
    /// the route's), with `data` (at most [`private_data_limit::CONNECT`] bytes) for the
    /// peer, by `timeout`.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`]; [`CmError::AddrError`] / [`CmError::RouteError`]
    /// when the address or route does not resolve; [`CmError::WrongDevice`] when the route
    /// leaves from another device than `ctx`'s; [`CmError::Rejected`] with the peer's
    /// reason (or the manager's: nobody listening); [`CmError::Unreachable`];
    /// [`CmError::Timeout`]; a verb's error.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        provider: &P,
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        src: Option<IpAddr>,
        dst: SocketAddr,
        data: &[u8],
        config: &ChannelConfig,
        timeout: Duration,
    ) -> Result<Self, CmError<P::Error>> {
        let prepare = || Channel::<P, DEPTH, SGES>::prepare(ctx, pd, config);
        Self::connect_prepared(provider, ctx, prepare, src, dst, data, timeout, |_| Ok(()))
    }

    /// As [`connect`](Self::connect), with the channel `prepare` makes on `ctx` (with
    /// completion events, say); `before_establish` gets the peer's accept (its private
    /// data) once this channel is at RTS, before the passive side learns that the
    /// connection is established (to ready a second queue pair the reply described).
    ///
    /// # Errors
    /// As [`connect`](Self::connect); `before_establish`'s.
    #[allow(clippy::too_many_arguments)]
    pub fn connect_prepared(
        provider: &P,
        ctx: &Context<P>,
        prepare: impl FnOnce() -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>>,
        src: Option<IpAddr>,
        dst: SocketAddr,
        data: &[u8],
        timeout: Duration,
        before_establish: impl FnOnce(&[u8]) -> Result<(), CmError<P::Error>>,
    ) -> Result<Self, CmError<P::Error>> {
        crate::trace::span!(INFO, "cm_connect", %dst);
        let deadline = Deadline::after(timeout);
        fits(data, private_data_limit::CONNECT)?;
        let link = resolved(provider, PortSpace::Rc, ctx, src, dst, deadline)?;
        let prepared = prepare().map_err(CmError::Channel)?;
        let param = conn_param(&prepared);
        P::cm_connect(&link.id, &param, data).map_err(CmError::Verbs)?;
        let answer = expect::<P>(&link.events, CmEventKind::ConnectResponse, deadline)?;
        let path = P::cm_path(&link.id).map_err(CmError::Verbs)?;
        let channel = connect_path(prepared, &path).map_err(CmError::Channel)?;
        before_establish(answer.as_slice())?;
        P::cm_establish(&link.id).map_err(CmError::Verbs)?;
        Ok(CmConnection {
            channel,
            link,
            peer_data: answer,
        })
    }

    /// The channel.
    pub fn channel(&mut self) -> &mut Channel<P, DEPTH, SGES> {
        &mut self.channel
    }

    /// The link: the peer's disconnect, the event descriptor.
    pub fn link(&self) -> &CmLink<P> {
        &self.link
    }

    /// What the peer's connect request (listener side) or accept (connecting side) carried,
    /// padded with zeros to the message's field (56 and 196 bytes): a protocol over it
    /// says its own lengths.
    pub fn peer_data(&self) -> &[u8] {
        self.peer_data.as_slice()
    }

    /// Whether the peer has disconnected ([`CmLink::peer_disconnected`]).
    ///
    /// # Errors
    /// A verb's error.
    pub fn peer_disconnected(&self) -> Result<bool, CmError<P::Error>> {
        self.link.peer_disconnected()
    }

    /// Ends the connection ([`CmLink::disconnect`]). The channel comes back for its last
    /// completions.
    ///
    /// # Errors
    /// A verb's error; [`CmError::Timeout`].
    pub fn disconnect(
        self,
        timeout: Duration,
    ) -> Result<Channel<P, DEPTH, SGES>, CmError<P::Error>> {
        self.link.disconnect(timeout)?;
        Ok(self.channel)
    }

    /// The channel, the link that keeps the connection, and the peer's private data.
    pub fn into_parts(self) -> (Channel<P, DEPTH, SGES>, CmLink<P>, PrivateData) {
        (self.channel, self.link, self.peer_data)
    }
}

/// A listener for connect requests on an address and port.
pub struct CmListener<P: ConnectionManager> {
    provider: P,
    /// Listening while it lives.
    _id: P::CmId,
    events: P::CmChannel,
    local: SocketAddr,
}

impl<P: ConnectionManager> CmListener<P> {
    /// Listens on `addr` (an unspecified address: every device's; port 0: a free one).
    ///
    /// # Errors
    /// A verb's error (an address no device has, a port taken).
    pub fn bind(provider: &P, addr: SocketAddr) -> Result<Self, CmError<P::Error>> {
        Self::bind_as(provider, addr, PortSpace::Rc)
    }

    /// A listener for ids of `ps`.
    fn bind_as(provider: &P, addr: SocketAddr, ps: PortSpace) -> Result<Self, CmError<P::Error>> {
        let events = provider.create_cm_channel().map_err(CmError::Verbs)?;
        let id = P::create_cm_id(&events, ps).map_err(CmError::Verbs)?;
        let local = P::cm_bind(&id, addr).map_err(CmError::Verbs)?;
        P::cm_listen(&id, 64).map_err(CmError::Verbs)?;
        Ok(CmListener {
            provider: provider.clone(),
            _id: id,
            events,
            local,
        })
    }

    /// The address and port listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The provider it listens with.
    pub(crate) fn provider(&self) -> &P {
        &self.provider
    }

    /// Where its connect requests come.
    pub(crate) fn events(&self) -> &P::CmChannel {
        &self.events
    }

    /// Takes connect requests until `answer` accepts one (from its private data), by
    /// `deadline`, refusing the others with the reason it gives: the accepted request's
    /// id, the reply and the request's private data. `limits` are the accept's and the
    /// reject's private data limits.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] for a reply or reason past its limit (that request
    /// is refused without it); the wait's errors.
    pub(crate) fn next_accepted(
        &self,
        deadline: Deadline,
        limits: (usize, usize),
        answer: &mut impl FnMut(&[u8]) -> Answer,
    ) -> Result<(P::CmId, PrivateData, PrivateData), CmError<P::Error>> {
        loop {
            let ev = next_event::<P>(&self.events, deadline)?;
            // Only requests come here: the ids they bring move to channels of their own.
            let (CmEventKind::ConnectRequest, Some(request)) = (ev.kind, ev.request) else {
                continue;
            };
            match answer(ev.private_data.as_slice()).checked(limits) {
                (true, reply) => return Ok((request, reply?, ev.private_data)),
                (false, reason) => {
                    // Best effort: dropping the id refuses it too.
                    let _ = P::cm_reject(&request, reason?.as_slice());
                }
            }
        }
    }

    /// [`accept_with`](Self::accept_with) accepting the first request, with no reply.
    ///
    /// # Errors
    /// As [`accept_with`](Self::accept_with).
    pub fn accept<const DEPTH: usize, const SGES: usize>(
        &self,
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
        timeout: Duration,
    ) -> Result<CmConnection<P, DEPTH, SGES>, CmError<P::Error>> {
        self.accept_with(ctx, pd, config, timeout, |_| Answer::accept(b""))
    }

    /// Takes connect requests until `answer` accepts one (from the request's private
    /// data), rejecting the others with the reason it gives; connects the accepted one on
    /// `ctx` and waits until it is established, all by `timeout`. A request that fails on
    /// its way (the peer gone, another device) is refused and the next one taken.
    ///
    /// # Errors
    /// [`CmError::Timeout`] when no request was accepted and established in time;
    /// [`CmError::PrivateDataTooLong`] when `answer` gave a reply or a reason past its
    /// message's limit (that request is refused without it); a verb's error of the
    /// listener itself.
    pub fn accept_with<const DEPTH: usize, const SGES: usize>(
        &self,
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
        timeout: Duration,
        answer: impl FnMut(&[u8]) -> Answer,
    ) -> Result<CmConnection<P, DEPTH, SGES>, CmError<P::Error>> {
        let prepare = || Channel::<P, DEPTH, SGES>::prepare(ctx, pd, config);
        self.accept_prepared_with(ctx, prepare, timeout, answer)
    }

    /// As [`accept_with`](Self::accept_with), with the channel `prepare` makes on `ctx`
    /// for each accepted request (with completion events, say).
    ///
    /// # Errors
    /// As [`accept_with`](Self::accept_with).
    pub fn accept_prepared_with<const DEPTH: usize, const SGES: usize>(
        &self,
        ctx: &Context<P>,
        mut prepare: impl FnMut() -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>>,
        timeout: Duration,
        mut answer: impl FnMut(&[u8]) -> Answer,
    ) -> Result<CmConnection<P, DEPTH, SGES>, CmError<P::Error>> {
        crate::trace::span!(INFO, "cm_accept");
        let deadline = Deadline::after(timeout);
        let limits = (private_data_limit::ACCEPT, private_data_limit::REJECT);
        loop {
            let (request, reply, theirs) = self.next_accepted(deadline, limits, &mut answer)?;
            let accepted = answered::<P, DEPTH, SGES>(
                &self.provider,
                request,
                ctx,
                &mut prepare,
                reply,
                deadline,
            );
            match accepted {
                Ok(mut conn) => {
                    conn.peer_data = theirs;
                    return Ok(conn);
                }
                Err(CmError::Timeout { .. }) if deadline.passed() => {
                    return Err(CmError::Timeout {
                        waiting_for: CmEventKind::Established,
                    })
                }
                // That peer's problem; the listener serves the next.
                Err(_) => continue,
            }
        }
    }
}

/// Connects `request` (a connect request's id) on `ctx`, accepts it with `reply` and
/// waits until it is established.
fn answered<P: ConnectionManager, const DEPTH: usize, const SGES: usize>(
    provider: &P,
    request: P::CmId,
    ctx: &Context<P>,
    prepare: &mut impl FnMut() -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>>,
    reply: PrivateData,
    deadline: Deadline,
) -> Result<CmConnection<P, DEPTH, SGES>, CmError<P::Error>> {
    let events = provider.create_cm_channel().map_err(CmError::Verbs)?;
    P::cm_migrate(&request, &events).map_err(CmError::Verbs)?;
    if !P::cm_on_device(&request, ctx.raw()) {
        let _ = P::cm_reject(&request, b"");
        return Err(CmError::WrongDevice);
    }
    let path = P::cm_path(&request).map_err(CmError::Verbs)?;
    let prepared = prepare().map_err(CmError::Channel)?;
    let param = conn_param(&prepared);
    let channel = connect_path(prepared, &path).map_err(CmError::Channel)?;
    P::cm_accept(&request, &param, reply.as_slice()).map_err(CmError::Verbs)?;
    expect::<P>(&events, CmEventKind::Established, deadline)?;
    Ok(CmConnection {
        channel,
        link: CmLink {
            id: request,
            events,
            gone: AtomicBool::new(false),
        },
        peer_data: PrivateData::EMPTY,
    })
}

/// `Ok` if `data` is within `limit` bytes of private data.
pub(crate) fn fits<E>(data: &[u8], limit: usize) -> Result<(), CmError<E>> {
    if data.len() > limit {
        return Err(CmError::PrivateDataTooLong {
            len: data.len(),
            max: limit,
        });
    }
    Ok(())
}

/// A new id of `ps` on an event channel of its own (a link not connected yet), its
/// address and route resolved to `dst` from `ctx`'s device (from `src`'s address when
/// given), by `deadline`.
pub(crate) fn resolved<P: ConnectionManager>(
    provider: &P,
    ps: PortSpace,
    ctx: &Context<P>,
    src: Option<IpAddr>,
    dst: SocketAddr,
    deadline: Deadline,
) -> Result<CmLink<P>, CmError<P::Error>> {
    let events = provider.create_cm_channel().map_err(CmError::Verbs)?;
    let id = P::create_cm_id(&events, ps).map_err(CmError::Verbs)?;
    P::cm_resolve_addr(&id, src, dst, RESOLVE_MS).map_err(CmError::Verbs)?;
    expect::<P>(&events, CmEventKind::AddrResolved, deadline)?;
    P::cm_resolve_route(&id, RESOLVE_MS).map_err(CmError::Verbs)?;
    expect::<P>(&events, CmEventKind::RouteResolved, deadline)?;
    if !P::cm_on_device(&id, ctx.raw()) {
        return Err(CmError::WrongDevice);
    }
    Ok(CmLink {
        id,
        events,
        gone: AtomicBool::new(false),
    })
}

/// What a side's connect or accept says of its queue pair.
fn conn_param<P: ConnectionManager, const DEPTH: usize, const SGES: usize>(
    prepared: &PreparedChannel<P, DEPTH, SGES>,
) -> ConnParam {
    let c = prepared.config();
    ConnParam {
        qp_num: prepared.endpoint().qp_num,
        responder_resources: c.rtr.max_dest_rd_atomic,
        initiator_depth: c.rts.max_rd_atomic,
        retry_count: c.rts.retry_cnt,
        rnr_retry_count: c.rts.rnr_retry,
        qkey: 0,
    }
}

/// INIT → RTR → RTS with the manager's path: its source GID and first PSN for this side,
/// the peer's queue pair, PSN, address and MTU.
pub(crate) fn connect_path<P: ConnectionManager, const DEPTH: usize, const SGES: usize>(
    mut prepared: PreparedChannel<P, DEPTH, SGES>,
    path: &CmPath,
) -> Result<Channel<P, DEPTH, SGES>, crate::error::Error<P::Error>> {
    prepared.take_path(path.sgid_index, path.local_psn);
    prepared.connect(&Endpoint {
        qp_num: path.remote_qp_num,
        psn: path.remote_psn,
        lid: path.remote_lid,
        gid: path.remote_gid,
        mtu: path.mtu,
    })
}

/// Waits for the next event of `events`, which must be `want`: its private data; any
/// other is the error it says.
pub(crate) fn expect<P: ConnectionManager>(
    events: &P::CmChannel,
    want: CmEventKind,
    deadline: Deadline,
) -> Result<PrivateData, CmError<P::Error>> {
    let ev = next_event::<P>(events, deadline).map_err(|e| match e {
        CmError::Timeout { .. } => CmError::Timeout { waiting_for: want },
        e => e,
    })?;
    if ev.kind == want {
        return Ok(ev.private_data);
    }
    let status = ev.status;
    Err(match ev.kind {
        CmEventKind::AddrError => CmError::AddrError { status },
        CmEventKind::RouteError => CmError::RouteError { status },
        CmEventKind::Rejected => CmError::Rejected {
            status,
            private_data: ev.private_data.as_slice().to_vec(),
        },
        CmEventKind::Unreachable => CmError::Unreachable { status },
        CmEventKind::Disconnected => CmError::Disconnected,
        kind => CmError::Unexpected { kind, status },
    })
}
