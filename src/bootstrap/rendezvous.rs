//! A root rendezvous (NCCL's bootstrap as the model): every rank connects once to the
//! root, rank 0, sends its payload, and receives every rank's — an all-gather over `N - 1`
//! connections, against the `N(N - 1) / 2` of the all-to-all [`exchange`](super::exchange).
//!
//! What the ranks share is a [`Rendezvous`]: where the root listens, the world size, and
//! an id that names this run (a job id, a random number handed out with the root's
//! address), so that the ranks of two runs meeting at one port never mix.
//!
//! Protocol, in the [frames](super::frame) of the exchanger:
//!
//! - A rank dials the root, retrying with a backoff (5 ms doubling to 100 ms) while the
//!   root is not up yet, and sends one frame: its rank, then a payload of the id (8 bytes,
//!   big-endian), the world size (4 bytes) and its own payload.
//! - The root reads each connection's frame on a thread of its own, each read bounded by
//!   the deadline. A connection whose first bytes are no frame of ours, or whose id is
//!   another run's, is a stranger: that connection ends, the rendezvous goes on. One of
//!   this run (the right id) that claims a rank out of range, a rank already heard from,
//!   or another world size fails the rendezvous with an error naming it. Connections that
//!   say nothing, or trickle, hold nothing up: once every rank has been heard from they are
//!   closed.
//! - Then the root sends every rank the whole table, one frame per rank in rank order, and
//!   each rank checks that frame `i` is rank `i`'s.
//!
//! One deadline bounds the whole rendezvous, for every rank: the call returns within
//! `timeout` (plus a read slice of 20 ms) with every payload, or with a typed error; the
//! root names the ranks it did not hear from.

use std::io::{self, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::conn::{halt, Conn, Halt, Shared};
use super::error::ExchangeError;
use super::frame::{encode_frame, read_frame, MAX_PAYLOAD};
use super::launch::Placement;
use super::tcp::{
    accept_each, deadline_after, is_self_connection, spawn, BACKOFF_MAX, BACKOFF_MIN,
    CONNECT_ATTEMPT_MAX,
};

/// Bytes a hello frame's payload carries before the rank's own: the id and the world size.
const HELLO_HEAD: usize = 12;

/// The backlog the root listens with: every rank of a large world may dial at once, and a
/// full backlog drops their connection requests, which they retry only after a second.
/// (The kernel caps it at `net.core.somaxconn`.)
const BACKLOG: libc::c_int = 4096;

/// The buffer a rank reads the table through.
const TABLE_BUFFER: usize = 1 << 16;

/// The largest payload a rank may bring to a rendezvous.
pub const MAX_RENDEZVOUS_PAYLOAD: usize = MAX_PAYLOAD - HELLO_HEAD;

/// What every rank of one rendezvous agrees on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// Where the root (rank 0) listens.
    pub root: SocketAddr,
    /// The run's id: ranks with another are strangers.
    pub id: u64,
    /// Ranks in the world.
    pub world: u32,
}

impl Rendezvous {
    /// Gathers every rank's payload through the root, by rank (this rank's entry is
    /// `payload`). Rank 0 listens on the root's port (on every address of its family,
    /// so a root named by a host's external address is reached there too); the others
    /// dial it.
    ///
    /// ```
    /// use std::net::TcpListener;
    /// use std::time::Duration;
    /// use zverbs::bootstrap::Rendezvous;
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let rv = Rendezvous { root: listener.local_addr()?, id: 7, world: 3 };
    /// let t = Duration::from_secs(10);
    /// let tables = std::thread::scope(|s| {
    ///     let others: Vec<_> = (1..3u32)
    ///         .map(|r| s.spawn(move || rv.all_gather(r, &[r as u8], t)))
    ///         .collect();
    ///     let mut all = vec![rv.all_gather_on(&listener, b"root", t)];
    ///     all.extend(others.into_iter().map(|h| h.join().unwrap()));
    ///     all
    /// });
    /// for table in tables {
    ///     assert_eq!(table?, [&b"root"[..], &[1], &[2]]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ExchangeError::NoSuchRank`] for a rank outside the world;
    /// [`ExchangeError::PayloadTooLarge`] over [`MAX_RENDEZVOUS_PAYLOAD`];
    /// [`ExchangeError::Bind`] when rank 0 cannot listen; at the root, a rank of this run
    /// that is out of range, heard twice or in another world; at a rank, a table that is
    /// not one frame per rank in order; [`ExchangeError::Timeout`] naming the ranks not
    /// heard from (at a rank: the root) by the deadline.
    pub fn all_gather(
        &self,
        rank: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, ExchangeError> {
        self.check(rank, payload)?;
        let deadline = deadline_after(timeout);
        if rank != 0 {
            return self.join(rank, payload, deadline);
        }
        let any = match self.root.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let addr = SocketAddr::new(any, self.root.port());
        let listener =
            TcpListener::bind(addr).map_err(|source| ExchangeError::Bind { addr, source })?;
        self.serve(&listener, payload, deadline)
    }

    /// As [`all_gather`](Self::all_gather) for rank 0, on a listener the caller bound
    /// (to the root's port, or to port 0 before handing its address out).
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather).
    pub fn all_gather_on(
        &self,
        listener: &TcpListener,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, ExchangeError> {
        self.check(0, payload)?;
        self.serve(listener, payload, deadline_after(timeout))
    }

    /// The rendezvous a launcher's placement names: its root (the first address the host
    /// resolves to), its world, and `id` — any value every rank of the run agrees on (a job
    /// id, or a constant where one run uses the port).
    ///
    /// ```
    /// use zverbs::bootstrap::launch::detect;
    /// use zverbs::bootstrap::Rendezvous;
    ///
    /// let env = |v: &str| match v {
    ///     "RANK" => Some("1".into()),
    ///     "WORLD_SIZE" => Some("4".into()),
    ///     "MASTER_ADDR" => Some("127.0.0.1".into()),
    ///     "MASTER_PORT" => Some("29500".into()),
    ///     _ => None,
    /// };
    /// let rv = Rendezvous::for_placement(&detect(&env)?, 7)?;
    /// assert_eq!((rv.root.to_string(), rv.world), ("127.0.0.1:29500".to_string(), 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ExchangeError::NoRoot`] when the placement names none;
    /// [`ExchangeError::Unresolved`] when its host does not resolve.
    pub fn for_placement(placement: &Placement, id: u64) -> Result<Rendezvous, ExchangeError> {
        let root = placement.root.as_ref().ok_or(ExchangeError::NoRoot)?;
        let unresolved = |source| ExchangeError::Unresolved {
            root: root.to_string(),
            source,
        };
        let addr = (root.host.as_str(), root.port)
            .to_socket_addrs()
            .map_err(unresolved)?
            .next()
            .ok_or_else(|| unresolved(io::Error::new(io::ErrorKind::NotFound, "no address")))?;
        Ok(Rendezvous {
            root: addr,
            id,
            world: placement.world,
        })
    }

    fn check(&self, rank: u32, payload: &[u8]) -> Result<(), ExchangeError> {
        if rank >= self.world {
            return Err(ExchangeError::NoSuchRank {
                rank,
                len: self.world as usize,
            });
        }
        if payload.len() > MAX_RENDEZVOUS_PAYLOAD {
            return Err(ExchangeError::PayloadTooLarge {
                len: payload.len(),
                max: MAX_RENDEZVOUS_PAYLOAD,
            });
        }
        Ok(())
    }

    /// A rank's side: dial, say hello, read the table.
    fn join(
        &self,
        rank: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<Vec<Vec<u8>>, ExchangeError> {
        let mut body = Vec::with_capacity(HELLO_HEAD + payload.len());
        body.extend_from_slice(&self.id.to_be_bytes());
        body.extend_from_slice(&self.world.to_be_bytes());
        body.extend_from_slice(payload);
        let mut hello = Vec::new();
        encode_frame(rank, &body, &mut hello).map_err(|_| ExchangeError::PayloadTooLarge {
            len: payload.len(),
            max: MAX_RENDEZVOUS_PAYLOAD,
        })?;
        let shared = Shared::new(rank, deadline, &hello, 1);
        let root = self.root;
        let timeout = || ExchangeError::Timeout {
            waiting_for: vec![0],
        };
        let halted = |h| match h {
            Halt::Failed(e) => e,
            Halt::Stopped => timeout(),
        };
        let stream = dial(&shared, root).map_err(halted)?;
        let mut conn = Conn::new(stream, root, &shared).map_err(halted)?;
        conn.send_frame().map_err(halted)?;
        // The table comes as `world` frames back to back: read through a buffer, not a
        // bounded read (and its timeout) per header and payload.
        let mut table_in = BufReader::with_capacity(TABLE_BUFFER, conn);
        let mut table = Vec::new();
        for r in 0..self.world {
            let (got, p) = read_frame(&mut table_in).map_err(|e| halted(halt(root, e)))?;
            if got != r {
                return Err(ExchangeError::UnexpectedRank {
                    peer: root,
                    expected: r..r + 1,
                    got,
                });
            }
            table.push(p);
        }
        Ok(table)
    }

    /// The root's side: hear every rank, then send each the table.
    fn serve(
        &self,
        listener: &TcpListener,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<Vec<Vec<u8>>, ExchangeError> {
        widen_backlog(listener);
        listener
            .set_nonblocking(true)
            .map_err(|source| ExchangeError::Io { peer: None, source })?;
        let heard = Shared::new(0, deadline, &[], self.world as usize);
        let shared = &heard;
        thread::scope(|scope| {
            let hear = |shared: &_, stream, peer| self.hear(shared, stream, peer);
            accept_each(scope, shared, listener, || shared.complete(), hear);
        });
        let _ = listener.set_nonblocking(false);
        let (table, conns) = heard.into_state().gathered(0, payload)?;
        let mut frames = Vec::new();
        for (r, p) in (0u32..).zip(&table) {
            // Each payload came in a frame of its own, with the hello's head: it fits.
            encode_frame(r, p, &mut frames).map_err(|_| ExchangeError::PayloadTooLarge {
                len: p.len(),
                max: MAX_PAYLOAD,
            })?;
        }
        let send = Shared::new(0, deadline, &frames, self.world as usize);
        let shared = &send;
        thread::scope(|scope| {
            for (stream, peer) in conns.into_iter().flatten() {
                spawn(scope, shared, format!("zverbs-root-to-{peer}"), move || {
                    Conn::new(stream, peer, shared)?.send_frame()
                });
            }
        });
        match send.into_state().error {
            Some(e) => Err(e),
            None => Ok(table),
        }
    }

    /// Reads one connection's hello and records it: a stranger's connection just ends
    /// (`Ok`); a rank of this run that may not be heard fails the rendezvous.
    fn hear(&self, shared: &Shared<'_>, stream: TcpStream, peer: SocketAddr) -> Result<(), Halt> {
        let mut conn = Conn::new(stream, peer, shared)?;
        let (rank, body) = match conn.recv_frame() {
            Ok(frame) => frame,
            // Not our protocol, or gone: a stranger.
            Err(Halt::Failed(_)) => return Ok(()),
            Err(stop) => return Err(stop),
        };
        let Some((head, payload)) = body.split_first_chunk::<HELLO_HEAD>() else {
            return Ok(());
        };
        let (id, world) = head.split_at(8);
        let id = u64::from_be_bytes(id.try_into().expect("8 bytes"));
        let world = u32::from_be_bytes(world.try_into().expect("4 bytes"));
        if id != self.id {
            return Ok(());
        }
        let fail = |e| Err(Halt::Failed(e));
        if world != self.world {
            return fail(ExchangeError::WorldMismatch {
                peer,
                expected: self.world,
                got: world,
            });
        }
        if rank == 0 || rank >= self.world {
            return fail(ExchangeError::UnexpectedRank {
                peer,
                expected: 1..self.world,
                got: rank,
            });
        }
        {
            let mut s = shared.state();
            if s.claimed[rank as usize] {
                return fail(ExchangeError::DuplicatePeer { rank, peer });
            }
            s.claimed[rank as usize] = true;
        }
        shared.finish(rank, payload.to_vec(), Some((conn.stream, peer)));
        Ok(())
    }
}

/// Lets `listener` queue [`BACKLOG`] connection requests (std listens with a smaller
/// backlog); best effort: a refusal leaves it as it was.
#[cfg(unix)]
fn widen_backlog(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: `listener` holds an open listening socket for the whole call; listen(2) on a
    // listening socket only sets its backlog, and touches no memory of ours.
    unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
}

#[cfg(not(unix))]
fn widen_backlog(_: &TcpListener) {}

/// Dials `root` until it answers or the deadline passes.
fn dial(shared: &Shared<'_>, root: SocketAddr) -> Result<TcpStream, Halt> {
    let mut backoff = BACKOFF_MIN;
    loop {
        let left = shared.remaining().ok_or(Halt::Stopped)?;
        match TcpStream::connect_timeout(&root, left.min(CONNECT_ATTEMPT_MAX)) {
            Ok(s) if !is_self_connection(&s) => return Ok(s),
            _ => {}
        }
        let left = shared.remaining().ok_or(Halt::Stopped)?;
        thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
