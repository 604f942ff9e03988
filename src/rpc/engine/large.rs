//! The engine's calls for large messages (its bulk path, [`crate::rpc::BulkConfig`]).

#[cfg(doc)]
use super::Notice;
use super::{EngineError, MsgBuf, Rpc};
use crate::device::ProtectionDomain;
use crate::pool::{DeviceBuf, LocalBuf, MrPool};
use crate::provider::Provider;
use crate::rpc::bulk::{Bulk, REQUEST};
use crate::rpc::{BulkFailure, RequestHandle, RpcError, SessionId};
use crate::types::AccessFlags;

/// Where the server reads a large request: address, remote key, length.
type Source = (u64, u32, usize);

impl<P: Provider> Rpc<P> {
    /// A buffer of `len` bytes from the bulk path's registered pool, for
    /// [`enqueue_bulk`](Self::enqueue_bulk).
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] without a bulk path; [`EngineError::Pool`] when the
    /// pool has no room (or `len` is 0 or beyond it).
    pub fn alloc_msg(&self, len: usize) -> Result<LocalBuf<P>, EngineError<P::Error>> {
        let b = self.bulk.as_ref().ok_or(EngineError::InvalidConfig(
            "no bulk path (EngineConfig::bulk)",
        ))?;
        b.pool().alloc(len).map_err(EngineError::Pool)
    }

    /// The bulk path's registered pool (its occupancy, an awaitable allocation), if there
    /// is a bulk path.
    pub fn msg_pool(&self) -> Option<&MrPool<P>> {
        self.bulk.as_deref().map(Bulk::pool)
    }

    /// Whether `session` has its reliable connection for large messages (set up before
    /// its `Notice::Session(Connected)`, when both ends have a bulk path).
    pub fn has_bulk_link(&self, session: SessionId) -> bool {
        self.bulk
            .as_ref()
            .is_some_and(|b| b.is_up(usize::from(session.index())))
    }

    /// The protection domain the engine's memory and queue pairs are in: where device
    /// memory for [`enqueue_bulk_device`](Self::enqueue_bulk_device) is registered.
    pub fn pd(&self) -> &ProtectionDomain<P> {
        &self.pd
    }

    /// Enqueues a large request of `req_type` on `session`, zero-copy: the server reads
    /// `msg` with an RDMA read over the session's reliable connection, runs the handler
    /// for the type, and the response comes inline (when it fits one packet) or by a
    /// second read into a buffer of this endpoint's pool. The [`Notice::Response`] or
    /// [`Notice::Failed`] with `tag` gives `msg` back ([`MsgBuf::Host`]); until then the
    /// engine holds it.
    ///
    /// # Errors
    /// With `msg` back: no bulk path, a buffer not from [`alloc_msg`](Self::alloc_msg),
    /// or one larger than [`BulkConfig::max_msg_size`](crate::rpc::BulkConfig::max_msg_size)
    /// ([`EngineError::InvalidConfig`]); a session without its reliable connection
    /// ([`RpcError::Bulk`]`(NoLink)`); the core's refusals ([`RpcError`]).
    #[allow(clippy::type_complexity)]
    pub fn enqueue_bulk(
        &mut self,
        session: SessionId,
        req_type: u8,
        msg: LocalBuf<P>,
        tag: u64,
    ) -> Result<RequestHandle, (EngineError<P::Error>, LocalBuf<P>)> {
        self.enqueue_large(session, req_type, msg, tag, MsgBuf::Host, |b, msg| {
            let ok = msg.belongs_to(b.pool()) && msg.len() <= b.max();
            ok.then_some((msg.addr(), b.pool().rkey(), msg.len()))
                .ok_or("a buffer from alloc_msg, at most max_msg_size")
        })
    }

    /// Enqueues a large request whose bytes are in device memory (GPUDirect RDMA): as
    /// [`enqueue_bulk`](Self::enqueue_bulk), the server reading `msg` straight from the
    /// device; its notice gives `msg` back as [`MsgBuf::Device`]. The response still
    /// lands in host memory (inline, or read into this endpoint's pool).
    ///
    /// `msg`'s region must be registered on [`pd`](Self::pd) with
    /// [`AccessFlags::REMOTE_READ`]; the server holds its remote key until the response.
    ///
    /// # Errors
    /// With `msg` back: no bulk path, a region without REMOTE_READ, or a buffer larger
    /// than `max_msg_size` ([`EngineError::InvalidConfig`]); the refusals of
    /// [`enqueue_bulk`](Self::enqueue_bulk). A region on another protection domain is
    /// refused by the server's device: the request fails with
    /// [`BulkFailure::Read`](crate::rpc::BulkFailure::Read).
    ///
    /// ```
    /// # #[cfg(all(feature = "sim", unix))] {
    /// use std::time::Duration;
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::rpc::{BulkConfig, EngineConfig, MsgBuf};
    /// use zverbs::testing::RpcPair;
    /// use zverbs::{AccessFlags, Context, DevicePool};
    /// let sim = Sim::with_devices(2);
    /// let cfg = EngineConfig { bulk: Some(BulkConfig::default()), ..EngineConfig::default() };
    /// // A server (on sim1) whose handler answers with the request's length.
    /// let mut p = RpcPair::connected(&sim, cfg.clone(), cfg, |s| {
    ///     s.register_handler(1, |req, out| {
    ///         out[..8].copy_from_slice(&(req.len() as u64).to_be_bytes());
    ///         8
    ///     })
    /// })
    /// .unwrap();
    /// // The client's device memory (the simulator's stand-in for a GPU's, exported as a
    /// // dmabuf), registered on the engine's protection domain for the server to read.
    /// let ctx = Context::open(&sim, "sim0").unwrap();
    /// let gpu = ctx.raw().alloc_device_memory(1 << 20).unwrap();
    /// let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
    /// let iova = 0x7f00_0000_0000;
    /// let region = p.client.pd().register_dmabuf_owned(fd, 0, 1 << 20, iova, AccessFlags::REMOTE_READ).unwrap();
    /// let pool = DevicePool::new(region).unwrap();
    ///
    /// p.client.enqueue_bulk_device(p.session, 1, pool.alloc(300_000).unwrap(), 7).unwrap();
    /// assert!(p.wait_for(1, Duration::from_secs(20)));
    /// let done = p.done.pop().unwrap();
    /// assert_eq!((done.tag, done.result.unwrap()), (7, 300_000u64.to_be_bytes().to_vec()));
    /// // The device buffer comes back with the response.
    /// assert_eq!(done.msg.and_then(MsgBuf::into_device).map(|b| b.len()), Some(300_000));
    /// # }
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn enqueue_bulk_device(
        &mut self,
        session: SessionId,
        req_type: u8,
        msg: DeviceBuf<P>,
        tag: u64,
    ) -> Result<RequestHandle, (EngineError<P::Error>, DeviceBuf<P>)> {
        self.enqueue_large(session, req_type, msg, tag, MsgBuf::Device, |b, msg| {
            let region = msg.region();
            let ok = region.access().contains(AccessFlags::REMOTE_READ) && msg.len() <= b.max();
            ok.then_some((msg.iova(), region.rkey(), msg.len()))
                .ok_or("device memory with REMOTE_READ, at most max_msg_size")
        })
    }

    /// Sends `msg` as a large request, the server to read it where `source` says (or
    /// `source`'s refusal, with `msg` back); once it is out, the engine holds it as
    /// `wrap(msg)` until its notice.
    #[allow(clippy::type_complexity)]
    fn enqueue_large<B>(
        &mut self,
        session: SessionId,
        req_type: u8,
        msg: B,
        tag: u64,
        wrap: fn(B) -> MsgBuf<P>,
        source: impl FnOnce(&Bulk<P>, &B) -> Result<Source, &'static str>,
    ) -> Result<RequestHandle, (EngineError<P::Error>, B)> {
        let Some(b) = self.bulk.as_deref() else {
            return Err((EngineError::InvalidConfig("no bulk path"), msg));
        };
        let (addr, rkey, len) = match source(b, &msg) {
            Ok(at) => at,
            Err(why) => return Err((EngineError::InvalidConfig(why), msg)),
        };
        if !b.is_up(usize::from(session.index())) {
            return Err((RpcError::Bulk(BulkFailure::NoLink).into(), msg));
        }
        let payload = b.request_payload(req_type, addr, rkey, len);
        let h = match self.core.enqueue_request(session, REQUEST, &payload) {
            Ok(h) => h,
            Err(e) => return Err((e.into(), msg)),
        };
        self.dirty = true;
        let i = self.tag_index(h);
        self.tags[i] = tag;
        if let Some(b) = self.bulk.as_deref_mut() {
            b.sent(i, wrap(msg));
        }
        Ok(h)
    }
}
