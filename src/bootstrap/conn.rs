//! One exchange's shared state and its connections: every read and write is bounded by
//! the exchange's one deadline, and wakes every [`READ_SLICE`] to notice it or another
//! connection's failure.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::error::ExchangeError;
use super::frame::{read_frame, FrameError};

/// How often a blocked read wakes to check the deadline and the stop flag.
pub(super) const READ_SLICE: Duration = Duration::from_millis(20);

/// What the exchange has gathered so far.
pub(super) struct State {
    /// Payloads received, by rank.
    pub(super) got: Vec<Option<Vec<u8>>>,
    /// Ranks claimed by an accepted connection.
    pub(super) claimed: Vec<bool>,
    /// The connection each rank was heard on, kept for the readiness round.
    pub(super) conns: Vec<Option<(TcpStream, SocketAddr)>>,
    /// The first failure.
    pub(super) error: Option<ExchangeError>,
}

/// Every rank's payload and the connection it came on, by rank.
pub(super) type Gathered = (Vec<Vec<u8>>, Vec<Option<(TcpStream, SocketAddr)>>);

impl State {
    /// What the exchange gathered, with `payload` as rank `me`'s own: its first failure,
    /// or [`ExchangeError::Timeout`] naming every rank not heard from.
    pub(super) fn gathered(self, me: u32, payload: &[u8]) -> Result<Gathered, ExchangeError> {
        let State {
            mut got,
            conns,
            error,
            ..
        } = self;
        if let Some(e) = error {
            return Err(e);
        }
        got[me as usize] = Some(payload.to_vec());
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
}

/// State shared by the threads of one exchange.
pub(super) struct Shared<'a> {
    pub(super) my_rank: u32,
    pub(super) deadline: Instant,
    /// Set on the first failure, or once every rank has been heard from: everyone winds
    /// down.
    pub(super) stop: AtomicBool,
    /// Every rank has been heard from: later failures (strangers) are not reported.
    pub(super) complete: AtomicBool,
    /// This rank's encoded frame.
    pub(super) frame: &'a [u8],
    pub(super) state: Mutex<State>,
}

/// Why a connection's work ended early.
pub(super) enum Halt {
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

pub(super) fn is_stop(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<StopSignal>())
}

impl<'a> Shared<'a> {
    pub(super) fn new(my_rank: u32, deadline: Instant, frame: &'a [u8], n: usize) -> Self {
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

    pub(super) fn into_state(self) -> State {
        self.state.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // A panicking thread cannot leave `State` inconsistent: every update is one store.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time left, or `None` once the deadline has passed or the exchange is stopping.
    pub(super) fn remaining(&self) -> Option<Duration> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let left = self.deadline.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then_some(left)
    }

    pub(super) fn fail(&self, e: ExchangeError) {
        crate::trace::event!(warn, error = %e, "the exchange failed");
        let mut s = self.state();
        if s.error.is_none() && !self.complete.load(Ordering::Relaxed) {
            s.error = Some(e);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Records `rank`'s payload (and the connection it came on); the last one stops every
    /// other connection.
    pub(super) fn finish(
        &self,
        rank: u32,
        payload: Vec<u8>,
        conn: Option<(TcpStream, SocketAddr)>,
    ) {
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

    /// Every rank has been heard from.
    pub(super) fn complete(&self) -> bool {
        self.complete.load(Ordering::Relaxed)
    }

    /// Every lower rank has been heard from.
    pub(super) fn accepts_done(&self) -> bool {
        self.state().got[..self.my_rank as usize]
            .iter()
            .all(Option::is_some)
    }

    pub(super) fn report(&self, r: Result<(), Halt>) {
        if let Err(Halt::Failed(e)) = r {
            self.fail(e);
        }
    }
}

/// One connection, whose reads and writes are bounded by the exchange's deadline.
pub(super) struct Conn<'s, 'a> {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) shared: &'s Shared<'a>,
}

impl<'s, 'a> Conn<'s, 'a> {
    pub(super) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        shared: &'s Shared<'a>,
    ) -> Result<Self, Halt> {
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

    pub(super) fn send_frame(&mut self) -> Result<(), Halt> {
        self.send(self.shared.frame)
    }

    /// Writes `bytes` whole, within the exchange's deadline.
    pub(super) fn send(&mut self, bytes: &[u8]) -> Result<(), Halt> {
        let left = self.shared.remaining().ok_or(Halt::Stopped)?;
        let r = self
            .stream
            .set_write_timeout(Some(left))
            .and_then(|()| self.stream.write_all(bytes))
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

    pub(super) fn recv_frame(&mut self) -> Result<(u32, Vec<u8>), Halt> {
        let peer = self.peer;
        read_frame(self).map_err(|e| halt(peer, e))
    }
}

/// A frame read from `peer` that failed, as the exchange reports it.
pub(super) fn halt(peer: SocketAddr, e: FrameError) -> Halt {
    Halt::Failed(match e {
        FrameError::BadMagic(got) => ExchangeError::WrongMagic { peer, got },
        FrameError::UnsupportedVersion(got) => ExchangeError::WrongVersion { peer, got },
        FrameError::Oversized { claimed, max } => ExchangeError::Oversized { peer, claimed, max },
        FrameError::Truncated { needed, got } => ExchangeError::Truncated { peer, needed, got },
        FrameError::Io(e) if is_stop(&e) => return Halt::Stopped,
        FrameError::Io(source) => ExchangeError::Io {
            peer: Some(peer),
            source,
        },
    })
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
