//! The bulk path's server side: accepting a session's connection, reading large requests,
//! running their handlers, answering inline or holding the response for the client's read.

use super::*;

impl<P: Provider> Bulk<P> {
    /// Server: a request arrived in its slot. True when it is the bulk path's.
    #[cold]
    #[inline(never)]
    pub(in crate::rpc) fn on_request(
        &mut self,
        core: &mut RpcCore,
        handle: ServerHandle,
        req_type: u8,
        tags: &[u64],
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Result<bool, RpcError> {
        let i = usize::from(handle.session().index());
        let slot = core.slot_of(i, handle.req_num());
        // The client sent its next request on the slot: it read the response held there.
        if let Op::Held { .. } = self.ops[slot] {
            self.ops[slot] = Op::Free;
        }
        let reply = match req_type {
            CONNECT => self.accept(core, handle, i, tags, notice),
            REQUEST => self.fetch(core, handle, i, slot),
            _ => return Ok(false),
        };
        if let Some(reply) = reply {
            core.respond(handle, reply.bytes())?;
        }
        Ok(true)
    }

    /// Server: connects session `i`'s queue pair to the client's; the answer.
    fn accept(
        &mut self,
        core: &mut RpcCore,
        handle: ServerHandle,
        i: usize,
        tags: &[u64],
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Option<Reply> {
        let ep = match core.request(handle) {
            Ok([VERSION, ep @ ..]) => Endpoint::decode(ep).ok(),
            _ => None,
        };
        let Some(ep) = ep else {
            return Some(Reply::status(REJECTED));
        };
        self.reset(i, core, tags, notice);
        let Link::Idle(qp) = mem::replace(&mut self.links[i], Link::Lost) else {
            return Some(Reply::status(NO_LINK));
        };
        self.links[i] = match qp.into_init(&access()) {
            Ok(qp) => up(qp, &ep),
            Err(e) => idle(e.qp),
        };
        let Link::Up(qp) = &self.links[i] else {
            return Some(Reply::status(NO_LINK));
        };
        let ep = qp.endpoint();
        let mut r = Reply::status(OK);
        r.buf[2..2 + ENDPOINT_LEN].copy_from_slice(&ep.encode());
        r.len += ENDPOINT_LEN;
        Some(r)
    }

    /// Server: starts the read of a large request; the answer if it cannot.
    fn fetch(
        &mut self,
        core: &RpcCore,
        handle: ServerHandle,
        i: usize,
        slot: usize,
    ) -> Option<Reply> {
        let Ok(&[VERSION, req_type, ref at @ ..]) = core.request(handle) else {
            return Some(Reply::status(REJECTED));
        };
        if at.len() != REQUEST_LEN - 2 {
            return Some(Reply::status(REJECTED));
        }
        let (addr, rkey, len) = (be64(&at[..8]), be32(&at[8..12]), be32(&at[12..]));
        match self.read(i, slot, addr, rkey, len as usize) {
            Ok(buf) => {
                self.ops[slot] = Op::Fetching {
                    buf,
                    handle,
                    req_type,
                };
                None
            }
            Err(BulkFailure::NoMemory) => Some(Reply::status(NO_MEMORY)),
            Err(BulkFailure::NoLink) => Some(Reply::status(NO_LINK)),
            Err(_) => Some(Reply::status(REJECTED)),
        }
    }

    /// Server: the read of a request completed; runs its handler.
    pub(super) fn serve(
        &mut self,
        core: &mut RpcCore,
        handlers: &mut [Option<Handler>],
        no_handler: &mut u64,
        slot: usize,
        Served {
            buf,
            handle,
            req_type,
        }: Served<P>,
    ) -> Result<(), RpcError> {
        let Ok(mut out) = self.pool.alloc(self.max) else {
            return core.respond(handle, Reply::status(NO_MEMORY).bytes());
        };
        let len = match &mut handlers[usize::from(req_type)] {
            Some(h) => h(buf.as_slice(), out.as_mut_slice()).min(self.max),
            None => {
                *no_handler += 1;
                0
            }
        };
        drop(buf); // read whole and handled
        if len <= self.inline_max {
            return core.respond_with(handle, |_, o| {
                (o[0], o[1]) = (VERSION, OK);
                o[2..2 + len].copy_from_slice(&out.as_slice()[..len]);
                2 + len
            });
        }
        let mut r = Reply::status(REMOTE);
        r.buf[2..10].copy_from_slice(&out.addr().to_be_bytes());
        r.buf[10..14].copy_from_slice(&self.pool.rkey().to_be_bytes());
        r.buf[14..18].copy_from_slice(&(len as u32).to_be_bytes());
        r.len += 16;
        core.respond(handle, r.bytes())?;
        self.ops[slot] = Op::Held {
            _resp: out,
            req_num: handle.req_num(),
        };
        Ok(())
    }
}

/// A request read whole, for its handler.
pub(super) struct Served<P: Provider> {
    pub(super) buf: LocalBuf<P>,
    pub(super) handle: ServerHandle,
    pub(super) req_type: u8,
}
