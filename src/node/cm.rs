//! A node connected through the connection manager: each rank listens at the address the
//! bootstrap gave it, requests a connection of every peer above it and accepts one from
//! every peer below it, with no endpoint exchange of its own (std, unix).
//!
//! A pair's data queue pair is the manager's connection; the barrier window rides in the
//! private data (`"ZVND"`, rank, world size, window: 32 of a connect's 56 bytes; the
//! accept carries the acceptor's window). In four steps, none of
//! which waits for a peer that is itself waiting for this rank:
//!
//! 1. request every higher peer (resolving its address and route first), not waiting;
//! 2. gather every lower peer's request and every higher peer's response; a request that
//!    is not of this world, or from no peer, or twice, is rejected with the reason and the
//!    listener goes on;
//! 3. move every queue pair to RTS with the attributes the manager decided;
//! 4. accept every request, establish every response, and wait until every accepted one
//!    is established: then every pair of this node is at RTS on both sides.
//!
//! The highest rank has nothing to wait for in step 2 but requests, so the ranks finish
//! from the top down. A peer not listening yet (ranks start at different moments) is
//! asked again after 10 ms. One deadline bounds it all.

use crate::multi_channel::PeerTransport;
use crate::qp::Rc;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use std::vec::Vec;

use super::{Node, NodeError, PreparedNode};
use crate::cm::wait::{next_event_of, Deadline};
use crate::cm::{resolved, CmError, CmLink, CmListener};
use crate::device::Context;
use crate::mr::RemoteRegion;
use crate::node::wire::{decode_window, encode_window, WINDOW_LEN};
use crate::provider::cm::{
    CmEventKind, CmPath, ConnParam, ConnectionManager, PortSpace, PrivateData, REJECT_NO_LISTENER,
};
use crate::qp::Endpoint;

const MAGIC: &[u8; 4] = b"ZVND";
/// A request: the magic, rank and world size (big-endian), the barrier window.
const REQUEST: usize = 12 + WINDOW_LEN;

/// What keeps a node's connections made through the manager: their ids and the event
/// channel they report to. Keep it as long as the node: dropping it ends the connections
/// (the peers see them disconnect).
pub struct CmLinks<P: ConnectionManager> {
    ids: Vec<(usize, P::CmId)>,
    events: P::CmChannel,
}

impl<P: ConnectionManager> CmLinks<P> {
    /// A peer whose connection went down since the last call (it disconnected, or its id
    /// is gone), if any; without waiting.
    ///
    /// # Errors
    /// A verb's error.
    pub fn disconnected(&self) -> Result<Option<usize>, CmError<P::Error>> {
        while let Some(ev) = P::get_cm_event(&self.events).map_err(CmError::Verbs)? {
            if ev.kind == CmEventKind::Disconnected {
                return Ok(self.rank_of(ev.id));
            }
        }
        Ok(None)
    }

    fn rank_of(&self, key: u64) -> Option<usize> {
        self.ids
            .iter()
            .find(|(_, id)| P::cm_id_key(id) == key)
            .map(|&(r, _)| r)
    }
}

/// A node connected through the manager, and the links that keep its connections.
pub type CmConnected<P, const PEERS: usize, const DEPTH: usize, const SGES: usize, T = Rc> = Result<
    (Node<P, PEERS, DEPTH, SGES, T>, CmLinks<P>),
    NodeError<<P as crate::provider::Provider>::Error>,
>;

impl<
        P: ConnectionManager,
        T: PeerTransport,
        const PEERS: usize,
        const DEPTH: usize,
        const SGES: usize,
    > PreparedNode<P, PEERS, DEPTH, SGES, T>
{
    /// Connects to every peer through the connection manager (see the module docs):
    /// `listener` listens at this rank's address, `addrs[r]` is where rank `r` listens
    /// (one per rank of the world), `ctx` is the device this node was prepared on (from
    /// `src`'s address when given). Returns the node and the links that keep its
    /// connections, within `timeout`.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// use std::net::SocketAddr;
    /// use std::time::Duration;
    /// use zverbs::cm::CmListener;
    /// use zverbs::node::{Node, NodeConfig};
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::Context;
    ///
    /// let n = 3;
    /// let sim = Sim::with_devices(n);
    /// // Device i answers to 10.0.0.<i + 1>; every rank listens on port 7500.
    /// let addrs: Vec<SocketAddr> =
    ///     (0..n).map(|i| SocketAddr::new([10, 0, 0, i as u8 + 1].into(), 7500)).collect();
    /// std::thread::scope(|s| {
    ///     for rank in 0..n {
    ///         let (sim, addrs) = (&sim, &addrs);
    ///         s.spawn(move || {
    ///             let ctx = Context::open(sim, &format!("sim{rank}")).unwrap();
    ///             let pd = ctx.alloc_pd().unwrap();
    ///             let listener = CmListener::bind(sim, addrs[rank]).unwrap();
    ///             let node = Node::<Sim, 4>::prepare(&ctx, &pd, rank, n, &NodeConfig::default()).unwrap();
    ///             let from = Some(addrs[rank].ip());
    ///             let (mut node, _links) = node
    ///                 .connect_cm(&ctx, &listener, addrs, from, Duration::from_secs(10))
    ///                 .unwrap();
    ///             node.barrier_all().unwrap();
    ///         });
    ///     }
    /// });
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`NodeError::InvalidRank`] when `addrs` is not one per rank; [`NodeError::Cm`]
    /// naming the peer whose address, route, request or answer failed (a reject, nobody
    /// listening, a disconnect), or a timeout naming none; a verb's error.
    pub fn connect_cm(
        mut self,
        ctx: &Context<P>,
        listener: &CmListener<P>,
        addrs: &[SocketAddr],
        src: Option<IpAddr>,
        timeout: Duration,
    ) -> CmConnected<P, PEERS, DEPTH, SGES, T> {
        let deadline = Deadline::after(timeout);
        let (rank, world) = (self.map.rank, self.map.world);
        if addrs.len() != world {
            return Err(NodeError::InvalidRank {
                rank,
                world: addrs.len(),
            });
        }
        let provider = listener.provider();
        let cm = |peer: Option<usize>| move |error| NodeError::Cm { peer, error };
        let verb = |peer: Option<usize>| {
            move |e| NodeError::Cm {
                peer,
                error: CmError::Verbs(e),
            }
        };
        let events = provider.create_cm_channel().map_err(verb(None))?;
        let peers: Vec<usize> = self.map.indices().map(|i| self.map.rank_of(i)).collect();

        // 1. A request to every higher peer, each resolved on a channel of its own, then
        // moved to the node's.
        let dial = |p: usize| -> Result<P::CmId, NodeError<P::Error>> {
            let link = resolved(provider, PortSpace::Rc, ctx, src, addrs[p], deadline)
                .map_err(cm(Some(p)))?;
            // The id moves to the node's channel below; its own goes with the link.
            let CmLink {
                id, events: _own, ..
            } = link;
            let (data, window) = self.endpoints(p)?;
            let hello = request(rank, world, &window);
            P::cm_connect(&id, &self.param(data.qp_num), &hello).map_err(verb(Some(p)))?;
            P::cm_migrate(&id, &events).map_err(verb(Some(p)))?;
            Ok(id)
        };
        let mut ids: Vec<(usize, P::CmId)> = Vec::with_capacity(peers.len());
        for &p in peers.iter().filter(|&&p| p > rank) {
            ids.push((p, dial(p)?));
        }
        let dialed = ids.len();

        // 2. Every lower peer's request, every higher peer's response.
        let lower = peers.iter().filter(|&&p| p < rank).count();
        let mut heard: [Option<(CmPath, RemoteRegion)>; PEERS] = [None; PEERS];
        let (mut requests, mut responses) = (0, 0);
        while requests < lower || responses < dialed {
            let (from, ev) =
                next_event_of::<P>(&[listener.events(), &events], deadline).map_err(cm(None))?;
            if from == 0 {
                let Some(id) = ev.request else { continue };
                let Some(q) = self.requester(&ev.private_data, &heard) else {
                    let _ = P::cm_reject(&id, b"ZVND: not a peer of this node's world");
                    continue;
                };
                let theirs = ev
                    .private_data
                    .as_slice()
                    .get(12..)
                    .and_then(window_in)
                    .ok_or(cm(Some(q))(CmError::Unexpected {
                        kind: ev.kind,
                        status: 0,
                    }))?;
                let path = P::cm_path(&id).map_err(verb(Some(q)))?;
                P::cm_migrate(&id, &events).map_err(verb(Some(q)))?;
                heard[self.map.index(q).expect("a peer")] = Some((path, theirs));
                ids.push((q, id));
                requests += 1;
                continue;
            }
            let Some(at) = ids.iter().position(|(_, id)| P::cm_id_key(id) == ev.id) else {
                continue;
            };
            let p = ids[at].0;
            if ev.kind == CmEventKind::Rejected && ev.status == REJECT_NO_LISTENER {
                // Not listening yet (ranks start at different moments): ask again, while
                // there is time.
                if deadline.passed() {
                    let waiting_for = CmEventKind::ConnectResponse;
                    return Err(cm(Some(p))(CmError::Timeout { waiting_for }));
                }
                std::thread::sleep(Duration::from_millis(10));
                ids[at].1 = dial(p)?;
                continue;
            }
            if ev.kind != CmEventKind::ConnectResponse || p < rank {
                return Err(cm(Some(p))(failure(ev.kind, ev.status, &ev.private_data)));
            }
            let id = &ids[at].1;
            let reply = ev.private_data.as_slice();
            let theirs = reply
                .strip_prefix(MAGIC)
                .and_then(window_in)
                .ok_or(cm(Some(p))(CmError::Unexpected {
                    kind: ev.kind,
                    status: 0,
                }))?;
            let path = P::cm_path(id).map_err(verb(Some(p)))?;
            heard[self.map.index(p).expect("a peer")] = Some((path, theirs));
            responses += 1;
        }

        // 3. Every queue pair to RTS, with the manager's path for the data ones.
        for i in self.map.indices() {
            if let Some((path, _)) = heard[i] {
                self.data.take_path(i, path.sgid_index, path.local_psn);
            }
        }
        let map = self.map;
        let param = |qp_num| self.param(qp_num);
        let accepts: Vec<(usize, ConnParam, RemoteRegion)> = ids
            .iter()
            .filter(|&&(q, _)| q < rank)
            .map(|&(q, _)| {
                let (data, window) = self.endpoints(q)?;
                Ok((q, param(data.qp_num), window))
            })
            .collect::<Result<_, NodeError<P::Error>>>()?;
        let node = self.connect(|p| {
            let (path, window) = heard[map.index(p)?]?;
            Some((remote_of(&path), window))
        })?;

        // 4. Accept, establish, and wait until every accepted one is established.
        for (q, param, window) in &accepts {
            let id = &ids.iter().find(|(r, _)| r == q).expect("requested").1;
            let mut reply = [0u8; 4 + WINDOW_LEN];
            reply[..4].copy_from_slice(MAGIC);
            reply[4..].copy_from_slice(&encode_window(window));
            P::cm_accept(id, param, &reply).map_err(verb(Some(*q)))?;
        }
        for (p, id) in ids.iter().filter(|&&(p, _)| p > rank) {
            P::cm_establish(id).map_err(verb(Some(*p)))?;
        }
        let mut established = 0;
        while established < accepts.len() {
            let (_, ev) = next_event_of::<P>(&[&events], deadline).map_err(cm(None))?;
            let peer = ids
                .iter()
                .find(|(_, id)| P::cm_id_key(id) == ev.id)
                .map(|&(r, _)| r);
            match ev.kind {
                CmEventKind::Established => established += 1,
                kind => return Err(cm(peer)(failure(kind, ev.status, &ev.private_data))),
            }
        }
        Ok((node, CmLinks { ids, events }))
    }

    /// What this node's connect or accept says of the data queue pair `qp_num`.
    fn param(&self, qp_num: u32) -> ConnParam {
        let c = &self.config.channel;
        ConnParam {
            qp_num,
            responder_resources: c.rtr.max_dest_rd_atomic,
            initiator_depth: c.rts.max_rd_atomic,
            retry_count: c.rts.retry_cnt,
            rnr_retry_count: c.rts.rnr_retry,
            qkey: 0,
        }
    }

    /// The rank a request comes from, if it is of this world, from a lower peer, and the
    /// first from it.
    fn requester(
        &self,
        data: &PrivateData,
        heard: &[Option<(CmPath, RemoteRegion)>; PEERS],
    ) -> Option<usize> {
        let b = data.as_slice();
        let b = b.strip_prefix(MAGIC)?;
        let rank = u32::from_be_bytes(b.get(0..4)?.try_into().ok()?) as usize;
        let world = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?) as usize;
        let i = self.map.index(rank)?;
        (world == self.map.world && rank < self.map.rank && heard[i].is_none()).then_some(rank)
    }
}

/// A request's private data.
fn request(rank: usize, world: usize, window: &RemoteRegion) -> [u8; REQUEST] {
    let mut b = [0u8; REQUEST];
    b[..4].copy_from_slice(MAGIC);
    b[4..8].copy_from_slice(&(rank as u32).to_be_bytes());
    b[8..12].copy_from_slice(&(world as u32).to_be_bytes());
    b[12..].copy_from_slice(&encode_window(window));
    b
}

/// The barrier window at the front of `b`.
fn window_in(b: &[u8]) -> Option<RemoteRegion> {
    decode_window(b.get(..WINDOW_LEN)?)
}

/// The peer's data queue pair as the manager's path describes it.
fn remote_of(path: &CmPath) -> Endpoint {
    Endpoint {
        qp_num: path.remote_qp_num,
        psn: path.remote_psn,
        lid: path.remote_lid,
        gid: path.remote_gid,
        mtu: path.mtu,
    }
}

/// The error an event out of place says.
fn failure<E>(kind: CmEventKind, status: i32, data: &PrivateData) -> CmError<E> {
    match kind {
        CmEventKind::Rejected => CmError::Rejected {
            status,
            private_data: data.as_slice().to_vec(),
        },
        CmEventKind::Unreachable => CmError::Unreachable { status },
        CmEventKind::Disconnected => CmError::Disconnected,
        kind => CmError::Unexpected { kind, status },
    }
}
