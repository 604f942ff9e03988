//! Connections to many peers in one call, meeting where a [`Bootstrap`] says: through its
//! root rendezvous (each rank hands each peer the endpoints it made for it, as a parcel) or
//! all-to-all over its configuration; then a readiness round, so that no rank returns
//! before every rank's queue pairs are at RTS. One deadline bounds all of it.

use std::net::TcpListener;

use tokio::time::Instant;

use super::connect::{blocking, ConnectError, UNBOUNDED};
use super::remote::{Connection, Half};
use crate::bootstrap::tcp::Session;
use crate::bootstrap::{Bootstrap, ExchangeError, Meeting, Rendezvous};
use crate::channel::ChannelConfig;
use crate::provider::Provider;
use crate::qp::ENDPOINT_LEN;

/// A peer's endpoints as this rank hands them over: the peer's rank (big-endian), then the
/// data and control endpoints made for it.
const RECORD: usize = 4 + 2 * ENDPOINT_LEN;

impl<P: Provider + 'static> Connection<P> {
    /// A connection to each rank of `peers`, in ascending rank order, every one set up as
    /// [`connect`](Self::connect) sets up one, meeting where `bootstrap` says instead of
    /// over a TCP connection per peer. Every rank of the world calls it (the meeting is
    /// collective), each naming its own peers (any order; repeats count once); a rank
    /// named as a peer names this rank back. `config.timeout` bounds the whole call.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sim")] {
    /// use zverbs::bootstrap::Bootstrap;
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::tokio::Connection;
    /// use zverbs::ChannelConfig;
    ///
    /// # async fn run(sim: &Sim) -> Result<(), Box<dyn std::error::Error>> {
    /// // Under `srun`, `mpirun`, `mpiexec`, torchrun or `ZVERBS_*`: a ring.
    /// let b = Bootstrap::from_env()?;
    /// let (left, right) = ((b.rank + b.world - 1) % b.world, (b.rank + 1) % b.world);
    /// let device = format!("sim{}", b.rank);
    /// let cfg = ChannelConfig::default();
    /// let ring = Connection::bootstrap(sim, &device, &b, &[left, right], 1 << 20, &cfg).await?;
    /// # Ok(()) }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ConnectError::Exchange`] for the meeting's own errors (a timeout naming the ranks
    /// not heard from, a peer out of protocol; a rank in `peers` that is this one or not in
    /// the world: [`ExchangeError::NoSuchRank`]; ranks that could not connect:
    /// [`ExchangeError::NotReady`]); [`ConnectError::Unpaired`] for a peer that named no
    /// endpoints for this rank; a verb's error while preparing or connecting.
    pub async fn bootstrap(
        provider: &P,
        device: &str,
        bootstrap: &Bootstrap,
        peers: &[u32],
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Vec<Connection<P>>, ConnectError<P::Error>> {
        let deadline = Instant::now() + config.timeout.unwrap_or(UNBOUNDED);
        let (rank, world) = (bootstrap.rank, bootstrap.world);
        let mut peers = peers.to_vec();
        peers.sort_unstable();
        peers.dedup();
        if let Some(&p) = peers.iter().find(|&&p| p == rank || p >= world) {
            let len = world as usize;
            return Err(ConnectError::Exchange(ExchangeError::NoSuchRank {
                rank: p,
                len,
            }));
        }
        let halves = peers
            .iter()
            .map(|_| Half::open(provider, device, pool_bytes, config))
            .collect::<Result<Vec<_>, _>>()?;
        let mine: Vec<(u32, Vec<u8>)> = peers
            .iter()
            .zip(&halves)
            .map(|(&p, h)| (p, h.endpoints().to_vec()))
            .collect();
        let (theirs, round) = meet(bootstrap, mine, deadline).await?;
        let mut connected = Vec::with_capacity(peers.len());
        let mut failed = None;
        for (half, &p) in halves.into_iter().zip(&peers) {
            let entry = theirs.iter().find(|(from, _)| *from == p);
            let joined = match entry {
                Some((_, e)) => half.join(e).and_then(Connection::assemble),
                None => Err(ConnectError::Unpaired { peer: p }),
            };
            match joined {
                Ok(c) => connected.push(c),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let ready = ready_round(round, rank, failed.is_none(), deadline).await;
        if let Some(e) = failed {
            return Err(e);
        }
        ready?;
        Ok(connected)
    }
}

/// Where the readiness round runs: at the rendezvous again, or on the connections of the
/// all-to-all exchange (which a second exchange on the same ports could not follow at
/// once: a rank done with the first may dial a peer still accepting for it).
enum Round {
    /// The rendezvous, and at the root its listener.
    Rendezvous(Rendezvous, Option<TcpListener>),
    Session(Session),
}

/// Hands each peer its endpoints where `bootstrap` says the ranks meet; the endpoints
/// each peer made for this rank, by the peer's rank, and where to say ready.
async fn meet<E>(
    bootstrap: &Bootstrap,
    mine: Vec<(u32, Vec<u8>)>,
    deadline: Instant,
) -> Result<(Vec<(u32, Vec<u8>)>, Round), ConnectError<E>> {
    let rank = bootstrap.rank;
    match bootstrap.meeting.clone() {
        Meeting::Rendezvous(rv) => {
            let left = deadline.saturating_duration_since(Instant::now());
            // The root listens once for both rounds (see `Rendezvous::listen`).
            let root = match rank {
                0 => Some(rv.listen().map_err(ConnectError::Exchange)?),
                _ => None,
            };
            let (theirs, root) = blocking(
                move || {
                    let parcels: Vec<(u32, &[u8])> =
                        mine.iter().map(|(p, e)| (*p, &e[..])).collect();
                    match &root {
                        Some(l) => rv.route_on(l, &[], &parcels, left),
                        None => rv.route(rank, &[], &parcels, left),
                    }
                    .map(|r| (r.parcels, root))
                },
                ConnectError::Exchange,
            )
            .await?;
            Ok((theirs, Round::Rendezvous(rv, root)))
        }
        Meeting::Config(config) => {
            let mut payload = Vec::with_capacity(mine.len() * RECORD);
            for (p, e) in &mine {
                payload.extend_from_slice(&p.to_be_bytes());
                payload.extend_from_slice(e);
            }
            let deadline = deadline.into_std();
            let mut session = blocking(
                move || Session::open(&config, rank, None, &payload, deadline),
                ConnectError::Exchange,
            )
            .await?;
            // From each rank, the record addressed to this one, if any.
            let addressed = |(from, records): (u32, Vec<u8>)| {
                records
                    .chunks_exact(RECORD)
                    .find(|r| r[..4] == rank.to_be_bytes())
                    .map(|r| (from, r[4..].to_vec()))
            };
            let theirs = (0u32..)
                .zip(session.take_payloads())
                .filter_map(addressed)
                .collect();
            Ok((theirs, Round::Session(session)))
        }
    }
}

/// Says whether this rank is `ready` and waits for every rank's say.
async fn ready_round<E>(
    round: Round,
    rank: u32,
    ready: bool,
    deadline: Instant,
) -> Result<(), ConnectError<E>> {
    let (rv, root) = match round {
        Round::Session(session) => {
            return blocking(move || session.confirm(ready), ConnectError::Exchange).await
        }
        Round::Rendezvous(rv, root) => (rv, root),
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let say = [u8::from(ready)];
    let all = blocking(
        move || match &root {
            Some(l) => rv.all_gather_on(l, &say, left),
            None => rv.all_gather(rank, &say, left),
        },
        ConnectError::Exchange,
    )
    .await?;
    let failed: Vec<u32> = (0u32..)
        .zip(&all)
        .filter(|(_, r)| r.as_slice() != [1])
        .map(|(r, _)| r)
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(ConnectError::Exchange(ExchangeError::NotReady {
            failed,
            waiting_for: Vec::new(),
        }))
    }
}
