//! [`AsyncRpc`]: `call(session, type, request).await` over an [`Rpc`], driven by a task
//! that sleeps on the engine's completion channel.
//!
//! The engine stays what it is (one UD queue pair, handlers by type); a driver task owns
//! its passes: it runs them while they find work, then arms the completion queue, runs one
//! more (arm, then poll: a datagram that came before the arm raises no event, and this pass
//! finds it), and sleeps until the descriptor is readable, a caller enqueues something, or
//! the core's next timer is due. No polling timer.
//!
//! A call copies its request in and its response out into a `Vec` the caller hands over
//! and gets back (reused, it allocates nothing once its capacity suffices). Dropping a call
//! future leaves its request to the core: its answer, when it comes, is dropped with the
//! buffer; no memory the device may touch is lent to the call, so cancellation is sound.
//!
//! A large call ([`AsyncRpc::call_bulk`], on an engine with a bulk path) hands over a
//! registered buffer, which the engine owns until the outcome: the server reads it in
//! place, and it comes back with the outcome (the response is copied into the `Vec`, one
//! copy where the blocking engine lends it in place). A dropped large call's buffer goes
//! back to the pool once the engine is done with it, never earlier.

use core::future::poll_fn;
use core::pin::pin;
use core::task::{Poll, Waker};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::Error;
use crate::pool::{DeviceBuf, LocalBuf};
use crate::provider::Provider;
use crate::qp::Endpoint;
use crate::rpc::{EngineError, Event, MsgBuf, Notice, Rpc, RpcError, SessionId};

/// An [`Rpc`] for tasks: a cloneable handle; the driver task ends with the last one.
///
/// ```
/// # #[cfg(feature = "sim")] {
/// use zverbs::provider::sim::Sim;
/// use zverbs::rpc::{EngineConfig, Rpc};
/// use zverbs::tokio::AsyncRpc;
/// use zverbs::Context;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let sim = Sim::with_devices(2);
/// let cfg = EngineConfig { events: true, ..EngineConfig::default() };
/// let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
/// let mut engine = Rpc::new(&cb, cb.alloc_pd().unwrap(), cfg.clone()).unwrap();
/// engine.register_handler(1, |req, resp| {
///     resp[..req.len()].copy_from_slice(req);
///     req.len()
/// }).unwrap();
/// let server = AsyncRpc::new(engine).unwrap();
/// let client = AsyncRpc::new(Rpc::new(&ca, ca.alloc_pd().unwrap(), cfg).unwrap()).unwrap();
/// let session = client.connect(&server.addr()).await.unwrap();
/// let (result, resp) = client.call(session, 1, b"ping", Vec::new()).await;
/// result.unwrap();
/// assert_eq!(resp, b"ping");
/// # });
/// # }
/// ```
pub struct AsyncRpc<P: Provider> {
    shared: Arc<Shared<P>>,
}

impl<P: Provider> Clone for AsyncRpc<P> {
    fn clone(&self) -> Self {
        self.shared
            .handles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        AsyncRpc {
            shared: self.shared.clone(),
        }
    }
}

impl<P: Provider> Drop for AsyncRpc<P> {
    fn drop(&mut self) {
        if self
            .shared
            .handles
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.shared.kick.notify_one();
        }
    }
}

struct Shared<P: Provider> {
    state: Mutex<State<P>>,
    /// Something for the driver: a request enqueued, the last handle gone.
    kick: tokio::sync::Notify,
    handles: std::sync::atomic::AtomicUsize,
}

struct State<P: Provider> {
    rpc: Rpc<P>,
    calls: Vec<Call<P>>,
    free: Vec<usize>,
    /// Sessions being opened.
    connecting: Vec<Opening>,
    /// A device error stopped the driver: every call since fails with it (those waiting
    /// then fail with `SessionFailed`).
    broken: Option<EngineError<P::Error>>,
}

/// A session being opened: its outcome once known, and who waits for it.
struct Opening(SessionId, Option<Result<(), RpcError>>, Option<Waker>);

/// What a call gives back: its outcome and the response buffer.
type Answer<E> = (Result<(), EngineError<E>>, Vec<u8>);

/// What a large call gives back: its outcome, the request's buffer (the engine gives it
/// back with every outcome; `None` only if it was refused before the engine took it, when
/// the error says why) and the response buffer.
/// `B` is the buffer's type: [`LocalBuf`] from [`call_bulk`](AsyncRpc::call_bulk),
/// [`DeviceBuf`] from [`call_bulk_device`](AsyncRpc::call_bulk_device).
pub type BulkAnswer<P, B = LocalBuf<P>> = (
    Result<(), EngineError<<P as Provider>::Error>>,
    Option<B>,
    Vec<u8>,
);

struct Call<P: Provider> {
    /// A future waits for it (else its answer is dropped when it comes).
    live: bool,
    done: Option<Result<(), RpcError>>,
    resp: Vec<u8>,
    /// A large request's buffer, back from the engine.
    msg: Option<MsgBuf<P>>,
    waker: Option<Waker>,
}

impl<P: Provider> Default for Call<P> {
    fn default() -> Self {
        Call {
            live: false,
            done: None,
            resp: Vec::new(),
            msg: None,
            waker: None,
        }
    }
}

impl<P: Provider> State<P> {
    /// Runs one pass, delivering what it brings.
    fn pass(&mut self) -> Result<usize, EngineError<P::Error>> {
        let (calls, free, connecting) = (&mut self.calls, &mut self.free, &mut self.connecting);
        self.rpc.run_event_loop_once(&mut |n| {
            let (tag, outcome, bytes, msg) = match n {
                Notice::Response { tag, bytes, msg } => (tag, Ok(()), bytes, msg),
                Notice::Failed { tag, error, msg } => (tag, Err(error), &[][..], msg),
                Notice::Session(ev) => {
                    let (s, r) = match ev {
                        Event::Connected(s) => (s, Ok(())),
                        Event::ConnectFailed { session, error } => (session, Err(error)),
                        _ => return,
                    };
                    if let Some(c) = connecting.iter_mut().find(|c| c.0 == s) {
                        c.1 = Some(r);
                        if let Some(w) = c.2.take() {
                            w.wake();
                        }
                    }
                    return;
                }
            };
            let Some(call) = calls.get_mut(tag as usize) else {
                return;
            };
            if call.live {
                call.resp.clear();
                call.resp.extend_from_slice(bytes);
                call.msg = msg;
                call.done = Some(outcome);
                if let Some(w) = call.waker.take() {
                    w.wake();
                }
            } else {
                *call = Call::default();
                free.push(tag as usize);
            }
        })
    }
}

/// The engine's completion-channel descriptor; the driver only watches it.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl<P: Provider + 'static> AsyncRpc<P> {
    /// Wraps `rpc` (made with [`EngineConfig::events`](crate::rpc::EngineConfig::events)
    /// and its handlers registered) and spawns its driver on the current tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] without events or outside a runtime.
    pub fn new(rpc: Rpc<P>) -> Result<Self, Error<P::Error>>
    where
        Rpc<P>: Send,
    {
        let fd = rpc
            .events()
            .map(|(ch, _)| ch.as_raw_fd())
            .ok_or(Error::InvalidAttribute(
                "AsyncRpc needs EngineConfig::events",
            ))?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::InvalidAttribute("AsyncRpc::new outside a tokio runtime"))?;
        // SAFETY: the descriptor belongs to the engine's completion channel, which `shared`
        // keeps open until the driver, which owns this registration, has dropped it.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
            .map_err(|_| Error::InvalidAttribute("the completion channel cannot join tokio"))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rpc,
                calls: Vec::new(),
                free: Vec::new(),
                connecting: Vec::new(),
                broken: None,
            }),
            kick: tokio::sync::Notify::new(),
            handles: std::sync::atomic::AtomicUsize::new(1),
        });
        runtime.spawn(drive(fd, shared.clone()));
        Ok(AsyncRpc { shared })
    }
}

impl<P: Provider> AsyncRpc<P> {
    fn lock(&self) -> MutexGuard<'_, State<P>> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This endpoint's address, for peers' [`connect`](Self::connect).
    pub fn addr(&self) -> Endpoint {
        self.lock().rpc.addr()
    }

    /// Opens a session to the `Rpc` at `remote`.
    pub async fn connect(&self, remote: &Endpoint) -> Result<SessionId, EngineError<P::Error>> {
        let s = {
            let mut st = self.lock();
            let s = st.rpc.create_session(remote)?;
            st.connecting.push(Opening(s, None, None));
            s
        };
        self.shared.kick.notify_one();
        let r = poll_fn(|cx| {
            let mut st = self.lock();
            let Some(i) = st.connecting.iter().position(|c| c.0 == s) else {
                return Poll::Ready(Err(RpcError::UnknownSession));
            };
            match st.connecting[i].1.take() {
                Some(r) => {
                    st.connecting.swap_remove(i);
                    Poll::Ready(r)
                }
                None => {
                    st.connecting[i].2 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await;
        r.map(|()| s).map_err(EngineError::Rpc)
    }

    /// Sends `req` as a request of `req_type` on `session` and waits for the answer, which
    /// replaces the contents of `resp`; gives `resp` back with the outcome.
    pub async fn call(
        &self,
        session: SessionId,
        req_type: u8,
        req: &[u8],
        resp: Vec<u8>,
    ) -> Answer<P::Error> {
        let tag = {
            let mut st = self.lock();
            if let Some(e) = &st.broken {
                return (Err(e.clone()), resp);
            }
            let tag = match st.free.pop() {
                Some(t) => t,
                None => {
                    st.calls.push(Call::default());
                    st.calls.len() - 1
                }
            };
            if let Err(e) = st.rpc.enqueue_request(session, req_type, req, tag as u64) {
                st.free.push(tag);
                return (Err(e), resp);
            }
            st.calls[tag] = Call {
                live: true,
                resp,
                ..Call::default()
            };
            tag
        };
        let (r, _, resp) = self.wait(tag).await;
        (r, resp)
    }

    /// A buffer of `len` bytes from the engine's bulk pool, for
    /// [`call_bulk`](Self::call_bulk) ([`Rpc::alloc_msg`]).
    ///
    /// # Errors
    /// As [`Rpc::alloc_msg`].
    pub fn alloc_msg(&self, len: usize) -> Result<LocalBuf<P>, EngineError<P::Error>> {
        self.lock().rpc.alloc_msg(len)
    }

    /// Sends `msg` as a large request of `req_type` on `session` over the bulk path
    /// ([`Rpc::enqueue_bulk`]) and waits for the answer, which replaces the contents of
    /// `resp`; gives the request's buffer and `resp` back with the outcome.
    pub async fn call_bulk(
        &self,
        session: SessionId,
        req_type: u8,
        msg: LocalBuf<P>,
        resp: Vec<u8>,
    ) -> BulkAnswer<P> {
        let (r, msg, resp) = self
            .call_large(session, req_type, MsgBuf::Host(msg), resp)
            .await;
        (r, msg.and_then(MsgBuf::into_host), resp)
    }

    /// Sends `msg`, in device memory, as a large request of `req_type` on `session`
    /// ([`Rpc::enqueue_bulk_device`]: the server reads it straight from the device) and
    /// waits for the answer, which replaces the contents of `resp` (host memory); gives
    /// the request's buffer and `resp` back with the outcome.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::rpc::{BulkConfig, EngineConfig, Rpc};
    /// use zverbs::tokio::AsyncRpc;
    /// use zverbs::{AccessFlags, Context, DevicePool};
    /// let sim = Sim::with_devices(2);
    /// let engine = |dev: &str| {
    ///     let ctx = Context::open(&sim, dev).unwrap();
    ///     let pd = ctx.alloc_pd().unwrap();
    ///     let cfg = EngineConfig { bulk: Some(BulkConfig::default()), events: true, ..EngineConfig::default() };
    ///     let mut rpc = Rpc::new(&ctx, pd, cfg).unwrap();
    ///     // An echo.
    ///     rpc.register_handler(1, |req, out| { out[..req.len()].copy_from_slice(req); req.len() }).unwrap();
    ///     (ctx, rpc)
    /// };
    /// let ((_, server), (ctx, client)) = (engine("sim1"), engine("sim0"));
    /// // The client's device memory (the simulator's stand-in for a GPU's dmabuf) on the
    /// // engine's protection domain, readable by the server.
    /// let gpu = ctx.raw().alloc_device_memory(1 << 16).unwrap();
    /// let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
    /// let region = client.pd().register_dmabuf_owned(fd, 0, 1 << 16, 0x7f00_0000_0000, AccessFlags::REMOTE_READ);
    /// let pool = DevicePool::new(region.unwrap()).unwrap();
    /// let msg = pool.alloc(20_000).unwrap();
    /// gpu.copy_in(msg.offset(), &[7; 20_000]).unwrap();
    ///
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// rt.block_on(async {
    ///     let server = AsyncRpc::new(server).unwrap();
    ///     let client = AsyncRpc::new(client).unwrap();
    ///     let session = client.connect(&server.addr()).await.unwrap();
    ///     let (r, msg, resp) = client.call_bulk_device(session, 1, msg, Vec::new()).await;
    ///     r.unwrap();
    ///     assert_eq!(resp, [7; 20_000]); // the answer, in host memory
    ///     assert_eq!(msg.map(|m| m.len()), Some(20_000)); // the device buffer, back
    /// });
    /// # }
    /// ```
    pub async fn call_bulk_device(
        &self,
        session: SessionId,
        req_type: u8,
        msg: DeviceBuf<P>,
        resp: Vec<u8>,
    ) -> BulkAnswer<P, DeviceBuf<P>> {
        let (r, msg, resp) = self
            .call_large(session, req_type, MsgBuf::Device(msg), resp)
            .await;
        (r, msg.and_then(MsgBuf::into_device), resp)
    }

    /// A large call with either kind of buffer; the engine gives back the kind it took.
    async fn call_large(
        &self,
        session: SessionId,
        req_type: u8,
        msg: MsgBuf<P>,
        resp: Vec<u8>,
    ) -> BulkAnswer<P, MsgBuf<P>> {
        let tag = {
            let mut st = self.lock();
            if let Some(e) = &st.broken {
                return (Err(e.clone()), Some(msg), resp);
            }
            let tag = st.free.pop().unwrap_or_else(|| {
                st.calls.push(Call::default());
                st.calls.len() - 1
            });
            let (rpc, id) = (&mut st.rpc, tag as u64);
            let enqueued = match msg {
                MsgBuf::Host(m) => rpc
                    .enqueue_bulk(session, req_type, m, id)
                    .map_err(|(e, m)| (e, MsgBuf::Host(m))),
                MsgBuf::Device(m) => rpc
                    .enqueue_bulk_device(session, req_type, m, id)
                    .map_err(|(e, m)| (e, MsgBuf::Device(m))),
            };
            if let Err((e, msg)) = enqueued {
                st.free.push(tag);
                return (Err(e), Some(msg), resp);
            }
            st.calls[tag] = Call {
                live: true,
                resp,
                ..Call::default()
            };
            tag
        };
        self.wait(tag).await
    }

    /// Waits for call `tag`'s outcome (a large call's buffer with it).
    async fn wait(&self, tag: usize) -> BulkAnswer<P, MsgBuf<P>> {
        self.shared.kick.notify_one();
        let mut waiting = Waiting {
            rpc: self,
            tag: Some(tag),
        };
        poll_fn(|cx| waiting.poll(cx.waker())).await
    }
}

/// A call's wait; dropped early, it leaves the answer to be dropped when it comes.
struct Waiting<'a, P: Provider> {
    rpc: &'a AsyncRpc<P>,
    tag: Option<usize>,
}

impl<P: Provider> Waiting<'_, P> {
    fn poll(&mut self, waker: &Waker) -> Poll<BulkAnswer<P, MsgBuf<P>>> {
        let Some(tag) = self.tag else {
            return Poll::Pending;
        };
        let mut st = self.rpc.lock();
        let call = &mut st.calls[tag];
        match call.done.take() {
            Some(r) => {
                let resp = core::mem::take(&mut call.resp);
                let msg = call.msg.take();
                *call = Call::default();
                st.free.push(tag);
                self.tag = None;
                Poll::Ready((r.map_err(EngineError::Rpc), msg, resp))
            }
            None => {
                call.waker = Some(waker.clone());
                Poll::Pending
            }
        }
    }
}

impl<P: Provider> Drop for Waiting<'_, P> {
    fn drop(&mut self) {
        if let Some(tag) = self.tag {
            let mut st = self.rpc.lock();
            if st.calls[tag].done.is_some() {
                st.calls[tag] = Call::default();
                st.free.push(tag);
            } else {
                st.calls[tag].live = false;
                st.calls[tag].waker = None;
            }
        }
    }
}

/// The driver task. The descriptor's registration goes before the engine (and with it the
/// completion channel) can.
async fn drive<P: Provider>(fd: AsyncFd<Fd>, shared: Arc<Shared<P>>) {
    run(&fd, &shared).await;
    drop(fd);
    drop(shared);
}

/// The driver: passes while they find work; then arm, pass, and sleep.
async fn run<P: Provider>(fd: &AsyncFd<Fd>, shared: &Shared<P>) {
    let lock = || shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if shared.handles.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return;
        }
        let sleep_for = {
            let mut st = lock();
            let mut busy = true;
            let mut result = Ok(());
            while busy && result.is_ok() {
                st.rpc.wake();
                result = st.pass().map(|n| busy = n > 0);
            }
            // Arm, then pass once more: what came before the arm is found now.
            if result.is_ok() {
                if let Some((_, cq)) = st.rpc.events() {
                    result = cq.arm(false).map_err(EngineError::Device);
                }
            }
            if result.is_ok() {
                st.rpc.wake();
                result = st.pass().map(|n| busy = n > 0);
            }
            if let Err(e) = result {
                fail_all(&mut st, e);
                return;
            }
            if busy {
                continue;
            }
            st.rpc.next_timeout()
        };
        let timer = async {
            match sleep_for {
                Some(d) => tokio::time::sleep(d).await,
                None => core::future::pending().await,
            }
        };
        let mut timer = pin!(timer);
        tokio::select! {
            ready = fd.readable() => {
                if let Ok(mut guard) = ready {
                    let st = lock();
                    if let Some((ch, cq)) = st.rpc.events() {
                        // Take and acknowledge every event; readiness is cleared only
                        // once the descriptor said would-block.
                        let mut drained = false;
                        while let Ok(ev) = ch.try_get_event() {
                            match ev {
                                Some(ev) => {
                                    let _ = cq.ack_event(ev);
                                }
                                None => {
                                    drained = true;
                                    break;
                                }
                            }
                        }
                        if drained {
                            guard.clear_ready();
                        }
                    }
                }
            }
            () = shared.kick.notified() => {}
            () = &mut timer => {}
        }
    }
}

/// A device error: every waiting call and connect ends with it.
fn fail_all<P: Provider>(st: &mut State<P>, e: EngineError<P::Error>) {
    for call in st.calls.iter_mut().filter(|c| c.live && c.done.is_none()) {
        call.done = Some(Err(RpcError::SessionFailed));
        if let Some(w) = call.waker.take() {
            w.wake();
        }
    }
    for c in st.connecting.iter_mut().filter(|c| c.1.is_none()) {
        c.1 = Some(Err(RpcError::SessionFailed));
        if let Some(w) = c.2.take() {
            w.wake();
        }
    }
    st.broken = Some(e);
}
