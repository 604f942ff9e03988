//! All-to-all exchange of one payload per rank over TCP.
//!
//! Protocol, for a world of `n` ranks listening on the addresses of a [`NetworkConfig`]:
//!
//! - Every rank binds its configured address first, then rank `i` dials every rank
//!   `j > i` and accepts one connection from every rank `j < i`. Each pair of ranks thus
//!   shares exactly one connection, and only listening ports are configured (outgoing
//!   connections use ephemeral ports), so there are no port conflicts.
//! - On a connection the dialer sends its [frame](super::frame) first; the acceptor reads
//!   it, checks the claimed rank (below its own, not seen before), and only then answers
//!   with its own frame; the dialer checks that the answer comes from the rank it dialled.
//!   Neither side ever writes while the other writes, so large payloads cannot deadlock.
//! - A connect that fails (the peer has not started listening yet) is retried with a
//!   backoff doubling from 5 ms to 100 ms, until the deadline.
//! - Dials and accepted connections each run on their own scoped thread; every connect,
//!   read and write is bounded by the one deadline (`timeout` after the call), and reads
//!   wake every 20 ms to notice the deadline or another connection's failure. The first
//!   failure stops the whole exchange and is returned; a rank that has not completed by
//!   the deadline is listed in [`ExchangeError::Timeout`].
//! - The exchange ends as soon as every rank has been heard from. A connection that has
//!   not delivered a whole frame by then is no rank (a stranger: a port scanner, a stuck
//!   client, a connection that sends nothing or trickles bytes) and is closed then, within
//!   one 20 ms read slice: it neither delays nor fails the exchange.
//!
//! The exchange is strict: until it ends, any connection that sends a malformed frame or
//! claims a rank it may not have fails the exchange, rather than being ignored.
//!
//! # Readiness round
//!
//! [`PreparedNode::connect_tcp`](crate::node::PreparedNode::connect_tcp) keeps the
//! connections of its exchange open (one per pair of ranks) for one more round once its
//! queue pairs are connected: every rank sends each peer a frame with a one-byte payload,
//! `1` (ready: all its queue pairs are at RTS) or `0` (it could not connect), then reads
//! the peer's. The first round's frames were read to their last byte, so the rounds
//! cannot mix; the same deadline bounds both. A rank that reads a `0`, or not every `1`
//! by the deadline, fails with [`ExchangeError::NotReady`] naming the ranks; a rank that
//! could not connect sends its `0`s and returns its own error without waiting.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use super::config::NetworkConfig;
use super::conn::{Conn, Gathered, Halt, Shared, State};
use super::error::ExchangeError;
use super::frame::{encode_frame, MAX_PAYLOAD};

/// How often the accept loop polls its non-blocking listener.
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// First pause between connect attempts.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between connect attempts.
pub(super) const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// Longest single connect attempt.
pub(super) const CONNECT_ATTEMPT_MAX: Duration = Duration::from_secs(1);

/// Exchanges `payload` with every rank of `config`: binds this rank's configured address,
/// connects to every other rank, and returns every rank's payload, indexed by rank (this
/// rank's entry is `payload` itself).
///
/// Peers may start in any order within `timeout`; the call returns by about `timeout`
/// (plus at most ~0.1 s of winding down) whatever the peers do. See the
/// [module documentation](self) for the protocol.
pub fn exchange(
    config: &NetworkConfig,
    my_rank: u32,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, ExchangeError> {
    Session::open(config, my_rank, None, payload, deadline_after(timeout)).map(|s| s.payloads)
}

/// Like [`exchange`], on a listener the caller has already bound to this rank's
/// configured port (e.g. bound early, or bound to port 0 to build the configuration).
pub fn exchange_with_listener(
    config: &NetworkConfig,
    my_rank: u32,
    listener: &TcpListener,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, ExchangeError> {
    Session::open(
        config,
        my_rank,
        Some(listener),
        payload,
        deadline_after(timeout),
    )
    .map(|s| s.payloads)
}

/// A finished exchange whose connections stay open for the readiness round.
pub(crate) struct Session {
    my_rank: u32,
    deadline: Instant,
    /// Every rank's payload, by rank.
    payloads: Vec<Vec<u8>>,
    /// The connection to every other rank and its address, by rank.
    conns: Vec<Option<(TcpStream, SocketAddr)>>,
}

impl Session {
    /// Runs the exchange on `listener`, or on a listener bound to this rank's configured
    /// address, by `deadline`.
    pub(crate) fn open(
        config: &NetworkConfig,
        my_rank: u32,
        listener: Option<&TcpListener>,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<Session, ExchangeError> {
        crate::trace::span!(INFO, "exchange", rank = my_rank, ranks = config.len());
        let configured = check_args(config, my_rank, payload)?;
        if let Some(listener) = listener {
            let bound = listener
                .local_addr()
                .map_err(|source| ExchangeError::Io { peer: None, source })?;
            if bound.port() != configured.port() {
                return Err(ExchangeError::ListenerMismatch { configured, bound });
            }
        }
        if config.len() == 1 {
            return Ok(Session {
                my_rank,
                deadline,
                payloads: vec![payload.to_vec()],
                conns: vec![None],
            });
        }
        let (payloads, conns) = match listener {
            Some(l) => run(config, my_rank, l, payload, deadline)?,
            None => {
                let l = TcpListener::bind(configured).map_err(|source| ExchangeError::Bind {
                    addr: configured,
                    source,
                })?;
                run(config, my_rank, &l, payload, deadline)?
            }
        };
        Ok(Session {
            my_rank,
            deadline,
            payloads,
            conns,
        })
    }

    /// Every rank's payload, by rank (left empty in the session).
    pub(crate) fn take_payloads(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.payloads)
    }

    /// The readiness round (see the [module docs](self#readiness-round)). `ready`: tells
    /// every peer so and waits until each has said it is ready too, by the exchange's
    /// deadline. Not `ready`: tells every peer (best effort) and returns at once.
    pub(crate) fn confirm(self, ready: bool) -> Result<(), ExchangeError> {
        let mut frame = Vec::new();
        let status = if ready { READY } else { NOT_READY };
        encode_frame(self.my_rank, &[status], &mut frame).map_err(|_| {
            ExchangeError::PayloadTooLarge {
                len: 1,
                max: MAX_PAYLOAD,
            }
        })?;
        let shared_val = Shared::new(self.my_rank, self.deadline, &frame, self.conns.len());
        let shared = &shared_val;
        // Every status goes out before any is read: a rank that stops early (on a peer's
        // failure) has still told everyone its own. A frame this small fits the socket
        // buffer, so no write waits for a read. A failed write is not fatal: reading
        // from that peer says what became of it.
        let mut conns = Vec::new();
        for (rank, conn) in (0u32..).zip(self.conns) {
            if let Some((stream, addr)) = conn {
                if let Ok(mut conn) = Conn::new(stream, addr, shared) {
                    let _ = conn.send_frame();
                    conns.push((rank, conn));
                }
            }
        }
        if !ready {
            for (_, conn) in conns {
                let _ = conn.stream.shutdown(std::net::Shutdown::Write);
            }
            return Ok(());
        }
        thread::scope(|scope| {
            for (rank, conn) in conns {
                spawn(scope, shared, format!("zverbs-ready-{rank}"), move || {
                    confirm_one(shared, rank, conn)
                });
            }
        });
        let State { got, error, .. } = shared_val.into_state();
        let mut failed = Vec::new();
        let mut waiting_for = Vec::new();
        for (rank, status) in (0u32..).zip(&got) {
            match status.as_deref() {
                _ if rank == self.my_rank => {}
                Some([READY]) => {}
                Some(_) => failed.push(rank),
                None => waiting_for.push(rank),
            }
        }
        // A peer's own report of failure is the cause to name: a connection that broke
        // meanwhile may be a peer that stopped on that report.
        if failed.is_empty() {
            if let Some(e) = error {
                return Err(e);
            }
        }
        if failed.is_empty() && waiting_for.is_empty() {
            Ok(())
        } else {
            Err(ExchangeError::NotReady {
                failed,
                waiting_for,
            })
        }
    }
}

/// Readiness round payloads.
const READY: u8 = 1;
const NOT_READY: u8 = 0;

/// Reads one peer's readiness. A report of failure stops the round at once; a broken or
/// misbehaving connection is recorded but does not stop the others, so that a peer's
/// report, the likely cause, can still be read.
fn confirm_one(shared: &Shared<'_>, rank: u32, mut conn: Conn<'_, '_>) -> Result<(), Halt> {
    let e = match conn.recv_frame() {
        Ok((got, status)) if got == rank => {
            let ready = status == [READY];
            shared.finish(rank, status, None);
            if !ready {
                shared.stop.store(true, Ordering::Relaxed);
            }
            return Ok(());
        }
        Ok((got, _)) => ExchangeError::UnexpectedRank {
            peer: conn.peer,
            expected: rank..rank.saturating_add(1),
            got,
        },
        Err(Halt::Stopped) => return Ok(()),
        Err(Halt::Failed(e)) => e,
    };
    let mut s = shared.state();
    if s.error.is_none() {
        s.error = Some(e);
    }
    Ok(())
}

pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(1 << 30)))
        .unwrap_or(now)
}

fn check_args(
    config: &NetworkConfig,
    my_rank: u32,
    payload: &[u8],
) -> Result<SocketAddr, ExchangeError> {
    let addr = config.get(my_rank).ok_or(ExchangeError::NoSuchRank {
        rank: my_rank,
        len: config.len(),
    })?;
    if payload.len() > MAX_PAYLOAD {
        return Err(ExchangeError::PayloadTooLarge {
            len: payload.len(),
            max: MAX_PAYLOAD,
        });
    }
    Ok(addr)
}

/// A connect on loopback to a port nobody listens on can, rarely, connect the socket to
/// itself (TCP simultaneous open, when the kernel picks the destination port as the
/// source port). Such a connection is no peer.
pub(super) fn is_self_connection(s: &TcpStream) -> bool {
    matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

/// Dials `rank` at `addr` until it answers or the exchange stops, then trades frames.
fn dial(shared: &Shared<'_>, rank: u32, addr: SocketAddr) -> Result<(), Halt> {
    let mut backoff = BACKOFF_MIN;
    let stream = loop {
        let left = shared.remaining().ok_or(Halt::Stopped)?;
        match TcpStream::connect_timeout(&addr, left.min(CONNECT_ATTEMPT_MAX)) {
            Ok(s) if !is_self_connection(&s) => break s,
            // Not listening yet (refused), unreachable for now, or a self-connection.
            _ => {}
        }
        let left = shared.remaining().ok_or(Halt::Stopped)?;
        thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    };
    let mut conn = Conn::new(stream, addr, shared)?;
    conn.send_frame()?;
    let (got, payload) = conn.recv_frame()?;
    if got != rank {
        return Err(Halt::Failed(ExchangeError::UnexpectedRank {
            peer: addr,
            expected: rank..rank.saturating_add(1),
            got,
        }));
    }
    shared.finish(rank, payload, Some((conn.stream, addr)));
    Ok(())
}

/// Serves one accepted connection: reads the peer's frame, checks its rank, answers.
fn serve(shared: &Shared<'_>, stream: TcpStream, peer: SocketAddr) -> Result<(), Halt> {
    let mut conn = Conn::new(stream, peer, shared)?;
    let (rank, payload) = conn.recv_frame()?;
    if rank >= shared.my_rank {
        return Err(Halt::Failed(ExchangeError::UnexpectedRank {
            peer,
            expected: 0..shared.my_rank,
            got: rank,
        }));
    }
    {
        let mut s = shared.state();
        if s.claimed[rank as usize] {
            return Err(Halt::Failed(ExchangeError::DuplicatePeer { rank, peer }));
        }
        s.claimed[rank as usize] = true;
    }
    conn.send_frame()?;
    shared.finish(rank, payload, Some((conn.stream, peer)));
    Ok(())
}

/// Runs `f` on a scoped thread, recording its failure; a thread that cannot be created
/// fails the exchange (rather than panicking as `Scope::spawn` would).
pub(super) fn spawn<'scope, 'env: 'scope>(
    scope: &'scope thread::Scope<'scope, 'env>,
    shared: &'env Shared<'env>,
    name: String,
    f: impl FnOnce() -> Result<(), Halt> + Send + 'scope,
) {
    let spawned = thread::Builder::new()
        .name(name)
        .spawn_scoped(scope, move || shared.report(f()));
    if let Err(source) = spawned {
        shared.fail(ExchangeError::Io { peer: None, source });
    }
}

fn run(
    config: &NetworkConfig,
    my_rank: u32,
    listener: &TcpListener,
    payload: &[u8],
    deadline: Instant,
) -> Result<Gathered, ExchangeError> {
    let mut frame = Vec::new();
    encode_frame(my_rank, payload, &mut frame).map_err(|_| ExchangeError::PayloadTooLarge {
        len: payload.len(),
        max: MAX_PAYLOAD,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ExchangeError::Io { peer: None, source })?;
    let shared_val = Shared::new(my_rank, deadline, &frame, config.len());
    let shared = &shared_val;
    thread::scope(|scope| {
        for (rank, &addr) in (0u32..).zip(config.addrs()).skip(my_rank as usize + 1) {
            spawn(scope, shared, format!("zverbs-dial-{rank}"), move || {
                dial(shared, rank, addr)
            });
        }
        accept_each(scope, shared, listener, || shared.accepts_done(), serve);
    });
    // Best effort: leave a caller's listener blocking, as it was bound.
    let _ = listener.set_nonblocking(false);
    shared_val.into_state().gathered(my_rank, payload)
}

/// Accepts on the non-blocking `listener` until `done()` holds or the exchange stops,
/// serving each connection on a thread of its own; an accept that fails otherwise than
/// for now fails the exchange.
pub(super) fn accept_each<'scope, 'env: 'scope>(
    scope: &'scope thread::Scope<'scope, 'env>,
    shared: &'env Shared<'env>,
    listener: &TcpListener,
    done: impl Fn() -> bool,
    serve: impl Fn(&'env Shared<'env>, TcpStream, SocketAddr) -> Result<(), Halt> + Copy + Send + 'scope,
) {
    while !done() && shared.remaining().is_some() {
        match listener.accept() {
            Ok((stream, peer)) => spawn(scope, shared, format!("zverbs-serve-{peer}"), move || {
                serve(shared, stream, peer)
            }),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(source) => shared.fail(ExchangeError::Io { peer: None, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens a session for every rank of a loopback world of `n`, each on its own thread,
    /// then runs its readiness round with `ready(rank)`.
    fn rounds(n: usize, ready: fn(u32) -> bool) -> Vec<(Result<(), ExchangeError>, Duration)> {
        let ls: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        let cfg = NetworkConfig::from_addrs(addrs).unwrap();
        let deadline = deadline_after(Duration::from_secs(5));
        thread::scope(|t| {
            let handles: Vec<_> = (0u32..)
                .zip(&ls)
                .map(|(rank, l)| {
                    let cfg = &cfg;
                    t.spawn(move || {
                        let start = Instant::now();
                        let s = Session::open(cfg, rank, Some(l), &[rank as u8], deadline)?;
                        assert_eq!(s.payloads.len(), n);
                        let r = s.confirm(ready(rank));
                        Ok::<_, ExchangeError>((r, start.elapsed()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        })
    }

    #[test]
    fn every_rank_ready() {
        for (r, _) in rounds(3, |_| true) {
            r.unwrap();
        }
    }

    #[test]
    fn a_rank_that_is_not_ready_is_named_at_once() {
        let results = rounds(4, |rank| rank != 1);
        for (rank, (r, took)) in results.into_iter().enumerate() {
            if rank == 1 {
                // The failing rank reports its own error (its caller's); the round is Ok.
                r.unwrap();
            } else {
                let e = r.unwrap_err();
                assert!(
                    matches!(&e, ExchangeError::NotReady { failed, .. } if failed == &[1]),
                    "rank {rank}: {e:?}"
                );
            }
            assert!(took < Duration::from_secs(2), "rank {rank}: {took:?}");
        }
    }
}
