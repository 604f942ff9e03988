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

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::config::NetworkConfig;
use super::frame::{encode_frame, read_frame, FrameError, MAX_PAYLOAD};
use crate::error::ErrorKind;

/// How often a blocked read wakes to check the deadline and the stop flag.
const READ_SLICE: Duration = Duration::from_millis(20);
/// How often the accept loop polls its non-blocking listener.
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// First pause between connect attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between connect attempts.
const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// Longest single connect attempt.
const CONNECT_ATTEMPT_MAX: Duration = Duration::from_secs(1);

/// Why an exchange failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The caller's rank is not in the configuration.
    NoSuchRank {
        /// The rank given.
        rank: u32,
        /// Number of ranks configured.
        len: usize,
    },
    /// The caller's payload is longer than [`MAX_PAYLOAD`].
    PayloadTooLarge {
        /// Its length.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// The configured address could not be bound.
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// [`exchange_with_listener`]: the listener is not on the configured port.
    ListenerMismatch {
        /// The configured address.
        configured: SocketAddr,
        /// The address the listener is bound to.
        bound: SocketAddr,
    },
    /// The deadline passed before these ranks had completed their exchange.
    Timeout {
        /// The ranks not heard from, ascending.
        waiting_for: Vec<u32>,
    },
    /// A peer's frame does not open with the right magic.
    WrongMagic {
        /// The peer's address.
        peer: SocketAddr,
        /// The magic it sent.
        got: [u8; 4],
    },
    /// A peer's frame has a version this library does not read.
    WrongVersion {
        /// The peer's address.
        peer: SocketAddr,
        /// The version it sent.
        got: u16,
    },
    /// A peer claims a rank it may not have: not the rank it was dialled as, or (on an
    /// accepted connection) not one of the lower ranks that dial this one.
    UnexpectedRank {
        /// The peer's address.
        peer: SocketAddr,
        /// The ranks that were acceptable.
        expected: Range<u32>,
        /// The rank it claimed.
        got: u32,
    },
    /// A second connection claims a rank already heard from.
    DuplicatePeer {
        /// The rank.
        rank: u32,
        /// The address of the second connection.
        peer: SocketAddr,
    },
    /// A peer claims a payload longer than [`MAX_PAYLOAD`] (nothing was allocated for it).
    Oversized {
        /// The peer's address.
        peer: SocketAddr,
        /// The length it claimed.
        claimed: u64,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// A peer closed the connection inside its frame.
    Truncated {
        /// The peer's address.
        peer: SocketAddr,
        /// Bytes its frame needs, as far as known.
        needed: usize,
        /// Bytes it sent.
        got: usize,
    },
    /// The readiness round after the exchange (see the [module docs](self#readiness-round))
    /// did not end with every rank ready.
    NotReady {
        /// Ranks that reported they could not connect their queue pairs, ascending.
        failed: Vec<u32>,
        /// Ranks not heard from when the round ended (at the deadline, or at once after a
        /// failure report), ascending.
        waiting_for: Vec<u32>,
    },
    /// A socket operation failed.
    Io {
        /// The peer's address, when the failure concerns one connection.
        peer: Option<SocketAddr>,
        /// What the OS said.
        source: io::Error,
    },
}

impl ExchangeError {
    /// What the error means in the crate-wide classification: a deadline that passed is
    /// [`Timeout`](ErrorKind::Timeout) (also a readiness round that only waited), bad
    /// arguments are [`InvalidArgument`](ErrorKind::InvalidArgument), anything a peer got
    /// wrong or the OS refused is [`Other`](ErrorKind::Other).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ExchangeError::Timeout { .. } => ErrorKind::Timeout,
            ExchangeError::NotReady { failed, .. } if failed.is_empty() => ErrorKind::Timeout,
            ExchangeError::NoSuchRank { .. }
            | ExchangeError::PayloadTooLarge { .. }
            | ExchangeError::ListenerMismatch { .. } => ErrorKind::InvalidArgument,
            _ => ErrorKind::Other,
        }
    }
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::NoSuchRank { rank, len } => {
                write!(f, "rank {rank} is not in a network of {len} ranks")
            }
            ExchangeError::PayloadTooLarge { len, max } => {
                write!(f, "payload of {len} bytes exceeds the {max}-byte limit")
            }
            ExchangeError::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            ExchangeError::ListenerMismatch { configured, bound } => {
                write!(
                    f,
                    "listener is bound to {bound}, but the config says {configured}"
                )
            }
            ExchangeError::Timeout { waiting_for } => {
                write!(f, "exchange timed out waiting for ranks {waiting_for:?}")
            }
            ExchangeError::WrongMagic { peer, got } => {
                write!(f, "peer {peer} sent bad frame magic {got:02x?}")
            }
            ExchangeError::WrongVersion { peer, got } => write!(
                f,
                "peer {peer} sent frame version {got} (this library reads {})",
                super::frame::FRAME_VERSION
            ),
            ExchangeError::UnexpectedRank {
                peer,
                expected,
                got,
            } => {
                if expected.len() == 1 {
                    write!(
                        f,
                        "peer {peer} claims rank {got}, expected rank {}",
                        expected.start
                    )
                } else {
                    write!(
                        f,
                        "peer {peer} claims rank {got}, expected a rank in {}..{}",
                        expected.start, expected.end
                    )
                }
            }
            ExchangeError::DuplicatePeer { rank, peer } => {
                write!(f, "peer {peer} claims rank {rank}, which already connected")
            }
            ExchangeError::Oversized { peer, claimed, max } => write!(
                f,
                "peer {peer} claims a {claimed}-byte payload, over the {max}-byte limit"
            ),
            ExchangeError::Truncated { peer, needed, got } => write!(
                f,
                "peer {peer} closed the connection after {got} of {needed} frame bytes"
            ),
            ExchangeError::NotReady {
                failed,
                waiting_for,
            } => {
                if failed.is_empty() {
                    write!(
                        f,
                        "timed out waiting for ranks {waiting_for:?} to report their queue pairs ready"
                    )
                } else {
                    write!(
                        f,
                        "ranks {failed:?} could not connect their queue pairs \
                         (not heard from: {waiting_for:?})"
                    )
                }
            }
            ExchangeError::Io {
                peer: Some(peer),
                source,
            } => write!(f, "exchange with {peer} failed: {source}"),
            ExchangeError::Io { peer: None, source } => write!(f, "exchange failed: {source}"),
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Bind { source, .. } | ExchangeError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

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

/// What the exchange has gathered so far.
struct State {
    /// Payloads received, by rank.
    got: Vec<Option<Vec<u8>>>,
    /// Ranks claimed by an accepted connection.
    claimed: Vec<bool>,
    /// The connection each rank was heard on, kept for the readiness round.
    conns: Vec<Option<(TcpStream, SocketAddr)>>,
    /// The first failure.
    error: Option<ExchangeError>,
}

/// State shared by the threads of one exchange.
struct Shared<'a> {
    my_rank: u32,
    deadline: Instant,
    /// Set on the first failure, or once every rank has been heard from: everyone winds
    /// down.
    stop: AtomicBool,
    /// Every rank has been heard from: later failures (strangers) are not reported.
    complete: AtomicBool,
    /// This rank's encoded frame.
    frame: &'a [u8],
    state: Mutex<State>,
}

/// Why a connection's work ended early.
enum Halt {
    /// The deadline passed or another connection failed; nothing to report.
    Stopped,
    /// This connection failed.
    Failed(ExchangeError),
}

/// The payload of the `io::Error` a guarded read returns once it has to stop.
#[derive(Debug)]
struct StopSignal;

impl fmt::Display for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("exchange stopped")
    }
}

impl std::error::Error for StopSignal {}

fn is_stop(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<StopSignal>())
}

impl<'a> Shared<'a> {
    fn new(my_rank: u32, deadline: Instant, frame: &'a [u8], n: usize) -> Self {
        Shared {
            my_rank,
            deadline,
            stop: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            frame,
            state: Mutex::new(State {
                got: vec![None; n],
                claimed: vec![false; n],
                conns: (0..n).map(|_| None).collect(),
                error: None,
            }),
        }
    }

    fn into_state(self) -> State {
        self.state.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking thread cannot leave `State` inconsistent: every update is one store.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time left, or `None` once the deadline has passed or the exchange is stopping.
    fn remaining(&self) -> Option<Duration> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let left = self.deadline.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then_some(left)
    }

    fn fail(&self, e: ExchangeError) {
        let mut s = self.state();
        if s.error.is_none() && !self.complete.load(Ordering::Relaxed) {
            s.error = Some(e);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Records `rank`'s payload (and the connection it came on); the last one stops every
    /// other connection.
    fn finish(&self, rank: u32, payload: Vec<u8>, conn: Option<(TcpStream, SocketAddr)>) {
        let mut guard = self.state();
        let s = &mut *guard;
        let r = rank as usize;
        if let (Some(slot), Some(c)) = (s.got.get_mut(r), s.conns.get_mut(r)) {
            *slot = Some(payload);
            *c = conn;
        }
        let me = self.my_rank as usize;
        let all = s
            .got
            .iter()
            .enumerate()
            .all(|(i, p)| i == me || p.is_some());
        // Under the lock: a failure recorded before this is kept, any later one ignored.
        if all && s.error.is_none() {
            self.complete.store(true, Ordering::Relaxed);
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Every lower rank has been heard from.
    fn accepts_done(&self) -> bool {
        self.state().got[..self.my_rank as usize]
            .iter()
            .all(Option::is_some)
    }

    fn report(&self, r: Result<(), Halt>) {
        if let Err(Halt::Failed(e)) = r {
            self.fail(e);
        }
    }
}

/// One connection, whose reads and writes are bounded by the exchange's deadline.
struct Conn<'s, 'a> {
    stream: TcpStream,
    peer: SocketAddr,
    shared: &'s Shared<'a>,
}

impl<'s, 'a> Conn<'s, 'a> {
    fn new(stream: TcpStream, peer: SocketAddr, shared: &'s Shared<'a>) -> Result<Self, Halt> {
        let io = |source| {
            Halt::Failed(ExchangeError::Io {
                peer: Some(peer),
                source,
            })
        };
        stream.set_nonblocking(false).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        Ok(Conn {
            stream,
            peer,
            shared,
        })
    }

    fn send_frame(&mut self) -> Result<(), Halt> {
        let left = self.shared.remaining().ok_or(Halt::Stopped)?;
        let r = self
            .stream
            .set_write_timeout(Some(left))
            .and_then(|()| self.stream.write_all(self.shared.frame))
            .and_then(|()| self.stream.flush());
        r.map_err(|source| match source.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                if self.shared.remaining().is_none() =>
            {
                Halt::Stopped
            }
            _ => Halt::Failed(ExchangeError::Io {
                peer: Some(self.peer),
                source,
            }),
        })
    }

    fn recv_frame(&mut self) -> Result<(u32, Vec<u8>), Halt> {
        let peer = self.peer;
        read_frame(self).map_err(|e| {
            Halt::Failed(match e {
                FrameError::BadMagic(got) => ExchangeError::WrongMagic { peer, got },
                FrameError::UnsupportedVersion(got) => ExchangeError::WrongVersion { peer, got },
                FrameError::Oversized { claimed, max } => {
                    ExchangeError::Oversized { peer, claimed, max }
                }
                FrameError::Truncated { needed, got } => {
                    ExchangeError::Truncated { peer, needed, got }
                }
                FrameError::Io(e) if is_stop(&e) => return Halt::Stopped,
                FrameError::Io(source) => ExchangeError::Io {
                    peer: Some(peer),
                    source,
                },
            })
        })
    }
}

impl Read for Conn<'_, '_> {
    /// Reads in slices of at most [`READ_SLICE`], giving up with a [`StopSignal`] error
    /// once the deadline passes or the exchange stops.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(left) = self.shared.remaining() else {
                return Err(io::Error::new(io::ErrorKind::TimedOut, StopSignal));
            };
            self.stream.set_read_timeout(Some(left.min(READ_SLICE)))?;
            match self.stream.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                r => return r,
            }
        }
    }
}

/// A connect on loopback to a port nobody listens on can, rarely, connect the socket to
/// itself (TCP simultaneous open, when the kernel picks the destination port as the
/// source port). Such a connection is no peer.
fn is_self_connection(s: &TcpStream) -> bool {
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
fn spawn<'scope, 'env: 'scope>(
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

/// Every rank's payload and the connection to every other rank, by rank.
type Gathered = (Vec<Vec<u8>>, Vec<Option<(TcpStream, SocketAddr)>>);

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
        while !shared.accepts_done() && shared.remaining().is_some() {
            match listener.accept() {
                Ok((stream, peer)) => {
                    spawn(scope, shared, format!("zverbs-serve-{peer}"), move || {
                        serve(shared, stream, peer)
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(source) => shared.fail(ExchangeError::Io { peer: None, source }),
            }
        }
    });
    // Best effort: leave a caller's listener blocking, as it was bound.
    let _ = listener.set_nonblocking(false);
    let State {
        mut got,
        conns,
        error,
        ..
    } = shared_val.into_state();
    if let Some(e) = error {
        return Err(e);
    }
    got[my_rank as usize] = Some(payload.to_vec());
    let waiting_for: Vec<u32> = (0u32..)
        .zip(&got)
        .filter(|(_, p)| p.is_none())
        .map(|(r, _)| r)
        .collect();
    if !waiting_for.is_empty() {
        return Err(ExchangeError::Timeout { waiting_for });
    }
    Ok((
        got.into_iter().map(Option::unwrap_or_default).collect(),
        conns,
    ))
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
