//! A [`Connection`] through the connection manager: its data queue pair is the manager's
//! connection, and its control queue pair's endpoint rides in the private data each way
//! (`"ZVTC"`, then the encoded endpoint: 38 of the 56 bytes a connect carries). The
//! connecting side readies its control queue pair before it establishes, the accepting
//! side before it accepts: once both calls return, both queue pairs are at RTS on both
//! sides. The manager's calls block: they run on tokio's blocking pool.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::connect::{blocking, ConnectError, UNBOUNDED};
use super::remote::{Connection, Half, Joined};
use crate::channel::ChannelConfig;
use crate::cm::{Answer, CmConnection, CmError, CmListener};
use crate::error::Error;
use crate::provider::cm::{CmEventKind, ConnectionManager};
use crate::qp::{Endpoint, ENDPOINT_LEN};

const MAGIC: &[u8; 4] = b"ZVTC";

/// What a side says: the magic, then its control queue pair's endpoint.
fn hello(ctrl: &Endpoint) -> [u8; 4 + ENDPOINT_LEN] {
    let mut b = [0u8; 4 + ENDPOINT_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4..].copy_from_slice(&ctrl.encode());
    b
}

/// The peer's control endpoint from what it said (`None`: not ours).
fn heard(data: &[u8]) -> Option<Endpoint> {
    let rest = data.strip_prefix(MAGIC)?;
    Endpoint::decode(rest.get(..ENDPOINT_LEN)?).ok()
}

impl<P: ConnectionManager + 'static> Connection<P> {
    /// Connects to a peer accepting on `dst` ([`accept_cm`](Self::accept_cm)) through the
    /// connection manager, from `device` (from `src`'s address when given): as
    /// [`connect`](Self::connect), within `config.timeout`.
    ///
    /// # Errors
    /// [`ConnectError::Cm`] for the manager's (an address that does not resolve, nobody
    /// listening, a reject, a timeout); [`ConnectError::Verbs`] for the channels'.
    pub async fn connect_cm(
        provider: &P,
        device: &str,
        src: Option<IpAddr>,
        dst: SocketAddr,
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError<P::Error>> {
        let Half { data, ctrl, own } = Half::open(provider, device, pool_bytes, config)?;
        let said = hello(&ctrl.endpoint());
        let provider = provider.clone();
        let timeout = config.timeout.unwrap_or(UNBOUNDED);
        let made = blocking(
            move || {
                let mut ctrl = Some(ctrl);
                let mut ready = None;
                let cm = CmConnection::connect_prepared(
                    &provider,
                    &own.ctx,
                    move || Ok(data),
                    src,
                    dst,
                    &said,
                    timeout,
                    |reply| {
                        let theirs = heard(reply).ok_or(CmError::Unexpected {
                            kind: CmEventKind::ConnectResponse,
                            status: 0,
                        })?;
                        let ctrl = ctrl.take().expect("called once");
                        ready = Some(ctrl.connect(&theirs).map_err(CmError::Channel)?);
                        Ok(())
                    },
                )?;
                let ctrl = ready.expect("connected before establishing");
                Ok((cm, ctrl, own))
            },
            ConnectError::Cm,
        )
        .await?;
        Self::made(made)
    }

    /// Accepts one peer's [`connect_cm`](Self::connect_cm) on `listener`, on `device`,
    /// within `config.timeout`; connect requests that are not a connection's are rejected
    /// (with the reason `"ZVTC?"`) and the next one taken.
    ///
    /// # Errors
    /// [`ConnectError::Cm`] for the manager's (no request in time); [`ConnectError::Verbs`]
    /// for the channels'.
    pub async fn accept_cm(
        provider: &P,
        device: &str,
        listener: &Arc<CmListener<P>>,
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError<P::Error>> {
        let Half { data, ctrl, own } = Half::open(provider, device, pool_bytes, config)?;
        let said = hello(&ctrl.endpoint());
        let listener = Arc::clone(listener);
        let timeout = config.timeout.unwrap_or(UNBOUNDED);
        let made = blocking(
            move || {
                let (mut data, mut ctrl, mut ready) = (Some(data), Some(ctrl), None);
                let cm = listener.accept_prepared_with(
                    &own.ctx,
                    || {
                        data.take()
                            .ok_or(Error::InvalidAttribute("one connection per accept"))
                    },
                    timeout,
                    |request| {
                        // Ready the control queue pair before accepting: the peer may use it
                        // as soon as its connect returns.
                        match (heard(request), ctrl.take()) {
                            (Some(theirs), Some(c)) => match c.connect(&theirs) {
                                Ok(c) => {
                                    ready = Some(c);
                                    Answer::accept(&said)
                                }
                                Err(_) => Answer::reject(b"ZVTC: cannot connect"),
                            },
                            (None, c) => {
                                ctrl = c;
                                Answer::reject(b"ZVTC?")
                            }
                            (Some(_), None) => Answer::reject(b"ZVTC: busy"),
                        }
                    },
                )?;
                let ctrl = ready.ok_or(CmError::Unexpected {
                    kind: CmEventKind::Established,
                    status: 0,
                })?;
                Ok((cm, ctrl, own))
            },
            ConnectError::Cm,
        )
        .await?;
        Self::made(made)
    }

    /// The connection over what the manager made: the data channel and its link, and the
    /// control channel connected beside it.
    fn made((cm, ctrl, own): Made<P>) -> Result<Self, ConnectError<P::Error>> {
        let (data, link, _) = cm.into_parts();
        let mut conn = Connection::assemble(Joined { data, ctrl, own })?;
        conn.link = Some(Box::new(link));
        Ok(conn)
    }
}

/// What the blocking part of a set-up hands back.
type Made<P> = (
    CmConnection<P>,
    crate::channel::Channel<P, 16, 1>,
    super::remote::Owned<P>,
);
