//! Connection set-up over tokio TCP: the framed, versioned endpoint exchange of
//! [`bootstrap`](crate::bootstrap) (one `"ZVEX"` frame each way, its length checked
//! before anything is allocated), then the readiness round (each side says it moved its
//! queue pairs to RTS, and waits until the other did). One deadline bounds all of it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::bootstrap::frame::check_header;
use crate::bootstrap::{encode_frame, FrameError, FRAME_HEADER_LEN};
use crate::error::Error;
use crate::qp::EndpointError;

/// Why a connection could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError<E> {
    /// The TCP connection failed or broke.
    Io(std::io::Error),
    /// The peer's frame was malformed (bad magic, version, or a length past the limit).
    Frame(FrameError),
    /// The peer's endpoints did not decode.
    Endpoint(EndpointError),
    /// A verb failed while preparing or connecting the queue pairs.
    Verbs(Error<E>),
    /// The peer said it is not ready (its queue pairs failed to connect).
    PeerNotReady,
    /// The deadline passed (the timeout of the channel configuration).
    Timeout,
    /// The meeting of a [`Bootstrap`](crate::bootstrap::Bootstrap) failed
    /// ([`Connection::bootstrap`](super::Connection::bootstrap)).
    Exchange(crate::bootstrap::ExchangeError),
    /// A peer handed this rank no endpoints: it did not name this rank among its peers
    /// ([`Connection::bootstrap`](super::Connection::bootstrap)).
    Unpaired {
        /// The peer.
        peer: u32,
    },
    /// The connection manager's set-up failed
    /// ([`Connection::connect_cm`](super::Connection::connect_cm)).
    Cm(crate::cm::CmError<E>),
}

impl<E: core::fmt::Debug> core::fmt::Display for ConnectError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConnectError::Io(e) => write!(f, "connection set-up: {e}"),
            ConnectError::Frame(e) => write!(f, "connection set-up: {e}"),
            ConnectError::Endpoint(e) => write!(f, "connection set-up: peer endpoint: {e:?}"),
            ConnectError::Verbs(e) => write!(f, "connection set-up: {e:?}"),
            ConnectError::PeerNotReady => write!(f, "connection set-up: the peer is not ready"),
            ConnectError::Timeout => write!(f, "connection set-up timed out"),
            ConnectError::Exchange(e) => write!(f, "connection set-up: {e}"),
            ConnectError::Cm(e) => write!(f, "connection set-up: {e}"),
            ConnectError::Unpaired { peer } => write!(
                f,
                "connection set-up: rank {peer} handed this rank no endpoints (does it name it a peer?)"
            ),
        }
    }
}

impl<E: core::fmt::Debug> std::error::Error for ConnectError<E> {}

impl<E> From<Error<E>> for ConnectError<E> {
    fn from(e: Error<E>) -> Self {
        ConnectError::Verbs(e)
    }
}

impl<E> From<EndpointError> for ConnectError<E> {
    fn from(e: EndpointError) -> Self {
        ConnectError::Endpoint(e)
    }
}

/// One side of a TCP set-up, bounded by one deadline.
pub(crate) struct SetUp {
    stream: TcpStream,
    deadline: Option<Instant>,
}

const READY: u8 = 1;
const NOT_READY: u8 = 0;

impl SetUp {
    /// Connects to `addr` by `timeout` (`None`: no bound).
    pub(crate) async fn connect<E>(
        addr: SocketAddr,
        timeout: Option<Duration>,
    ) -> Result<SetUp, ConnectError<E>> {
        let deadline = deadline(timeout);
        let stream = bounded(deadline, TcpStream::connect(addr))
            .await?
            .map_err(ConnectError::Io)?;
        Ok(SetUp { stream, deadline })
    }

    /// Accepts one connection on `listener` by `timeout`.
    pub(crate) async fn accept<E>(
        listener: &tokio::net::TcpListener,
        timeout: Option<Duration>,
    ) -> Result<SetUp, ConnectError<E>> {
        let deadline = deadline(timeout);
        let (stream, _) = bounded(deadline, listener.accept())
            .await?
            .map_err(ConnectError::Io)?;
        Ok(SetUp { stream, deadline })
    }

    /// Sends `payload` in one frame and reads the peer's (at most `max` bytes of payload).
    pub(crate) async fn exchange<E>(
        &mut self,
        payload: &[u8],
        max: usize,
    ) -> Result<Vec<u8>, ConnectError<E>> {
        let deadline = self.deadline;
        bounded(deadline, self.exchange_unbounded(payload, max)).await?
    }

    async fn exchange_unbounded<E>(
        &mut self,
        payload: &[u8],
        max: usize,
    ) -> Result<Vec<u8>, ConnectError<E>> {
        let mut frame = Vec::new();
        encode_frame(0, payload, &mut frame).map_err(ConnectError::Frame)?;
        self.stream
            .write_all(&frame)
            .await
            .map_err(ConnectError::Io)?;
        let mut header = [0u8; FRAME_HEADER_LEN];
        // Fields checked as they arrive: a stranger sending garbage is refused after
        // four bytes, without waiting for more.
        let mut got = 0;
        for end in [4, 6, FRAME_HEADER_LEN] {
            self.stream
                .read_exact(&mut header[got..end])
                .await
                .map_err(ConnectError::Io)?;
            got = end;
            check_header(&header[..got]).map_err(ConnectError::Frame)?;
        }
        let len = match check_header(&header).map_err(ConnectError::Frame)? {
            Some((_, len)) => len,
            // A whole header that checked out has its length; said, not assumed.
            None => {
                return Err(ConnectError::Frame(FrameError::Truncated {
                    needed: FRAME_HEADER_LEN,
                    got: header.len(),
                }))
            }
        };
        if len > max {
            return Err(ConnectError::Frame(FrameError::Oversized {
                claimed: len as u64,
                max,
            }));
        }
        let mut body = vec![0u8; len];
        self.stream
            .read_exact(&mut body)
            .await
            .map_err(ConnectError::Io)?;
        Ok(body)
    }

    /// The readiness round: says whether this side is `ready`, and (if it is) waits for
    /// the peer to say the same.
    pub(crate) async fn confirm<E>(mut self, ready: bool) -> Result<(), ConnectError<E>> {
        let status = [if ready { READY } else { NOT_READY }];
        let theirs = self.exchange(&status, 1).await;
        if !ready {
            return Ok(());
        }
        match theirs?.as_slice() {
            [READY] => Ok(()),
            _ => Err(ConnectError::PeerNotReady),
        }
    }
}

fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// `f`, bounded by `deadline`.
async fn bounded<T, E>(
    deadline: Option<Instant>,
    f: impl core::future::Future<Output = T>,
) -> Result<T, ConnectError<E>> {
    match deadline {
        None => Ok(f.await),
        Some(d) => tokio::time::timeout_at(d, f)
            .await
            .map_err(|_| ConnectError::Timeout),
    }
}

/// The bound where a channel configuration gives none.
pub(crate) const UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 3600);

/// `f` (a blocking set-up step: an exchange, the connection manager's calls) on tokio's
/// blocking pool, its error made a set-up error by `wrap`.
pub(crate) async fn blocking<T: Send + 'static, X: Send + 'static, E>(
    f: impl FnOnce() -> Result<T, X> + Send + 'static,
    wrap: fn(X) -> ConnectError<E>,
) -> Result<T, ConnectError<E>> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(wrap),
        Err(e) => Err(ConnectError::Io(std::io::Error::other(e))),
    }
}
