//! The engine's calls for large messages (its bulk path, [`crate::rpc::BulkConfig`]).

#[cfg(doc)]
use super::Notice;
use super::{EngineError, Rpc};
use crate::pool::{LocalBuf, MrPool};
use crate::provider::Provider;
use crate::rpc::bulk::{Bulk, REQUEST};
use crate::rpc::{BulkFailure, RequestHandle, RpcError, SessionId};

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

    /// Enqueues a large request of `req_type` on `session`, zero-copy: the server reads
    /// `msg` with an RDMA read over the session's reliable connection, runs the handler
    /// for the type, and the response comes inline (when it fits one packet) or by a
    /// second read into a buffer of this endpoint's pool. The [`Notice::Response`] or
    /// [`Notice::Failed`] with `tag` gives `msg` back; until then the engine holds it.
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
        let Some(b) = &mut self.bulk else {
            return Err((EngineError::InvalidConfig("no bulk path"), msg));
        };
        if !msg.belongs_to(b.pool()) || msg.len() > b.max() {
            return Err((
                EngineError::InvalidConfig("a buffer from alloc_msg, at most max_msg_size"),
                msg,
            ));
        }
        if !b.is_up(usize::from(session.index())) {
            return Err((RpcError::Bulk(BulkFailure::NoLink).into(), msg));
        }
        let payload = b.request_payload(req_type, &msg);
        let h = match self.core.enqueue_request(session, REQUEST, &payload) {
            Ok(h) => h,
            Err(e) => return Err((e.into(), msg)),
        };
        self.dirty = true;
        let i = self.tag_index(h);
        self.tags[i] = tag;
        if let Some(b) = &mut self.bulk {
            b.sent(i, msg);
        }
        Ok(h)
    }
}
