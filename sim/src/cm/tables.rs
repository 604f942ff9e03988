//! The connection manager's state: event channels, ids and what each id knows of its
//! peer, under the world's lock. Every operation queues its events at once, in call order
//! (no timers: a peer that never answers is the caller's timeout), so a stepped fabric
//! driven by one thread sees the same events in the same order every run.
//!
//! Map (one file: every operation moves the ids of both sides through one state machine,
//! `Phase`): channels and ids (`create_channel`, `create_id`, `take_event`,
//! `close_channel`, `migrate`); the passive side (`bind`, `listen`); the active side
//! (`resolve_addr`, `resolve_route`, `connect`); the answers (`accept`, `reject`,
//! `establish`); the end (`disconnect`, `destroy_id`). What a resolved id's path is:
//! `path.rs`.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;

use zverbs_types::cm::{
    private_data_limit as limit, CmEventKind, ConnParam, PortSpace, PrivateData, REJECT_CONSUMER,
    REJECT_NO_LISTENER, SIDR_NO_LISTENER, SIDR_REJECT, UD_QKEY,
};

use super::path::{device_of, ip_of, psn_of, Devices};
use crate::fd_queue::FdQueue;
use crate::types::SimError;

/// The status of an address that resolves to no device (`-ETIMEDOUT`: nobody answered
/// the neighbour lookup).
pub const STATUS_NO_ADDRESS: i32 = -110;
/// The status of a route over a port that is down (`-ENETUNREACH`).
pub const STATUS_PORT_DOWN: i32 = -101;

/// The first port handed out for a bind to port 0.
const EPHEMERAL: u16 = 49152;

/// One side's part of a connection: what the peer learns from its connect or accept.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Side {
    pub(crate) dev: usize,
    pub(crate) psn: u32,
    pub(crate) param: ConnParam,
}

/// Where an id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Bound,
    Listening,
    AddrResolved,
    RouteResolved,
    /// Active: connect sent, no answer yet.
    ReqSent,
    /// Passive: a request to answer.
    ReqRcvd,
    /// Passive: accepted, waiting for the active side to establish.
    RepSent,
    /// Active: accepted; establish next.
    RepRcvd,
    Connected,
    /// Refused, disconnected, or its peer gone.
    Done,
}

#[derive(Debug)]
pub(crate) struct IdState {
    pub(crate) key: u64,
    pub(crate) ch: usize,
    pub(crate) ps: PortSpace,
    pub(crate) phase: Phase,
    /// The local device, once bound or resolved.
    pub(crate) dev: Option<usize>,
    /// The local address (bound, or the resolved source).
    pub(crate) local: Option<SocketAddr>,
    /// The destination (active side).
    pub(crate) dst: Option<SocketAddr>,
    /// The other id of the connection.
    pub(crate) peer: Option<usize>,
    /// This side's connect or accept, once made.
    pub(crate) mine: Option<Side>,
    /// The peer's, once heard.
    pub(crate) theirs: Option<Side>,
    /// Passive ids: the listener whose request made them (until it is taken).
    pub(crate) listener: Option<usize>,
}

/// An event as queued: the new id of a connect request by index.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) kind: CmEventKind,
    pub(crate) id: usize,
    pub(crate) listen_id: Option<usize>,
    pub(crate) status: i32,
    pub(crate) private_data: PrivateData,
}

#[derive(Debug)]
struct Channel {
    events: FdQueue<Queued>,
    open: bool,
}

/// The manager: channels and ids, by index.
#[derive(Debug, Default)]
pub(crate) struct CmTables {
    channels: Vec<Option<Channel>>,
    pub(crate) ids: Vec<Option<IdState>>,
    next_key: u64,
}

impl CmTables {
    pub(crate) fn create_channel(&mut self) -> Result<(usize, UnixStream), SimError> {
        let events = FdQueue::new()?;
        let fd = events.clone_fd()?;
        let ch = Channel { events, open: true };
        self.channels.push(Some(ch));
        Ok((self.channels.len() - 1, fd))
    }

    pub(crate) fn create_id(&mut self, ch: usize, ps: PortSpace) -> (usize, u64) {
        self.next_key += 1;
        let key = self.next_key;
        let id = IdState {
            key,
            ch,
            ps,
            phase: Phase::Idle,
            dev: None,
            local: None,
            dst: None,
            peer: None,
            mine: None,
            theirs: None,
            listener: None,
        };
        // Slots are never reused: an index held in a peer or an event names one id.
        self.ids.push(Some(id));
        (self.ids.len() - 1, key)
    }

    pub(crate) fn live_ids(&self) -> usize {
        self.ids.iter().flatten().count()
    }

    pub(crate) fn id(&self, i: usize) -> &IdState {
        self.ids[i].as_ref().expect("live id")
    }

    fn id_mut(&mut self, i: usize) -> &mut IdState {
        self.ids[i].as_mut().expect("live id")
    }

    /// Queues an event for id `i` on its channel (dropped if the channel is gone).
    fn raise(&mut self, i: usize, kind: CmEventKind, status: i32, data: PrivateData) {
        let (ch, listen_id) = (self.id(i).ch, None);
        self.push(
            ch,
            Queued {
                kind,
                id: i,
                listen_id,
                status,
                private_data: data,
            },
        );
    }

    fn push(&mut self, ch: usize, ev: Queued) {
        let Some(Some(c)) = self.channels.get_mut(ch) else {
            return;
        };
        if c.open {
            c.events.push(ev);
        }
    }

    /// The oldest event of channel `ch`.
    pub(crate) fn take_event(&mut self, ch: usize) -> Option<Queued> {
        let c = self.channels.get_mut(ch)?.as_mut()?;
        let ev = c.events.pop()?;
        if ev.kind == CmEventKind::ConnectRequest {
            // The request is the application's now: its listener no longer answers for it.
            self.id_mut(ev.id).listener = None;
        }
        Some(ev)
    }

    pub(crate) fn pending(&self, ch: usize) -> usize {
        self.channels
            .get(ch)
            .and_then(Option::as_ref)
            .map_or(0, |c| c.events.len())
    }

    /// Closes channel `ch`: its queued requests are refused (their ids destroyed).
    pub(crate) fn close_channel(&mut self, ch: usize) {
        let Some(c) = self.channels.get_mut(ch).and_then(Option::as_mut) else {
            return;
        };
        c.open = false;
        let queued = c.events.take_all();
        for ev in queued {
            if ev.kind == CmEventKind::ConnectRequest {
                self.destroy_id(ev.id);
            }
        }
        self.channels[ch] = None;
    }

    /// Moves id `i`'s events, queued and to come, to channel `to` (`rdma_migrate_id`).
    pub(crate) fn migrate(&mut self, i: usize, to: usize) -> Result<(), SimError> {
        if !matches!(self.channels.get(to), Some(Some(c)) if c.open) {
            return Err(SimError::NotFound);
        }
        let from = self.id(i).ch;
        if from == to {
            return Ok(());
        }
        let mut moved = Vec::new();
        if let Some(Some(c)) = self.channels.get_mut(from) {
            let (mine, rest): (Vec<Queued>, Vec<Queued>) = c
                .events
                .take_all()
                .into_iter()
                .partition(|e| e.id == i && e.kind != CmEventKind::ConnectRequest);
            rest.into_iter().for_each(|e| c.events.push(e));
            moved.extend(mine);
        }
        self.id_mut(i).ch = to;
        for ev in moved {
            self.push(to, ev);
        }
        Ok(())
    }

    pub(crate) fn bind(
        &mut self,
        devs: &dyn Devices,
        i: usize,
        mut addr: SocketAddr,
    ) -> Result<SocketAddr, SimError> {
        if self.id(i).phase != Phase::Idle {
            return Err(SimError::Invalid("rdma_bind_addr: the id is bound already"));
        }
        let dev = if addr.ip().is_unspecified() {
            None
        } else {
            Some(device_of(devs, addr.ip()).ok_or(SimError::NotFound)?)
        };
        let ps = self.id(i).ps;
        let taken = |port: u16, ids: &[Option<IdState>]| {
            ids.iter().flatten().any(|o| {
                o.ps == ps
                    && matches!(o.phase, Phase::Bound | Phase::Listening)
                    && o.local.is_some_and(|l| {
                        l.port() == port
                            && (l.ip() == addr.ip()
                                || l.ip().is_unspecified()
                                || addr.ip().is_unspecified())
                    })
            })
        };
        if addr.port() == 0 {
            let port = (EPHEMERAL..=u16::MAX)
                .find(|&p| !taken(p, &self.ids))
                .ok_or(SimError::QueueFull)?;
            addr.set_port(port);
        } else if taken(addr.port(), &self.ids) {
            return Err(SimError::Busy);
        }
        let id = self.id_mut(i);
        id.dev = dev;
        id.local = Some(addr);
        id.phase = Phase::Bound;
        Ok(addr)
    }

    pub(crate) fn listen(&mut self, i: usize) -> Result<(), SimError> {
        let id = self.id_mut(i);
        if id.phase != Phase::Bound {
            return Err(SimError::Invalid("rdma_listen: bind the id first"));
        }
        id.phase = Phase::Listening;
        Ok(())
    }

    pub(crate) fn resolve_addr(
        &mut self,
        devs: &dyn Devices,
        i: usize,
        src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> Result<(), SimError> {
        if !matches!(self.id(i).phase, Phase::Idle | Phase::Bound) {
            return Err(SimError::Invalid("rdma_resolve_addr: the id is in use"));
        }
        // Every simulated device is an interface of this host: without a source, the
        // destination's own device (loopback), as the kernel routes a local address.
        let to = device_of(devs, dst.ip());
        let from = match (src, self.id(i).dev) {
            (Some(ip), _) => Some(device_of(devs, ip).ok_or(SimError::NotFound)?),
            (None, Some(d)) => Some(d),
            (None, None) => to,
        };
        let (Some(from), Some(_)) = (from, to) else {
            self.raise(
                i,
                CmEventKind::AddrError,
                STATUS_NO_ADDRESS,
                PrivateData::EMPTY,
            );
            return Ok(());
        };
        let id = self.id_mut(i);
        id.dev = Some(from);
        id.dst = Some(dst);
        id.local = Some(SocketAddr::new(
            ip_of(devs, from),
            id.local.map_or(0, |l| l.port()),
        ));
        id.phase = Phase::AddrResolved;
        self.raise(i, CmEventKind::AddrResolved, 0, PrivateData::EMPTY);
        Ok(())
    }

    pub(crate) fn resolve_route(&mut self, devs: &dyn Devices, i: usize) -> Result<(), SimError> {
        let id = self.id(i);
        if id.phase != Phase::AddrResolved {
            return Err(SimError::Invalid(
                "rdma_resolve_route: resolve the address first",
            ));
        }
        let (from, to) = (id.dev, id.dst.and_then(|d| device_of(devs, d.ip())));
        match (from, to) {
            (Some(a), Some(b)) if devs.port_up(a) && devs.port_up(b) => {
                self.id_mut(i).phase = Phase::RouteResolved;
                self.raise(i, CmEventKind::RouteResolved, 0, PrivateData::EMPTY);
            }
            _ => self.raise(
                i,
                CmEventKind::RouteError,
                STATUS_PORT_DOWN,
                PrivateData::EMPTY,
            ),
        }
        Ok(())
    }

    /// A connect (RC) or service request (UD) to the id's destination.
    pub(crate) fn connect(
        &mut self,
        devs: &dyn Devices,
        i: usize,
        param: &ConnParam,
        data: &[u8],
    ) -> Result<(), SimError> {
        let id = self.id(i);
        let data = message(id.ps, (limit::CONNECT, limit::UD_CONNECT), data)?;
        if id.phase != Phase::RouteResolved {
            return Err(SimError::Invalid("rdma_connect: resolve the route first"));
        }
        let (dst, dev, ps, key) = (
            id.dst.expect("resolved"),
            id.dev.expect("resolved"),
            id.ps,
            id.key,
        );
        let mine = Side {
            dev,
            psn: psn_of(key),
            param: *param,
        };
        let to = device_of(devs, dst.ip());
        let listener = (0..self.ids.len()).find(|&l| {
            self.ids[l].as_ref().is_some_and(|o| {
                o.phase == Phase::Listening
                    && o.ps == ps
                    && o.local.is_some_and(|a| {
                        a.port() == dst.port() && (a.ip().is_unspecified() || o.dev == to)
                    })
            })
        });
        let id = self.id_mut(i);
        id.mine = Some(mine);
        let Some(l) = listener else {
            id.phase = Phase::Done;
            self.refused(i, ps, (REJECT_NO_LISTENER, SIDR_NO_LISTENER), None);
            return Ok(());
        };
        id.phase = Phase::ReqSent;
        let ch = self.id(l).ch;
        let (n, _) = self.create_id(ch, ps);
        let local = SocketAddr::new(dst.ip(), dst.port());
        let new = self.id_mut(n);
        new.phase = Phase::ReqRcvd;
        new.dev = to;
        new.local = Some(local);
        new.peer = Some(i);
        new.theirs = Some(mine);
        new.listener = Some(l);
        self.id_mut(i).peer = Some(n);
        self.push(
            ch,
            Queued {
                kind: CmEventKind::ConnectRequest,
                id: n,
                listen_id: Some(l),
                status: 0,
                private_data: data,
            },
        );
        Ok(())
    }

    /// The passive side's answer to a request: RC, the active side gets a connect
    /// response (it moves its queue pair, then establishes); UD, it is established.
    pub(crate) fn accept(
        &mut self,
        i: usize,
        param: &ConnParam,
        data: &[u8],
    ) -> Result<(), SimError> {
        let id = self.id(i);
        let data = message(id.ps, (limit::ACCEPT, limit::UD_ACCEPT), data)?;
        if id.phase != Phase::ReqRcvd {
            return Err(SimError::Invalid("rdma_accept: no request to accept"));
        }
        let (ps, key, dev) = (id.ps, id.key, id.dev.expect("request's device"));
        let Some(a) = id.peer.filter(|&a| self.ids[a].is_some()) else {
            // The active side gave up (destroyed its id) before the answer.
            self.id_mut(i).phase = Phase::Done;
            return Err(SimError::NotFound);
        };
        // Over IP the manager answers a datagram service with its one Q_Key, whatever
        // the acceptor asked.
        let mut param = *param;
        if ps == PortSpace::Ud {
            param.qkey = UD_QKEY;
        }
        let mine = Side {
            dev,
            psn: psn_of(key),
            param,
        };
        let id = self.id_mut(i);
        id.mine = Some(mine);
        id.phase = if ps == PortSpace::Rc {
            Phase::RepSent
        } else {
            Phase::Done
        };
        let active = self.id_mut(a);
        active.theirs = Some(mine);
        if ps == PortSpace::Rc {
            active.phase = Phase::RepRcvd;
            self.raise(a, CmEventKind::ConnectResponse, 0, data);
        } else {
            active.phase = Phase::Done;
            self.raise(a, CmEventKind::Established, 0, data);
        }
        Ok(())
    }

    pub(crate) fn reject(&mut self, i: usize, data: &[u8]) -> Result<(), SimError> {
        let data = message(self.id(i).ps, (limit::REJECT, limit::UD_ACCEPT), data)?;
        if self.id(i).phase != Phase::ReqRcvd {
            return Err(SimError::Invalid("rdma_reject: no request to reject"));
        }
        self.refuse(i, data);
        Ok(())
    }

    /// Refuses passive id `i`'s request (consumer-defined reason).
    fn refuse(&mut self, i: usize, data: PrivateData) {
        self.id_mut(i).phase = Phase::Done;
        if let Some(a) = self.id(i).peer.filter(|&a| self.ids[a].is_some()) {
            if self.id(a).phase == Phase::ReqSent {
                self.id_mut(a).phase = Phase::Done;
                let ps = self.id(a).ps;
                self.refused(a, ps, (REJECT_CONSUMER, SIDR_REJECT), Some(data));
            }
        }
    }

    /// Tells active id `i` its request was refused, as its port space says it: a
    /// reliable connect is `Rejected` with `status.0` (a reject's private data); a
    /// datagram service request is `Unreachable` with `status.1` (a service reply's).
    fn refused(&mut self, i: usize, ps: PortSpace, status: (i32, i32), data: Option<PrivateData>) {
        let (kind, status, size) = match ps {
            PortSpace::Rc => (CmEventKind::Rejected, status.0, limit::REJECT),
            PortSpace::Ud => (CmEventKind::Unreachable, status.1, limit::UD_ACCEPT),
        };
        let data = data.unwrap_or_else(|| PrivateData::padded(&[], size).expect("empty fits"));
        self.raise(i, kind, status, data);
    }

    /// The active side, its queue pair at RTS: the passive side's connection is up.
    pub(crate) fn establish(&mut self, i: usize) -> Result<(), SimError> {
        if self.id(i).phase != Phase::RepRcvd {
            return Err(SimError::Invalid("rdma_establish: no accepted connect"));
        }
        self.id_mut(i).phase = Phase::Connected;
        if let Some(p) = self.id(i).peer.filter(|&p| self.ids[p].is_some()) {
            if self.id(p).phase == Phase::RepSent {
                self.id_mut(p).phase = Phase::Connected;
                self.raise(p, CmEventKind::Established, 0, PrivateData::EMPTY);
            }
        }
        Ok(())
    }

    /// Ends a connection: both sides get `Disconnected` (this one first).
    pub(crate) fn disconnect(&mut self, i: usize) -> Result<(), SimError> {
        if !matches!(
            self.id(i).phase,
            Phase::Connected | Phase::RepSent | Phase::RepRcvd
        ) {
            return Err(SimError::Invalid("rdma_disconnect: not connected"));
        }
        self.id_mut(i).phase = Phase::Done;
        self.raise(i, CmEventKind::Disconnected, 0, PrivateData::EMPTY);
        self.peer_gone(i);
        Ok(())
    }

    /// Id `i` leaves its connection: a connected peer is disconnected, a waiting active
    /// peer refused.
    fn peer_gone(&mut self, i: usize) {
        let Some(p) = self.id(i).peer.filter(|&p| self.ids[p].is_some()) else {
            return;
        };
        match self.id(p).phase {
            Phase::Connected | Phase::RepSent | Phase::RepRcvd => {
                self.id_mut(p).phase = Phase::Done;
                self.raise(p, CmEventKind::Disconnected, 0, PrivateData::EMPTY);
            }
            Phase::ReqSent => {
                self.id_mut(p).phase = Phase::Done;
                let ps = self.id(p).ps;
                self.refused(p, ps, (REJECT_CONSUMER, SIDR_REJECT), None);
            }
            _ => {}
        }
    }

    /// Destroys id `i`: its connection ends as [`peer_gone`](Self::peer_gone) says; a
    /// listener's requests not yet taken from its channel are refused with it.
    pub(crate) fn destroy_id(&mut self, i: usize) {
        if self.ids.get(i).and_then(Option::as_ref).is_none() {
            return;
        }
        if self.id(i).phase == Phase::Listening {
            let ch = self.id(i).ch;
            let orphans: Vec<usize> = self
                .channels
                .get(ch)
                .and_then(Option::as_ref)
                .map(|c| {
                    c.events
                        .iter()
                        .filter(|e| e.kind == CmEventKind::ConnectRequest && e.listen_id == Some(i))
                        .map(|e| e.id)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(Some(c)) = self.channels.get_mut(ch) {
                c.events.retain(|e| !orphans.contains(&e.id));
            }
            for o in orphans {
                self.destroy_id(o);
            }
        }
        self.peer_gone(i);
        // Events still queued for it name an id that is gone.
        let ch = self.id(i).ch;
        if let Some(Some(c)) = self.channels.get_mut(ch) {
            c.events.retain(|e| e.id != i);
        }
        self.ids[i] = None;
    }
}

/// `data` as a message of `ps` carries it: padded to its field, the RC or UD limit of
/// `limits`; refused past it.
fn message(ps: PortSpace, limits: (usize, usize), data: &[u8]) -> Result<PrivateData, SimError> {
    let size = if ps == PortSpace::Rc {
        limits.0
    } else {
        limits.1
    };
    PrivateData::padded(data, size)
        .ok_or(SimError::Invalid("private data past the message's limit"))
}
