//! [`RpcPair`]: a client and a server [`Rpc`] with a session between them, driven on one
//! thread.

use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::device::Context;
use crate::error::ErrorKind;
use crate::provider::sim::{Sim, SimError};
use crate::rpc::{EngineConfig, EngineError, Event, MsgBuf, Notice, Rpc, RpcError, SessionId};

/// What became of one request the client made: its tag, the response's bytes or the
/// error, and a large request's buffer, given back.
#[derive(Debug)]
pub struct RpcOutcome {
    /// The request's tag.
    pub tag: u64,
    /// The response's bytes, or why there is none.
    pub result: Result<Vec<u8>, RpcError>,
    /// A large request's buffer ([`Rpc::enqueue_bulk`], [`Rpc::enqueue_bulk_device`]), back.
    pub msg: Option<MsgBuf<Sim>>,
}

/// A client [`Rpc`] on `sim0` and a server on `sim1` of one fabric, the client's session
/// to the server connected. [`run_until`](Self::run_until) drives both on the calling
/// thread and records every response or failure the client hears in `done`.
///
/// ```
/// use std::time::Duration;
/// use zverbs::provider::sim::Sim;
/// use zverbs::rpc::EngineConfig;
/// use zverbs::testing::RpcPair;
///
/// let cfg = EngineConfig::default();
/// let mut p = RpcPair::connected(&Sim::with_devices(2), cfg.clone(), cfg, |server| {
///     server.register_handler(1, |req, out| {
///         out[..req.len()].copy_from_slice(req);
///         req.len()
///     })
/// })?;
/// p.client.enqueue_request(p.session, 1, b"echo", 7)?;
/// assert!(p.wait_for(1, Duration::from_secs(5)));
/// assert_eq!((p.done[0].tag, p.done[0].result.as_deref()), (7, Ok(&b"echo"[..])));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RpcPair {
    /// The client, on `sim0`.
    pub client: Rpc<Sim>,
    /// The server, on `sim1`.
    pub server: Rpc<Sim>,
    /// The client's session to the server.
    pub session: SessionId,
    /// What the client heard of its requests, in the order it heard it.
    pub done: Vec<RpcOutcome>,
    /// The server's device died: its engine is passed over.
    server_dead: bool,
}

/// How long [`RpcPair::connected`] waits for the session.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

impl RpcPair {
    /// The client configured by `client`, the server by `server` with the handlers
    /// `handlers` registers, on devices `sim0` and `sim1` of `sim`; returns once the
    /// session is connected.
    ///
    /// # Errors
    /// What making either engine, registering a handler or opening the session gave;
    /// [`RpcError::TimedOut`] if the session did not connect within five seconds.
    pub fn connected(
        sim: &Sim,
        client: EngineConfig,
        server: EngineConfig,
        handlers: impl FnOnce(&mut Rpc<Sim>) -> Result<(), EngineError<SimError>>,
    ) -> Result<Self, EngineError<SimError>> {
        let engine = |dev: &str, cfg| {
            let ctx = Context::open(sim, dev).map_err(EngineError::Device)?;
            let pd = ctx.alloc_pd().map_err(EngineError::Device)?;
            Rpc::new(&ctx, pd, cfg)
        };
        let mut server = engine("sim1", server)?;
        handlers(&mut server)?;
        let mut client = engine("sim0", client)?;
        let session = client.create_session(&server.addr())?;
        let mut p = RpcPair {
            client,
            server,
            session,
            done: Vec::new(),
            server_dead: false,
        };
        let connected = p.run_until(CONNECT_WITHIN, |n| {
            matches!(n, Notice::Session(Event::Connected(_)))
        });
        if !connected {
            return Err(EngineError::Rpc(RpcError::TimedOut));
        }
        Ok(p)
    }

    /// Passes on both engines (the server's first) until `stop` holds for a client notice
    /// or `limit` passes; whether `stop` held.
    ///
    /// A server whose device died (a test's crash) is passed over from its first failed
    /// pass on: it does nothing any more, and its client finds out by timeouts.
    ///
    /// # Panics
    /// If a pass of either engine fails otherwise (a test's fabric does not).
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut stop: impl FnMut(&Notice<'_, Sim>) -> bool,
    ) -> bool {
        let end = Instant::now() + limit;
        let mut hit = false;
        let done = &mut self.done;
        while !hit && Instant::now() < end {
            if !self.server_dead {
                match self.server.run_event_loop_once(&mut |_| {}) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::DeviceFatal => self.server_dead = true,
                    Err(e) => panic!("the server's pass failed: {e:?}"),
                }
            }
            let on = &mut |n: Notice<'_, Sim>| {
                hit |= stop(&n);
                match n {
                    Notice::Response { tag, bytes, msg } => done.push(RpcOutcome {
                        tag,
                        result: Ok(bytes.to_vec()),
                        msg,
                    }),
                    Notice::Failed { tag, error, msg } => done.push(RpcOutcome {
                        tag,
                        result: Err(error),
                        msg,
                    }),
                    Notice::Session(_) => {}
                }
            };
            self.client.run_event_loop_once(on).unwrap();
        }
        hit
    }

    /// Runs until `n` outcomes in all are in `done`, or `limit` passes; whether they are.
    pub fn wait_for(&mut self, n: usize, limit: Duration) -> bool {
        let mut seen = self.done.len();
        if seen < n {
            self.run_until(limit, |notice| {
                seen += usize::from(!matches!(notice, Notice::Session(_)));
                seen >= n
            });
        }
        self.done.len() >= n
    }
}
