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
//!   root is not up yet (or resets the connection unanswered: one queued on a listener the
//!   root closed), and sends its hello: a frame of its rank and a payload of the id
//!   (8 bytes, big-endian), the world size (4 bytes) and its own payload; then a frame per
//!   parcel ([`route`](Rendezvous::route)), the addressee's rank in the rank field,
//!   addressees ascending; then an end frame, the world size as rank, empty.
//! - The root reads each connection's frame on a thread of its own, each read bounded by
//!   the deadline. A connection whose first bytes are no frame of ours, or whose id is
//!   another run's, is a stranger: that connection ends, the rendezvous goes on. One of
//!   this run (the right id) that claims a rank out of range, a rank already heard from,
//!   or another world size fails the rendezvous with an error naming it. Connections that
//!   say nothing, or trickle, hold nothing up: once every rank has been heard from they are
//!   closed.
//! - Then the root sends every rank the whole table, one frame per rank in rank order
//!   (each rank checks that frame `i` is rank `i`'s), then the parcels addressed to it,
//!   the sender's rank in the rank field, senders ascending, then an end frame. What a rank
//!   receives beyond the table is what was addressed to it: `O(peers)`, not `O(world)`.
//!
//! One deadline bounds the whole rendezvous, for every rank: the call returns within
//! `timeout` (plus a read slice of 20 ms) with every payload, or with a typed error; the
//! root names the ranks it did not hear from.

use std::io::{self, BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use super::conn::{halt, Conn, Halt, Shared};
use super::error::ExchangeError;
use super::frame::{encode_frame, read_frame, FrameError, MAX_PAYLOAD};
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

/// The buffer the frames of a hello or a reply are read through (back to back: not a
/// bounded read, and its timeout, per frame header and payload).
const REPLY_BUFFER: usize = 1 << 16;

/// The largest payload a rank may bring to a rendezvous.
pub const MAX_RENDEZVOUS_PAYLOAD: usize = MAX_PAYLOAD - HELLO_HEAD;

/// The root's parcels, by addressee: `(sender, bytes)`.
type Inbox = Mutex<Vec<Vec<(u32, Vec<u8>)>>>;

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

/// What a rank gets from [`Rendezvous::route`]: every rank's payload, by rank, and the
/// parcels other ranks addressed to this one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// Every rank's payload, by rank (this rank's is its own).
    pub all: Vec<Vec<u8>>,
    /// `(sender, bytes)` for each parcel addressed to this rank, by sender ascending.
    pub parcels: Vec<(u32, Vec<u8>)>,
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
    /// that is out of range, heard twice or in another world; at a rank, a reply out of
    /// protocol; [`ExchangeError::Timeout`] naming the ranks not heard from (at a rank:
    /// the root) by the deadline.
    pub fn all_gather(
        &self,
        rank: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, ExchangeError> {
        self.route(rank, payload, &[], timeout).map(|r| r.all)
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
        self.route_on(listener, payload, &[], timeout)
            .map(|r| r.all)
    }

    /// As [`all_gather`](Self::all_gather), and more: `parcels` are `(rank, bytes)` for
    /// particular ranks (in ascending rank order, none for this rank), which the root
    /// hands only to them. What a rank gets so is in proportion to what is addressed to
    /// it, not to the world: a node's endpoints for its peers, say.
    ///
    /// ```
    /// use std::net::TcpListener;
    /// use std::time::Duration;
    /// use zverbs::bootstrap::Rendezvous;
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let rv = Rendezvous { root: listener.local_addr()?, id: 7, world: 3 };
    /// let t = Duration::from_secs(10);
    /// let (at_root, at_2) = std::thread::scope(|s| {
    ///     let one = s.spawn(move || rv.route(1, b"", &[(0, b"1 to 0"), (2, b"1 to 2")], t));
    ///     let two = s.spawn(move || rv.route(2, b"", &[], t));
    ///     let root = rv.route_on(&listener, b"", &[(2, b"0 to 2")], t);
    ///     one.join().unwrap().unwrap();
    ///     (root, two.join().unwrap())
    /// });
    /// assert_eq!(at_root?.parcels, [(1, b"1 to 0".to_vec())]);
    /// assert_eq!(at_2?.parcels, [(0, b"0 to 2".to_vec()), (1, b"1 to 2".to_vec())]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather); [`ExchangeError::UnexpectedRank`] for parcels
    /// out of order, to this rank or past the world (here, or at the root from a peer);
    /// [`ExchangeError::PayloadTooLarge`] for a parcel over [`MAX_PAYLOAD`].
    pub fn route(
        &self,
        rank: u32,
        payload: &[u8],
        parcels: &[(u32, &[u8])],
        timeout: Duration,
    ) -> Result<Routed, ExchangeError> {
        self.check(rank, payload, parcels)?;
        let deadline = deadline_after(timeout);
        if rank != 0 {
            return self.join(rank, payload, parcels, deadline);
        }
        self.serve(&self.listen()?, payload, parcels, deadline)
    }

    /// The root's listener: the root's port on every address of the root's family. Rank
    /// 0's [`route`](Self::route) and [`all_gather`](Self::all_gather) bind one for the
    /// call and close it at the end; a root that runs several rounds binds it once and
    /// calls [`route_on`](Self::route_on) / [`all_gather_on`](Self::all_gather_on) with it.
    /// (A rank done with one round may dial for the next while the root still answers the
    /// others: on a listener closed between rounds its connection is queued, then reset,
    /// and it dials again after a backoff.)
    ///
    /// # Errors
    /// [`ExchangeError::Bind`] when the port cannot be bound.
    pub fn listen(&self) -> Result<TcpListener, ExchangeError> {
        let any = match self.root.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let addr = SocketAddr::new(any, self.root.port());
        TcpListener::bind(addr).map_err(|source| ExchangeError::Bind { addr, source })
    }

    /// As [`route`](Self::route) for rank 0, on a listener the caller bound.
    ///
    /// # Errors
    /// As [`route`](Self::route).
    pub fn route_on(
        &self,
        listener: &TcpListener,
        payload: &[u8],
        parcels: &[(u32, &[u8])],
        timeout: Duration,
    ) -> Result<Routed, ExchangeError> {
        self.check(0, payload, parcels)?;
        self.serve(listener, payload, parcels, deadline_after(timeout))
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

    fn check(
        &self,
        rank: u32,
        payload: &[u8],
        parcels: &[(u32, &[u8])],
    ) -> Result<(), ExchangeError> {
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
        let mut next = 0;
        for &(to, bytes) in parcels {
            if to < next || to == rank || to >= self.world {
                return Err(ExchangeError::UnexpectedRank {
                    peer: self.root,
                    expected: next..self.world,
                    got: to,
                });
            }
            if bytes.len() > MAX_PAYLOAD {
                return Err(ExchangeError::PayloadTooLarge {
                    len: bytes.len(),
                    max: MAX_PAYLOAD,
                });
            }
            next = to + 1;
        }
        Ok(())
    }

    /// A rank's side: dial, say hello and hand over its parcels, read the reply.
    fn join(
        &self,
        rank: u32,
        payload: &[u8],
        parcels: &[(u32, &[u8])],
        deadline: Instant,
    ) -> Result<Routed, ExchangeError> {
        let mut body = Vec::with_capacity(HELLO_HEAD + payload.len());
        body.extend_from_slice(&self.id.to_be_bytes());
        body.extend_from_slice(&self.world.to_be_bytes());
        body.extend_from_slice(payload);
        let mut hello = Vec::new();
        // Every length was checked (`check`): the frames encode.
        let frame = |r, p: &[u8], out: &mut Vec<u8>| {
            encode_frame(r, p, out).map_err(|_| ExchangeError::PayloadTooLarge {
                len: p.len(),
                max: MAX_PAYLOAD,
            })
        };
        frame(rank, &body, &mut hello)?;
        for &(to, bytes) in parcels {
            frame(to, bytes, &mut hello)?;
        }
        frame(self.world, &[], &mut hello)?;
        let shared = Shared::new(rank, deadline, &hello, 1);
        let root = self.root;
        let halted = |h| match h {
            Halt::Failed(e) => e,
            Halt::Stopped => ExchangeError::Timeout {
                waiting_for: vec![0],
            },
        };
        let mut reply = answered(&shared, root).map_err(halted)?;
        let mut next = || read_frame(&mut reply).map_err(|e| halted(halt(root, e)));
        let out_of_protocol = |expected, got| ExchangeError::UnexpectedRank {
            peer: root,
            expected,
            got,
        };
        let mut all = Vec::new();
        for r in 0..self.world {
            match next()? {
                (got, p) if got == r => all.push(p),
                (got, _) => return Err(out_of_protocol(r..r + 1, got)),
            }
        }
        let mut parcels = Vec::new();
        let mut from = 0;
        loop {
            match next()? {
                (end, p) if end == self.world && p.is_empty() => break,
                (got, p) if got >= from && got != rank && got < self.world => {
                    from = got + 1;
                    parcels.push((got, p));
                }
                (got, _) => return Err(out_of_protocol(from..self.world, got)),
            }
        }
        Ok(Routed { all, parcels })
    }

    /// The root's side: hear every rank, then send each the table and its parcels.
    fn serve(
        &self,
        listener: &TcpListener,
        payload: &[u8],
        parcels: &[(u32, &[u8])],
        deadline: Instant,
    ) -> Result<Routed, ExchangeError> {
        widen_backlog(listener);
        listener
            .set_nonblocking(true)
            .map_err(|source| ExchangeError::Io { peer: None, source })?;
        let world = self.world as usize;
        let inbox: Inbox = Mutex::new(vec![Vec::new(); world]);
        let heard = Shared::new(0, deadline, &[], world);
        let shared = &heard;
        thread::scope(|scope| {
            let hear = |shared: &_, stream, peer| self.hear(shared, &inbox, stream, peer);
            accept_each(scope, shared, listener, || shared.complete(), hear);
        });
        let _ = listener.set_nonblocking(false);
        let (all, conns) = heard.into_state().gathered(0, payload)?;
        let mut inbox = inbox.into_inner().unwrap_or_else(|p| p.into_inner());
        for &(to, bytes) in parcels {
            inbox[to as usize].push((0, bytes.to_vec()));
        }
        for parcels in &mut inbox {
            parcels.sort_unstable_by_key(|&(from, _)| from);
        }
        // Every payload and parcel came in a frame of its own (a payload with the hello's
        // head besides): each fits one again.
        let frame = |r, p: &[u8], out: &mut Vec<u8>| {
            encode_frame(r, p, out).map_err(|_| ExchangeError::PayloadTooLarge {
                len: p.len(),
                max: MAX_PAYLOAD,
            })
        };
        let mut table = Vec::new();
        for (r, p) in (0u32..).zip(&all) {
            frame(r, p, &mut table)?;
        }
        let mut replies = Vec::with_capacity(world);
        for mine in &inbox {
            let mut reply = Vec::new();
            for (from, p) in mine {
                frame(*from, p, &mut reply)?;
            }
            frame(self.world, &[], &mut reply)?;
            replies.push(reply);
        }
        let send = Shared::new(0, deadline, &[], world);
        let shared = &send;
        let table = &table;
        thread::scope(|scope| {
            for ((rank, conn), reply) in (0u32..).zip(conns).zip(&replies) {
                let Some((stream, peer)) = conn else { continue };
                spawn(scope, shared, format!("zverbs-root-to-{peer}"), move || {
                    let mut conn = Conn::new(stream, peer, shared)?;
                    conn.send(table)
                        .and_then(|()| conn.send(reply))
                        .map_err(|h| match h {
                            Halt::Failed(ExchangeError::Io { source, .. }) => {
                                Halt::Failed(ExchangeError::Lost { rank, peer, source })
                            }
                            h => h,
                        })
                });
            }
        });
        if let Some(e) = send.into_state().error {
            return Err(e);
        }
        let parcels = std::mem::take(&mut inbox[0]);
        Ok(Routed { all, parcels })
    }

    /// Reads one connection's hello and parcels and records them: a stranger's connection
    /// just ends (`Ok`); a rank of this run that may not be heard, or whose parcels are out
    /// of protocol, fails the rendezvous.
    fn hear(
        &self,
        shared: &Shared<'_>,
        inbox: &Inbox,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Result<(), Halt> {
        let mut input = BufReader::with_capacity(REPLY_BUFFER, Conn::new(stream, peer, shared)?);
        let (rank, body) = match read_frame(&mut input).map_err(|e| halt(peer, e)) {
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
        // Its parcels, addressees ascending (so at most one each), up to the end frame.
        let mut parcels = Vec::new();
        let mut next = 0;
        loop {
            match read_frame(&mut input).map_err(|e| halt(peer, e))? {
                (end, p) if end == self.world && p.is_empty() => break,
                (to, p) if to >= next && to != rank && to < self.world => {
                    next = to + 1;
                    parcels.push((to, p));
                }
                (got, _) => {
                    return fail(ExchangeError::UnexpectedRank {
                        peer,
                        expected: next..self.world,
                        got,
                    })
                }
            }
        }
        {
            let mut inbox = inbox.lock().unwrap_or_else(|p| p.into_inner());
            for (to, p) in parcels {
                inbox[to as usize].push((rank, p));
            }
        }
        shared.finish(
            rank,
            payload.to_vec(),
            Some((input.into_inner().stream, peer)),
        );
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
/// Dials the root, sends the hello and waits for the first bytes of the reply, dialing
/// again while the connection is reset before the root says anything: a connection the
/// kernel queued on a listener the root then closed (a rank early for the root's next
/// call, while the root still answers the others of its last) is reset, unheard. An
/// orderly close is no reason to dial again: the root heard this rank and gave up (the
/// frame reader says so). The reply comes as frames back to back: it is read through a
/// buffer, not a bounded read (and its timeout) per header and payload.
fn answered<'s, 'f>(
    shared: &'s Shared<'f>,
    root: SocketAddr,
) -> Result<BufReader<Conn<'s, 'f>>, Halt> {
    let mut backoff = BACKOFF_MIN;
    loop {
        let stream = dial(shared, root)?;
        let mut conn = Conn::new(stream, root, shared)?;
        // Past this match: the connection was reset unanswered.
        match conn.send_frame() {
            Ok(()) => {
                let mut reply = BufReader::with_capacity(REPLY_BUFFER, conn);
                match reply.fill_buf() {
                    Ok(_) => return Ok(reply),
                    Err(e) if reset(&e) => {}
                    Err(e) => return Err(halt(root, FrameError::Io(e))),
                }
            }
            Err(Halt::Failed(ExchangeError::Io { source, .. })) if reset(&source) => {}
            Err(h) => return Err(h),
        }
        let left = shared.remaining().ok_or(Halt::Stopped)?;
        thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Whether `e` says the connection was reset.
fn reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

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
