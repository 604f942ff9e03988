//! A connection to one peer that lends and borrows registered memory: async-rdma's
//! remote-region exchange, with leases that end. See [`Connection`].
//!
//! Map (one file: the connection's state machine and its control protocol share one lock
//! and one set of invariants, and read best side by side): [`RemoteError`] and
//! [`RemoteBuf`] (a borrowed region, lease ended on drop); [`Connection`] with its API
//! (`connect`/`listen`, `request_remote`, `send_*`, `receive_*`); `Inner`, the shared
//! state (`lend`/`unlend`, the wait loop `watch`, `end` on the first protocol violation);
//! `answer`, the serve task that grants or refuses a peer's asks.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::connect::{ConnectError, SetUp};
use super::wire::{
    Msg, WireError, GRANT, MSG_LEN, REFUSE, REFUSED_BAD, REFUSED_EXHAUSTED, REMOTE_RIGHTS,
};
use super::AsyncChannel;
use crate::channel::{Channel, ChannelConfig, PreparedChannel};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::pool::{LocalBuf, MrPool};
use crate::provider::Provider;
use crate::qp::{Endpoint, ENDPOINT_LEN};
use crate::types::AccessFlags;

/// Leases one side may have out at once.
const LEASES: usize = 256;

/// Why a remote-region operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RemoteError<E> {
    /// The owner's pool had no room for the request (or too many leases are out).
    Exhausted,
    /// The request was refused as malformed (zero length, past the owner's pool, or rights
    /// a peer may not have).
    Refused,
    /// A verb failed (posting a control message, registering a lease).
    Verbs(Error<E>),
    /// The peer broke the protocol: the connection was torn down.
    Protocol(WireError),
    /// The connection is gone (closed, or the peer vanished or misbehaved).
    PeerGone,
    /// The token belongs to another connection.
    ForeignToken,
    /// No answer within the channel's timeout.
    Timeout,
}

impl<E> From<Error<E>> for RemoteError<E> {
    fn from(e: Error<E>) -> Self {
        RemoteError::Verbs(e)
    }
}

/// Memory of the peer's, lent to this side: its region and rights, until returned
/// ([`Connection::send_remote`]) or dropped (the owner then frees it).
pub struct RemoteBuf<P: Provider + 'static> {
    region: RemoteRegion,
    lease: u32,
    conn: Arc<Inner<P>>,
    /// Cleared when the lease is handed back, so the drop does not release it again.
    live: bool,
}

impl<P: Provider + 'static> RemoteBuf<P> {
    /// The lent region (address, length, key), for `write`, `read` and atomics.
    pub fn region(&self) -> RemoteRegion {
        self.region
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.region.len
    }

    /// Whether it is empty (never, for a lease).
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }
}

impl<P: Provider + 'static> Drop for RemoteBuf<P> {
    fn drop(&mut self) {
        if self.live {
            let (conn, lease) = (self.conn.clone(), self.lease);
            // A drop cannot await: the release goes out on the connection's runtime.
            self.conn.runtime.spawn(async move {
                let _ = conn.send(Msg::Release { lease }).await;
            });
        }
    }
}

impl<P: Provider + 'static> core::fmt::Debug for RemoteBuf<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RemoteBuf")
            .field("region", &self.region)
            .field("lease", &self.lease)
            .finish()
    }
}

/// A connection to one peer that lends and borrows registered memory: async-rdma's
/// remote-region exchange, with leases that end.
///
/// It owns its device context, protection domain and [`MrPool`], a data channel for the
/// user's operations ([`channel`](Self::channel)) and a **control queue pair** of its own,
/// so control messages never mix with the user's sends and receives. The messages are
/// fixed-size (40 bytes), versioned and checked.
///
/// **A protocol error ends the connection at once.** The first message out of protocol
/// (malformed, an unknown version or kind, a lease that is not out, a grant or refusal
/// nobody asked for, a grant of another length than asked) tears the connection down
/// before another message is read: every lease lent to the peer ends (its registration
/// dropped, so the peer's later RDMA on it fails with `REM_ACCESS_ERR`), every waiting
/// call returns [`RemoteError::Protocol`], the control loop stops, and nothing the peer
/// sends afterwards is acted on. Other connections are untouched.
///
/// **Leases.** Memory lent to the peer gets a registration of its own, over exactly the
/// lent range, with exactly the rights asked for. The pool's slab stays local-only, so the
/// peer can touch nothing else; once the lease ends (handed back with
/// [`send_remote`](Self::send_remote), the peer's [`RemoteBuf`] dropped, or the connection
/// gone) the registration is dropped before the buffer goes back, and the range is no
/// longer remotely accessible. A registration per lease costs a verb call (memory windows
/// would bind faster, but rxe supports them only in part, and a lease is not on the data
/// path).
///
/// ```
/// # #[cfg(feature = "sim")] {
/// use zverbs::provider::sim::Sim;
/// use zverbs::tokio::Connection;
/// use zverbs::{AccessFlags, ChannelConfig};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let sim = Sim::with_devices(2);
/// let cfg = ChannelConfig::default();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
/// let addr = listener.local_addr().unwrap();
/// let (client, server) = tokio::join!(
///     Connection::connect(&sim, "sim0", addr, 1 << 16, &cfg),
///     Connection::listen(&sim, "sim1", &listener, 1 << 16, &cfg),
/// );
/// let (client, server) = (client.unwrap(), server.unwrap());
/// let lease = client.request_remote(8, AccessFlags::REMOTE_WRITE).await.unwrap();
/// let mut bytes = client.pool().alloc(8).unwrap();
/// bytes.copy_from_slice(b"leased!!");
/// let (r, _) = client.channel().write(bytes, &lease.region()).await;
/// r.unwrap();
/// client.send_remote(lease).await.unwrap();
/// assert_eq!(&server.receive_local().await.unwrap()[..], b"leased!!");
/// # });
/// # }
/// ```
pub struct Connection<P: Provider + 'static> {
    data: AsyncChannel<P>,
    inner: Arc<Inner<P>>,
    /// The control loop, stopped when the connection is dropped.
    serving: tokio::task::JoinHandle<()>,
    /// What keeps a connection the connection manager made (its id: dropped, the peer
    /// sees the end), dropped after the channels.
    pub(super) link: Option<Box<dyn core::any::Any + Send + Sync>>,
}

struct Inner<P: Provider + 'static> {
    /// Which connection (tokens carry it).
    id: u64,
    ctrl: AsyncChannel<P, LocalBuf<P>, 16, 1>,
    state: Mutex<State<P>>,
    /// Something came: a reply, a lease offered, a lease returned, the end.
    news: Notify,
    /// One request at a time.
    asking: tokio::sync::Mutex<()>,
    runtime: tokio::runtime::Handle,
    config: ChannelConfig,
    pool: MrPool<P>,
    // Dropped after the channels and leases above (fields drop in order).
    pd: ProtectionDomain<P>,
    _ctx: Context<P>,
}

struct State<P: Provider> {
    next_id: u32,
    /// The request awaiting its answer, if any: the only one a grant or refusal may answer.
    asked: Option<Ask>,
    reply: Option<Msg>,
    /// Memory of ours lent to the peer, by lease number.
    leases: Vec<Option<Lease<P>>>,
    /// Leases the peer offered (`receive_remote`).
    offered: VecDeque<(u32, RemoteRegion)>,
    /// Buffers the peer handed back (`receive_local`).
    returned: VecDeque<LocalBuf<P>>,
    /// Why the connection is over, if it is.
    over: Option<Over>,
    /// The control loop, aborted when the connection ends.
    serving: Option<tokio::task::AbortHandle>,
}

/// A request sent: its id and length, and whether its caller gave up waiting (then a
/// grant that still comes is released at once).
#[derive(Clone, Copy, Debug)]
struct Ask {
    id: u32,
    len: u64,
    abandoned: bool,
}

#[derive(Clone, Copy, Debug)]
enum Over {
    Gone,
    Protocol(WireError),
}

/// Our memory, lent: its own registration (dropped first), then the buffer.
struct Lease<P: Provider> {
    _mr: P::Mr,
    buf: LocalBuf<P>,
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

/// One side of a connection before it connects: its data and control channels, prepared,
/// on its own device context, domain and pool.
pub(super) struct Half<P: Provider + 'static> {
    pub(super) data: PreparedChannel<P>,
    pub(super) ctrl: PreparedChannel<P, 16, 1>,
    // Dropped after the channels (fields drop in order).
    pub(super) own: Owned<P>,
}

/// A side whose channels are at RTS.
pub(super) struct Joined<P: Provider + 'static> {
    pub(super) data: Channel<P>,
    pub(super) ctrl: Channel<P, 16, 1>,
    pub(super) own: Owned<P>,
}

/// What a side holds besides its channels.
pub(super) struct Owned<P: Provider + 'static> {
    pub(super) config: ChannelConfig,
    pool: MrPool<P>,
    pd: ProtectionDomain<P>,
    pub(super) ctx: Context<P>,
}

impl<P: Provider + 'static> Half<P> {
    /// Opens `device`, allocates a protection domain and a pool of `pool_bytes`, and
    /// prepares the data channel (`config`) and the control channel (no timeout: its
    /// receives wait as long as the connection lives; requests are bounded by
    /// `config.timeout` where they wait for answers).
    pub(super) fn open(
        provider: &P,
        device: &str,
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Self, Error<P::Error>> {
        let ctx = Context::open(provider, device)?;
        let pd = ctx.alloc_pd()?;
        let pool = MrPool::new(&pd, pool_bytes)?;
        let data = AsyncChannel::<P>::prepare(&ctx, &pd, config)?;
        let ctrl_config = ChannelConfig {
            timeout: None,
            ..*config
        };
        let ctrl = AsyncChannel::<P, LocalBuf<P>, 16, 1>::prepare(&ctx, &pd, &ctrl_config)?;
        let own = Owned {
            config: *config,
            pool,
            pd,
            ctx,
        };
        Ok(Half { data, ctrl, own })
    }

    /// What the peer needs: the data, then the control endpoint.
    pub(super) fn endpoints(&self) -> [u8; 2 * ENDPOINT_LEN] {
        let mut mine = [0u8; 2 * ENDPOINT_LEN];
        mine[..ENDPOINT_LEN].copy_from_slice(&self.data.endpoint().encode());
        mine[ENDPOINT_LEN..].copy_from_slice(&self.ctrl.endpoint().encode());
        mine
    }

    /// Connects both channels to the peer's `theirs` (its [`endpoints`](Self::endpoints)).
    pub(super) fn join(self, theirs: &[u8]) -> Result<Joined<P>, ConnectError<P::Error>> {
        let (Some(d), Some(c)) = (theirs.get(..ENDPOINT_LEN), theirs.get(ENDPOINT_LEN..)) else {
            return Err(ConnectError::Endpoint(crate::qp::EndpointError::Length {
                got: theirs.len(),
            }));
        };
        let (d, c) = (Endpoint::decode(d)?, Endpoint::decode(c)?);
        Ok(Joined {
            data: self.data.connect(&d)?,
            ctrl: self.ctrl.connect(&c)?,
            own: self.own,
        })
    }
}

impl<P: Provider + 'static> Connection<P> {
    /// Connects to a peer listening at `addr` ([`listen`](Self::listen)): opens `device`,
    /// allocates a protection domain and a pool of `pool_bytes`, and sets up the data and
    /// control queue pairs over TCP, all within `config.timeout`.
    pub async fn connect(
        provider: &P,
        device: &str,
        addr: SocketAddr,
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError<P::Error>> {
        let setup = SetUp::connect(addr, config.timeout).await?;
        Self::set_up(provider, device, setup, pool_bytes, config).await
    }

    /// Accepts one peer on `listener` (bound by the caller, e.g. to `127.0.0.1:0`), as
    /// [`connect`](Self::connect) does on the other side.
    pub async fn listen(
        provider: &P,
        device: &str,
        listener: &tokio::net::TcpListener,
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError<P::Error>> {
        let setup = SetUp::accept(listener, config.timeout).await?;
        Self::set_up(provider, device, setup, pool_bytes, config).await
    }

    async fn set_up(
        provider: &P,
        device: &str,
        mut setup: SetUp,
        pool_bytes: usize,
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError<P::Error>> {
        let half = Half::open(provider, device, pool_bytes, config)?;
        let theirs = setup.exchange(&half.endpoints(), 2 * ENDPOINT_LEN).await?;
        match half.join(&theirs).and_then(Self::assemble) {
            Ok(connection) => {
                setup.confirm(true).await?;
                Ok(connection)
            }
            Err(e) => {
                let _ = setup.confirm::<P::Error>(false).await;
                Err(e)
            }
        }
    }

    /// The connection over `joined`'s channels (at RTS), its control loop spawned.
    pub(super) fn assemble(joined: Joined<P>) -> Result<Self, ConnectError<P::Error>> {
        let Joined { data, ctrl, own } = joined;
        let Owned {
            config,
            pool,
            pd,
            ctx,
        } = own;
        let data = AsyncChannel::new(data)?;
        let ctrl = AsyncChannel::new(ctrl)?;
        let inner = Arc::new(Inner {
            id: CONNECTIONS.fetch_add(1, Ordering::Relaxed),
            ctrl,
            state: Mutex::new(State {
                next_id: 0,
                asked: None,
                reply: None,
                leases: (0..LEASES).map(|_| None).collect(),
                offered: VecDeque::with_capacity(LEASES),
                returned: VecDeque::with_capacity(LEASES),
                over: None,
                serving: None,
            }),
            news: Notify::new(),
            asking: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
            config,
            pool,
            pd,
            _ctx: ctx,
        });
        let serving = tokio::spawn(serve(
            Arc::downgrade(&inner),
            inner.ctrl.clone(),
            inner.pool.clone(),
        ));
        inner.lock().serving = Some(serving.abort_handle());
        Ok(Connection {
            data,
            inner,
            serving,
            link: None,
        })
    }

    /// The data channel: the user's sends, receives, writes, reads and atomics.
    pub fn channel(&self) -> &AsyncChannel<P> {
        &self.data
    }

    /// The pool local buffers come from (and lent memory is carved from).
    pub fn pool(&self) -> &MrPool<P> {
        &self.inner.pool
    }

    /// Asks the peer to lend `len` bytes of its memory with `access` (remote rights only).
    pub async fn request_remote(
        &self,
        len: u64,
        access: AccessFlags,
    ) -> Result<RemoteBuf<P>, RemoteError<P::Error>> {
        if len == 0 || access.is_empty() || !REMOTE_RIGHTS.contains(access) {
            return Err(RemoteError::Refused);
        }
        let _one = self.inner.asking.lock().await;
        let id = {
            let mut s = self.inner.lock();
            s.reply = None;
            s.next_id = s.next_id.wrapping_add(1);
            let id = s.next_id;
            s.asked = Some(Ask {
                id,
                len,
                abandoned: false,
            });
            id
        };
        let asked = async {
            self.inner.send(Msg::Request { id, len, access }).await?;
            self.inner.wait(|s| s.reply.take()).await
        };
        let reply = match asked.await {
            Ok(reply) => reply,
            Err(e) => {
                // Given up (or over): an answer that still comes is not this call's.
                if let Some(ask) = self.inner.lock().asked.as_mut().filter(|a| a.id == id) {
                    ask.abandoned = true;
                }
                return Err(e);
            }
        };
        match reply {
            Msg::Grant {
                lease,
                addr,
                len: granted,
                rkey,
                ..
            } if granted == len => Ok(self.inner.remote_buf(lease, addr, granted, rkey)),
            Msg::Refuse {
                status: REFUSED_EXHAUSTED,
                ..
            } => Err(RemoteError::Exhausted),
            Msg::Refuse { .. } => Err(RemoteError::Refused),
            _ => Err(self.inner.protocol(WireError::Unexpected(2))),
        }
    }

    /// Hands a lease back to its owner (who gets the buffer with
    /// [`receive_local`](Self::receive_local)): after this side finished writing it.
    pub async fn send_remote(&self, mut buf: RemoteBuf<P>) -> Result<(), RemoteError<P::Error>> {
        if buf.conn.id != self.inner.id {
            return Err(RemoteError::ForeignToken);
        }
        buf.live = false;
        self.inner.send(Msg::Return { lease: buf.lease }).await
    }

    /// Lends `buf` to the peer with `access` (it gets a [`RemoteBuf`] from
    /// [`receive_remote`](Self::receive_remote)); the buffer comes back with
    /// [`receive_local`](Self::receive_local) when the peer returns it.
    pub async fn send_local(
        &self,
        buf: LocalBuf<P>,
        access: AccessFlags,
    ) -> Result<(), RemoteError<P::Error>> {
        if access.is_empty() || !REMOTE_RIGHTS.contains(access) || !buf.belongs_to(&self.inner.pool)
        {
            return Err(RemoteError::Refused);
        }
        let (lease, addr, len, rkey) = self.inner.lend(buf, access)?;
        self.inner
            .send(Msg::Give {
                lease,
                addr,
                len,
                rkey,
            })
            .await
    }

    /// Waits for a lease the peer offers ([`send_local`](Self::send_local)).
    pub async fn receive_remote(&self) -> Result<RemoteBuf<P>, RemoteError<P::Error>> {
        let (lease, r) = self.inner.wait(|s| s.offered.pop_front()).await?;
        Ok(self.inner.remote_buf(lease, r.addr, r.len, r.rkey))
    }

    /// Waits for a buffer of ours the peer handed back ([`send_remote`](Self::send_remote)
    /// on its side), with what it wrote.
    pub async fn receive_local(&self) -> Result<LocalBuf<P>, RemoteError<P::Error>> {
        self.inner.wait(|s| s.returned.pop_front()).await
    }

    /// Leases of ours the peer holds now.
    pub fn leases_out(&self) -> usize {
        self.inner.lock().leases.iter().flatten().count()
    }
}

impl<P: Provider + 'static> Drop for Connection<P> {
    fn drop(&mut self) {
        // Our memory is no longer lent: registrations dropped, buffers back in the pool.
        self.serving.abort();
        self.inner.end(Over::Gone);
    }
}

impl<P: Provider + 'static> Inner<P> {
    fn lock(&self) -> MutexGuard<'_, State<P>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remote_buf(self: &Arc<Self>, lease: u32, addr: u64, len: u64, rkey: u32) -> RemoteBuf<P> {
        RemoteBuf {
            region: RemoteRegion { addr, len, rkey },
            lease,
            conn: self.clone(),
            live: true,
        }
    }

    /// Sends one control message.
    async fn send(&self, msg: Msg) -> Result<(), RemoteError<P::Error>> {
        if let Some(over) = self.lock().over {
            return Err(over.into());
        }
        let mut buf = self
            .pool
            .alloc(MSG_LEN)
            .map_err(|_| RemoteError::Exhausted)?;
        buf.copy_from_slice(&msg.encode());
        // The control queue pair has no timeout of its own (its receives wait as long as
        // the connection lives): a send is bounded here, and ends with the connection.
        // Given up, the future is dropped and its buffer stays with the channel until the
        // send is flushed.
        let sent = async {
            let sent = self.ctrl.send(buf);
            let r = match self.config.timeout {
                None => sent.await.0,
                Some(t) => match tokio::time::timeout(t, sent).await {
                    Ok((r, _)) => r,
                    Err(_) => return Err(RemoteError::Timeout),
                },
            };
            r.map_err(RemoteError::Verbs)
        };
        tokio::select! {
            r = sent => r,
            Err(over) = self.watch(|_| None::<()>) => Err(over.into()),
        }
    }

    /// Waits until `take` finds what it wants in the state, the connection ends, or the
    /// timeout passes.
    async fn wait<T>(
        &self,
        take: impl FnMut(&mut State<P>) -> Option<T>,
    ) -> Result<T, RemoteError<P::Error>> {
        let waiting = async { self.watch(take).await.map_err(Into::into) };
        match self.config.timeout {
            None => waiting.await,
            Some(t) => tokio::time::timeout(t, waiting)
                .await
                .unwrap_or(Err(RemoteError::Timeout)),
        }
    }

    /// Waits, without a bound, until `take` finds what it wants or the connection ends.
    async fn watch<T>(&self, mut take: impl FnMut(&mut State<P>) -> Option<T>) -> Result<T, Over> {
        loop {
            let notified = self.news.notified();
            let mut notified = core::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                // Over first: nothing queued is handed out once the connection ended.
                if let Some(over) = s.over {
                    return Err(over);
                }
                if let Some(t) = take(&mut s) {
                    return Ok(t);
                }
            }
            notified.await;
        }
    }

    /// Lends `buf` with `access` under a registration of its own; `(lease, addr, len, rkey)`.
    fn lend(
        &self,
        mut buf: LocalBuf<P>,
        access: AccessFlags,
    ) -> Result<(u32, u64, u64, u32), RemoteError<P::Error>> {
        let mut s = self.lock();
        let Some(slot) = s.leases.iter().position(Option::is_none) else {
            return Err(RemoteError::Exhausted);
        };
        let bytes = buf.as_mut_slice();
        let (ptr, len) = (bytes.as_mut_ptr(), bytes.len());
        // SAFETY: the memory is the buffer's own (owned, it does not move); the lease keeps
        // it, untouched by Rust code, until the registration is dropped (a lease ends by
        // dropping its registration first). Remote rights are what the lease is for.
        let mr = crate::error::verb("ibv_reg_mr", unsafe {
            P::register_mr(&self.pd.raw, ptr, len, access | AccessFlags::LOCAL_WRITE)
        })?;
        let (_, rkey) = P::mr_keys(&mr);
        let addr = buf.addr();
        s.leases[slot] = Some(Lease { _mr: mr, buf });
        Ok((slot as u32, addr, len as u64, rkey))
    }

    /// Ends lease `lease`: its registration dropped, its buffer returned.
    fn unlend(&self, s: &mut State<P>, lease: u32) -> Option<LocalBuf<P>> {
        let Lease { _mr, buf } = s.leases.get_mut(lease as usize)?.take()?;
        drop(_mr);
        Some(buf)
    }

    /// A protocol error: the connection ends.
    fn protocol(&self, e: WireError) -> RemoteError<P::Error> {
        self.end(Over::Protocol(e));
        RemoteError::Protocol(e)
    }

    /// Ends the connection: the control loop stops (nothing the peer sends is acted on
    /// any more), every lease of ours ends (its registration dropped first), and every
    /// waiter learns why. Called from the control loop itself, the abort lands on its
    /// next await, which it does not reach.
    fn end(&self, why: Over) {
        let mut s = self.lock();
        s.over.get_or_insert(why);
        if let Some(serving) = s.serving.take() {
            serving.abort();
        }
        for lease in s.leases.iter_mut() {
            lease.take();
        }
        s.returned.clear();
        s.offered.clear();
        s.reply = None;
        drop(s);
        self.news.notify_waiters();
    }
}

impl<E> From<Over> for RemoteError<E> {
    fn from(o: Over) -> Self {
        match o {
            Over::Gone => RemoteError::PeerGone,
            Over::Protocol(e) => RemoteError::Protocol(e),
        }
    }
}

/// The control loop: receives the peer's messages and answers them; a receive is always
/// posted before an answer goes out, so two sides answering each other cannot deadlock.
async fn serve<P: Provider + 'static>(
    conn: std::sync::Weak<Inner<P>>,
    ctrl: AsyncChannel<P, LocalBuf<P>, 16, 1>,
    pool: MrPool<P>,
) {
    let (Ok(first), Ok(mut spare)) = (pool.alloc(MSG_LEN), pool.alloc(MSG_LEN)) else {
        if let Some(c) = conn.upgrade() {
            c.end(Over::Gone);
        }
        return;
    };
    let (r, mut got) = ctrl.receive(first).await;
    let mut r = r.map(|c| c.byte_len);
    loop {
        let Some(c) = conn.upgrade() else {
            return; // the connection was dropped
        };
        let msg = match r {
            Ok(n) if n as usize == MSG_LEN => Msg::decode(&got[..]),
            Ok(n) => Err(WireError::Length(n as usize)),
            Err(_) => {
                c.end(Over::Gone);
                return;
            }
        };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                c.end(Over::Protocol(e));
                return;
            }
        };
        // The next receive is posted before the answer goes out, and a handler's
        // protocol error ends the connection at once, not when the next message comes.
        let next = async { Ok::<_, Over>(ctrl.receive(spare).await) };
        let ((next, buf), ()) = match tokio::try_join!(next, handle(&c, msg)) {
            Ok(done) => done,
            Err(e) => {
                c.end(e);
                return;
            }
        };
        drop(c);
        spare = got;
        got = buf;
        r = next.map(|c| c.byte_len);
    }
}

/// Acts on one message from the peer.
async fn handle<P: Provider + 'static>(c: &Arc<Inner<P>>, msg: Msg) -> Result<(), Over> {
    match msg {
        Msg::Request { id, len, access } => {
            let answer = match usize::try_from(len).ok().map(|l| c.pool.alloc(l)) {
                Some(Ok(buf)) => match c.lend(buf, access) {
                    Ok((lease, addr, len, rkey)) => Msg::Grant {
                        id,
                        lease,
                        addr,
                        len,
                        rkey,
                    },
                    Err(_) => Msg::Refuse {
                        id,
                        status: REFUSED_EXHAUSTED,
                    },
                },
                Some(Err(crate::pool::PoolError::Exhausted { .. })) => Msg::Refuse {
                    id,
                    status: REFUSED_EXHAUSTED,
                },
                _ => Msg::Refuse {
                    id,
                    status: REFUSED_BAD,
                },
            };
            c.send(answer).await.map_err(|_| Over::Gone)
        }
        Msg::Grant { id, len, lease, .. } => match answer(c, msg, id, Some((len, lease)))? {
            // Its caller gave up: the lease goes back at once.
            Some(lease) => c.send(Msg::Release { lease }).await.map_err(|_| Over::Gone),
            None => Ok(()),
        },
        Msg::Refuse { id, .. } => answer(c, msg, id, None).map(drop),
        Msg::Give {
            lease,
            addr,
            len,
            rkey,
        } => {
            let mut s = c.lock();
            if s.offered.len() >= LEASES {
                return Err(Over::Protocol(WireError::Unexpected(4)));
            }
            s.offered
                .push_back((lease, RemoteRegion { addr, len, rkey }));
            drop(s);
            c.news.notify_waiters();
            Ok(())
        }
        Msg::Return { lease } => {
            let mut s = c.lock();
            let buf = c
                .unlend(&mut s, lease)
                .ok_or(Over::Protocol(WireError::Lease(lease)))?;
            s.returned.push_back(buf);
            drop(s);
            c.news.notify_waiters();
            Ok(())
        }
        Msg::Release { lease } => {
            let mut s = c.lock();
            c.unlend(&mut s, lease)
                .map(drop)
                .ok_or(Over::Protocol(WireError::Lease(lease)))
        }
    }
}

/// Takes `msg`, a grant (`granted`: its length and lease) or a refusal answering request
/// `id`, as the answer to the request outstanding, if it is one; the lease of a grant whose
/// caller gave up waiting, to release.
fn answer<P: Provider + 'static>(
    c: &Inner<P>,
    msg: Msg,
    id: u32,
    granted: Option<(u64, u32)>,
) -> Result<Option<u32>, Over> {
    let kind = if granted.is_some() { GRANT } else { REFUSE };
    let mut s = c.lock();
    let ask = match s.asked {
        Some(a) if a.id == id && s.reply.is_none() => a,
        _ => return Err(Over::Protocol(WireError::Unexpected(kind))),
    };
    if let Some((granted, _)) = granted.filter(|&(len, _)| len != ask.len) {
        let asked = ask.len;
        return Err(Over::Protocol(WireError::Granted { asked, granted }));
    }
    s.asked = None;
    if ask.abandoned {
        return Ok(granted.map(|(_, lease)| lease));
    }
    s.reply = Some(msg);
    drop(s);
    c.news.notify_waiters();
    Ok(None)
}
