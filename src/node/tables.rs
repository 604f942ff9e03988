//! Endpoint tables: what a node sends every peer out of band (std only).
//!
//! A table holds, for every rank of the world, what this node made for that rank: the
//! data endpoint and the barrier window, `world × (ENDPOINT_LEN + 20)` bytes, its own
//! entry zeroed. Each peer picks the entry at its own rank.

use crate::multi_channel::PeerTransport;
use crate::qp::Rc;
use std::net::TcpListener;
use std::time::Duration;
use std::vec::Vec;

use super::{Node, NodeError, PreparedNode};
use crate::bootstrap::tcp::{deadline_after, Session};
use crate::bootstrap::{Bootstrap, ExchangeError, Meeting, NetworkConfig, Rendezvous};
use crate::mr::RemoteRegion;
use crate::node::wire::{decode_window, encode_window, WINDOW_LEN};
use crate::node::NodeConfig;
use crate::provider::Provider;
use crate::qp::{Endpoint, ENDPOINT_LEN};
use crate::{Context, ProtectionDomain};

const ENTRY: usize = ENDPOINT_LEN + WINDOW_LEN;

/// A connected node and every rank's app bytes, indexed by rank.
pub type Connected<P, const PEERS: usize, const DEPTH: usize, const SGES: usize, T = Rc> =
    Result<(Node<P, PEERS, DEPTH, SGES, T>, Vec<Vec<u8>>), NodeError<<P as Provider>::Error>>;

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES, T>
{
    /// Detection, rendezvous and connection in one call: prepares rank `bootstrap.rank`
    /// of `bootstrap.world` ([`prepare`](Self::prepare)) and connects it where
    /// `bootstrap` says the ranks meet
    /// ([`connect_bootstrap`](PreparedNode::connect_bootstrap)). `timeout` bounds the
    /// connection.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sim")] {
    /// use std::time::Duration;
    /// use zverbs::bootstrap::Bootstrap;
    /// use zverbs::node::{Node, NodeConfig};
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::Context;
    ///
    /// // Under `srun`, `mpirun`, `mpiexec`, torchrun, or `ZVERBS_RANK`/`_WORLD_SIZE`/`_ROOT`:
    /// let bootstrap = Bootstrap::from_env()?;
    /// let sim = Sim::with_devices(bootstrap.world as usize);
    /// let ctx = Context::open(&sim, &format!("sim{}", bootstrap.rank))?;
    /// let pd = ctx.alloc_pd()?;
    /// let cfg = NodeConfig::default();
    /// let (mut node, _) =
    ///     Node::<Sim, 64>::bootstrap(&ctx, &pd, &bootstrap, &cfg, &[], Duration::from_secs(60))?;
    /// node.barrier_all()?;
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`prepare`](Self::prepare) and
    /// [`connect_bootstrap`](PreparedNode::connect_bootstrap).
    pub fn bootstrap(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        bootstrap: &Bootstrap,
        config: &NodeConfig,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        let (rank, world) = (bootstrap.rank as usize, bootstrap.world as usize);
        Self::prepare(ctx, pd, rank, world, config)?.connect_bootstrap(bootstrap, app, timeout)
    }
}

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    PreparedNode<P, PEERS, DEPTH, SGES, T>
{
    /// Connects where `bootstrap` says the ranks meet: through its rendezvous
    /// ([`connect_rendezvous`](Self::connect_rendezvous)) or all-to-all at the addresses
    /// of its configuration ([`connect_tcp`](Self::connect_tcp)).
    ///
    /// # Errors
    /// [`NodeError::InvalidRank`] when `bootstrap` places this process at another rank or
    /// in another world than this node's; otherwise as the call it makes.
    pub fn connect_bootstrap(
        self,
        bootstrap: &Bootstrap,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        let (rank, world) = (self.map.rank, self.map.world);
        if bootstrap.rank as usize != rank || bootstrap.world as usize != world {
            return Err(NodeError::InvalidRank {
                rank: bootstrap.rank as usize,
                world: bootstrap.world as usize,
            });
        }
        match &bootstrap.meeting {
            Meeting::Rendezvous(rv) => self.connect_rendezvous(rv, app, timeout),
            Meeting::Config(config) => self.connect_tcp(config, app, timeout),
        }
    }

    /// This node's endpoint table (see the module docs).
    pub fn endpoint_table(&self) -> Vec<u8> {
        let mut table = vec![0u8; self.map.world * ENTRY];
        for (p, entry) in table.chunks_exact_mut(ENTRY).enumerate() {
            if let Ok(made) = self.endpoints(p) {
                entry.copy_from_slice(&encode_entry(made));
            }
        }
        table
    }

    /// Connects using every rank's endpoint table, indexed by rank (this node's own entry
    /// is ignored), as [`exchange`](crate::bootstrap::exchange) returns them.
    pub fn connect_tables(
        self,
        tables: &[Vec<u8>],
    ) -> Result<Node<P, PEERS, DEPTH, SGES, T>, NodeError<P::Error>> {
        if tables.len() != self.map.world {
            return Err(NodeError::EndpointTable {
                peer: tables.len(),
                why: "one table per rank expected",
            });
        }
        let (rank, world) = (self.map.rank, self.map.world);
        let mut eps = [None; PEERS];
        for i in self.map.indices() {
            let p = self.map.rank_of(i);
            let table = &tables[p];
            if table.len() != world * ENTRY {
                return Err(NodeError::EndpointTable {
                    peer: p,
                    why: "wrong length for this world",
                });
            }
            eps[i] = Some(decode_entry(p, &table[rank * ENTRY..][..ENTRY])?);
        }
        let map = self.map;
        self.connect(|p| eps[map.index(p)?])
    }

    /// Exchanges endpoint tables with every rank of `config` over TCP (binding this rank's
    /// configured address), connects, then waits until every rank has connected: it
    /// returns only when every rank's queue pairs are at RTS, so a send or
    /// [`barrier_all`](Node::barrier_all) right after it finds every peer ready to
    /// receive. `config` must have one entry per rank.
    ///
    /// `app` rides along (e.g. the addresses and keys of regions peers will access); every
    /// rank's `app` bytes come back indexed by rank.
    ///
    /// `timeout` bounds the whole call: the exchange, the local connect and the readiness
    /// round (see [`bootstrap::tcp`](crate::bootstrap::tcp#readiness-round)). A rank that
    /// could not connect its queue pairs tells the others, which fail at once with
    /// [`ExchangeError::NotReady`] naming it;
    /// ranks not ready by the deadline are named the same way. Once it returns `Ok`, every
    /// rank is past the exchange (each said it was ready), so this rank may start another
    /// `connect_tcp` on the same ports at once: its connections cannot reach a peer still
    /// accepting for this one.
    pub fn connect_tcp(
        self,
        config: &NetworkConfig,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        let deadline = deadline_after(timeout);
        self.check_config(config)?;
        let payload = self.payload(app);
        let session = Session::open(config, self.map.rank as u32, None, &payload, deadline)
            .map_err(NodeError::Exchange)?;
        self.connect_session(session)
    }

    /// Like [`connect_tcp`](Self::connect_tcp), on a listener already bound to this rank's
    /// configured port.
    pub fn connect_tcp_with_listener(
        self,
        config: &NetworkConfig,
        listener: &TcpListener,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        let deadline = deadline_after(timeout);
        self.check_config(config)?;
        let payload = self.payload(app);
        let session = Session::open(
            config,
            self.map.rank as u32,
            Some(listener),
            &payload,
            deadline,
        )
        .map_err(NodeError::Exchange)?;
        self.connect_session(session)
    }

    /// Connects with the session's payloads, then runs its readiness round: ready if the
    /// local connect succeeded (every queue pair at RTS), else tells the peers and returns
    /// the local error.
    fn connect_session(self, mut session: Session) -> Connected<P, PEERS, DEPTH, SGES, T> {
        match self.connect_payloads(session.take_payloads()) {
            Ok(connected) => {
                session.confirm(true).map_err(NodeError::Exchange)?;
                Ok(connected)
            }
            Err(e) => {
                // Best effort; this rank's own error is the one to report.
                let _ = session.confirm(false);
                Err(e)
            }
        }
    }

    /// Hands each peer, through the root of `rendezvous` (see [`Rendezvous::route`]), the
    /// endpoints this node made for it, connects with those the peers made for it, then
    /// gathers a ready byte per rank, so that, as [`connect_tcp`](Self::connect_tcp), it
    /// returns only when every rank's queue pairs are at RTS. `app` (at most
    /// [`MAX_RENDEZVOUS_PAYLOAD`](crate::bootstrap::MAX_RENDEZVOUS_PAYLOAD) bytes) rides
    /// along and every rank's comes back, by rank. The world of `rendezvous` must be this
    /// node's; `timeout` bounds the whole call.
    ///
    /// A rank sends and receives endpoints for its peers only, `ENDPOINT_LEN + 20` bytes
    /// each: a node of few peers in a large world (`prepare_with_peers`) moves little.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// use std::net::TcpListener;
    /// use std::time::Duration;
    /// use zverbs::bootstrap::Rendezvous;
    /// use zverbs::node::{Node, NodeConfig};
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::Context;
    ///
    /// let sim = Sim::with_devices(3);
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let rv = Rendezvous { root: listener.local_addr()?, id: 42, world: 3 };
    /// let listener = &listener;
    /// std::thread::scope(|s| {
    ///     for rank in 0..3 {
    ///         let sim = sim.clone();
    ///         s.spawn(move || {
    ///             let ctx = Context::open(&sim, &format!("sim{rank}")).unwrap();
    ///             let pd = ctx.alloc_pd().unwrap();
    ///             let node = Node::<Sim, 4>::prepare(&ctx, &pd, rank, 3, &NodeConfig::default()).unwrap();
    ///             let t = Duration::from_secs(10);
    ///             let (mut node, _) = match rank {
    ///                 0 => node.connect_rendezvous_on(&rv, listener, &[], t),
    ///                 _ => node.connect_rendezvous(&rv, &[], t),
    ///             }
    ///             .unwrap();
    ///             node.barrier_all().unwrap();
    ///         });
    ///     }
    /// });
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`NodeError::InvalidRank`] for a rendezvous of another world;
    /// [`NodeError::Exchange`] for the rendezvous's own (a timeout naming the ranks not
    /// heard from, a peer out of protocol), or [`ExchangeError::NotReady`] naming the ranks
    /// that could not connect; the local connect's error.
    pub fn connect_rendezvous(
        self,
        rendezvous: &Rendezvous,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        self.rendezvous(rendezvous, None, app, timeout)
    }

    /// As [`connect_rendezvous`](Self::connect_rendezvous) for rank 0, on a listener the
    /// caller bound to the root's port.
    pub fn connect_rendezvous_on(
        self,
        rendezvous: &Rendezvous,
        listener: &TcpListener,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        self.rendezvous(rendezvous, Some(listener), app, timeout)
    }

    fn rendezvous(
        self,
        rv: &Rendezvous,
        listener: Option<&TcpListener>,
        app: &[u8],
        timeout: Duration,
    ) -> Connected<P, PEERS, DEPTH, SGES, T> {
        let deadline = deadline_after(timeout);
        let (rank, world) = (self.map.rank, self.map.world);
        if rv.world as usize != world {
            return Err(NodeError::InvalidRank {
                rank,
                world: rv.world as usize,
            });
        }
        // One listener at the root for both rounds (see `Rendezvous::listen`).
        let bound = match listener {
            None if rank == 0 => Some(rv.listen().map_err(NodeError::Exchange)?),
            _ => None,
        };
        let listener = listener.or(bound.as_ref());
        let gather = |payload: &[u8]| {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match listener {
                Some(l) => rv.all_gather_on(l, payload, left),
                None => rv.all_gather(rank as u32, payload, left),
            }
            .map_err(NodeError::Exchange)
        };
        // A parcel per peer: the endpoints this node made for it.
        let mut parcels: Vec<(u32, [u8; ENTRY])> = Vec::new();
        for i in self.map.indices() {
            let p = self.map.rank_of(i);
            if let Ok(made) = self.endpoints(p) {
                parcels.push((p as u32, encode_entry(made)));
            }
        }
        parcels.sort_unstable_by_key(|&(p, _)| p);
        let parcels: Vec<(u32, &[u8])> = parcels.iter().map(|(p, e)| (*p, &e[..])).collect();
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let routed = match listener {
            Some(l) => rv.route_on(l, app, &parcels, left()),
            None => rv.route(rank as u32, app, &parcels, left()),
        }
        .map_err(NodeError::Exchange)?;
        let connected = self
            .connect_routed(routed.parcels)
            .map(|node| (node, routed.all));
        let ready = gather(&[u8::from(connected.is_ok())]);
        let connected = connected?;
        let ready = ready?;
        let failed: Vec<u32> = (0u32..)
            .zip(&ready)
            .filter(|(_, r)| r.as_slice() != [1])
            .map(|(r, _)| r)
            .collect();
        if !failed.is_empty() {
            return Err(NodeError::Exchange(ExchangeError::NotReady {
                failed,
                waiting_for: Vec::new(),
            }));
        }
        Ok(connected)
    }

    /// Connects with the endpoints each peer addressed to this node.
    fn connect_routed(
        self,
        parcels: Vec<(u32, Vec<u8>)>,
    ) -> Result<Node<P, PEERS, DEPTH, SGES, T>, NodeError<P::Error>> {
        let mut eps = [None; PEERS];
        for (from, entry) in parcels {
            let p = from as usize;
            let i = self.map.index(p).ok_or(NodeError::EndpointTable {
                peer: p,
                why: "endpoints from a rank that is no peer",
            })?;
            if entry.len() != ENTRY {
                return Err(NodeError::EndpointTable {
                    peer: p,
                    why: "endpoints of the wrong length",
                });
            }
            eps[i] = Some(decode_entry(p, &entry)?);
        }
        let map = self.map;
        self.connect(|p| eps[map.index(p)?])
    }

    fn payload(&self, app: &[u8]) -> Vec<u8> {
        let mut payload = self.endpoint_table();
        payload.extend_from_slice(app);
        payload
    }

    /// Splits every payload into its endpoint table and the app bytes, then connects.
    fn connect_payloads(self, mut payloads: Vec<Vec<u8>>) -> Connected<P, PEERS, DEPTH, SGES, T> {
        let table_len = self.map.world * ENTRY;
        let mut apps = Vec::with_capacity(payloads.len());
        for (peer, p) in payloads.iter_mut().enumerate() {
            if p.len() < table_len {
                return Err(NodeError::EndpointTable {
                    peer,
                    why: "shorter than an endpoint table",
                });
            }
            apps.push(p.split_off(table_len));
        }
        Ok((self.connect_tables(&payloads)?, apps))
    }

    fn check_config(&self, config: &NetworkConfig) -> Result<(), NodeError<P::Error>> {
        if config.len() != self.map.world {
            return Err(NodeError::InvalidRank {
                rank: self.map.rank,
                world: config.len(),
            });
        }
        Ok(())
    }
}

/// The entry of what a node made for a peer: data endpoint, barrier window.
fn encode_entry((data, window): (Endpoint, RemoteRegion)) -> [u8; ENTRY] {
    let mut entry = [0u8; ENTRY];
    entry[..ENDPOINT_LEN].copy_from_slice(&data.encode());
    entry[ENDPOINT_LEN..].copy_from_slice(&encode_window(&window));
    entry
}

/// The data endpoint and barrier window in `entry`, which `peer` made for this node.
fn decode_entry<E>(peer: usize, entry: &[u8]) -> Result<(Endpoint, RemoteRegion), NodeError<E>> {
    let bad = |why| NodeError::EndpointTable { peer, why };
    let data = Endpoint::decode(&entry[..ENDPOINT_LEN]).map_err(|_| bad("bad data endpoint"))?;
    let window = decode_window(&entry[ENDPOINT_LEN..]).ok_or(bad("bad barrier window"))?;
    Ok((data, window))
}
