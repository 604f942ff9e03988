//! The bulk path's client side: setting up a session's connection (and again after a
//! failed read), sending large requests, taking their answers.

use std::mem;

use super::*;

impl<P: Provider> Bulk<P> {
    /// Client: `session` is connected (`notify`: the caller is told once its link is up),
    /// or its link failed; starts (again) its reliable connection. True when the connect
    /// request is out.
    #[cold]
    #[inline(never)]
    pub(in crate::rpc) fn connect(
        &mut self,
        core: &mut RpcCore,
        session: SessionId,
        notify: bool,
    ) -> bool {
        let i = usize::from(session.index());
        let qp = match mem::replace(&mut self.links[i], Link::Lost) {
            Link::Idle(qp) | Link::Redial(qp, _) => qp,
            other => {
                self.links[i] = other; // not possible: a session's link is reset when it ends
                return false;
            }
        };
        let qp = match qp.into_init(&access()) {
            Ok(qp) => qp,
            Err(e) => {
                self.links[i] = idle(e.qp);
                return false;
            }
        };
        let mut msg = [0u8; 1 + ENDPOINT_LEN];
        msg[0] = VERSION;
        msg[1..].copy_from_slice(&qp.endpoint().encode());
        match core.enqueue_request(session, CONNECT, &msg) {
            Ok(h) => {
                let kind = if notify { Kind::Connect } else { Kind::Redial };
                self.kinds[core.slot_of(i, h.req_num())] = kind;
                self.links[i] = Link::Connecting(qp);
                true
            }
            // Every slot busy: a redial tries again after the next pass.
            Err(RpcError::WindowFull { .. }) if !notify => {
                self.links[i] = match qp.reset() {
                    Ok(qp) => Link::Redial(qp, session),
                    Err(_) => Link::Lost,
                };
                self.redial = true;
                false
            }
            Err(_) => {
                self.links[i] = idle(qp);
                false
            }
        }
    }

    /// Client: session `i`'s link failed (a read failed, or the server lost its side):
    /// reset, and connected again from the next pass.
    pub(super) fn broken(
        &mut self,
        i: usize,
        session: SessionId,
        core: &mut RpcCore,
        tags: &[u64],
        notice: &mut impl FnMut(Notice<'_, P>),
    ) {
        if !matches!(self.links[i], Link::Up(_)) {
            return; // already being set up again, or gone with its session
        }
        self.reset(i, core, tags, notice);
        if let Link::Idle(qp) = mem::replace(&mut self.links[i], Link::Lost) {
            self.links[i] = Link::Redial(qp, session);
            self.redial = true;
        }
    }

    /// Client: a large request on `session`, reading `msg`; `slot` its core slot.
    pub(in crate::rpc) fn sent(&mut self, slot: usize, msg: MsgBuf<P>) {
        self.kinds[slot] = Kind::Large;
        self.ops[slot] = Op::Sent(msg);
    }

    /// The payload of a large request for the `len` bytes at `addr` under `rkey` (`len`
    /// at most `max_msg_size`, so it fits 32 bits).
    pub(in crate::rpc) fn request_payload(
        &self,
        req_type: u8,
        addr: u64,
        rkey: u32,
        len: usize,
    ) -> [u8; REQUEST_LEN] {
        let mut p = [0u8; REQUEST_LEN];
        (p[0], p[1]) = (VERSION, req_type);
        p[2..10].copy_from_slice(&addr.to_be_bytes());
        p[10..14].copy_from_slice(&rkey.to_be_bytes());
        p[14..18].copy_from_slice(&(len as u32).to_be_bytes());
        p
    }

    /// Client: the response to an internal request in `slot` arrived.
    #[cold]
    #[inline(never)]
    pub(in crate::rpc) fn on_response(
        &mut self,
        core: &mut RpcCore,
        handle: RequestHandle,
        slot: usize,
        tags: &[u64],
        notice: &mut impl FnMut(Notice<'_, P>),
    ) -> Result<(), RpcError> {
        let tag = tags[slot];
        let kind = mem::replace(&mut self.kinds[slot], Kind::Plain);
        let i = usize::from(handle.session().index());
        let bytes = core.response(handle)?;
        if let Kind::Connect | Kind::Redial = kind {
            let ep = match bytes {
                [VERSION, OK, ep @ ..] => Endpoint::decode(ep).ok(),
                _ => None,
            };
            self.links[i] = match (mem::replace(&mut self.links[i], Link::Lost), ep) {
                (Link::Connecting(qp), Some(ep)) => up(qp, &ep),
                (Link::Connecting(qp), None) => idle(qp),
                (other, _) => other,
            };
            core.release(handle)?;
            if kind == Kind::Connect {
                notice(Notice::Session(crate::rpc::Event::Connected(
                    handle.session(),
                )));
            }
            return Ok(());
        }
        let Op::Sent(req) = mem::replace(&mut self.ops[slot], Op::Free) else {
            return core.release(handle); // not possible: a large request's slot holds it
        };
        let failure = match bytes {
            [VERSION, OK, inline @ ..] => {
                notice(Notice::Response {
                    tag,
                    bytes: inline,
                    msg: Some(req),
                });
                return core.release(handle);
            }
            [VERSION, REMOTE, at @ ..] if at.len() == 16 => {
                let (addr, rkey, len) = (be64(&at[..8]), be32(&at[8..12]), be32(&at[12..]));
                match self.read(i, slot, addr, rkey, len as usize) {
                    Ok(resp) => {
                        self.ops[slot] = Op::Reading { req, resp, handle };
                        return Ok(()); // released once read
                    }
                    Err(f) => f,
                }
            }
            [VERSION, NO_LINK] => BulkFailure::NoLink,
            [VERSION, NO_MEMORY] => BulkFailure::NoMemory,
            [VERSION, READ_FAILED, s @ ..] if s.len() == 4 => {
                BulkFailure::Read(WcStatus::from_raw(be32(s)))
            }
            _ => BulkFailure::Rejected,
        };
        // The server's read failed or its side is gone: both queue pairs need a reset.
        if let BulkFailure::NoLink | BulkFailure::Read(_) = failure {
            core.release(handle)?;
            notice(Notice::Failed {
                tag,
                error: RpcError::Bulk(failure),
                msg: Some(req),
            });
            self.broken(i, handle.session(), core, tags, notice);
            return Ok(());
        }
        notice(Notice::Failed {
            tag,
            error: RpcError::Bulk(failure),
            msg: Some(req),
        });
        core.release(handle)
    }

    /// Client: the request in `slot` of session `i` failed; its buffer, if it is a large
    /// one. A failed connect request leaves the link idle.
    #[cold]
    #[inline(never)]
    pub(in crate::rpc) fn on_failed(&mut self, i: usize, slot: usize) -> Option<MsgBuf<P>> {
        match mem::replace(&mut self.kinds[slot], Kind::Plain) {
            Kind::Large => match mem::replace(&mut self.ops[slot], Op::Free) {
                Op::Sent(req) => Some(req),
                other => {
                    self.ops[slot] = other;
                    None
                }
            },
            Kind::Connect | Kind::Redial => {
                if let Link::Connecting(qp) = mem::replace(&mut self.links[i], Link::Lost) {
                    self.links[i] = idle(qp);
                }
                None
            }
            Kind::Plain => None,
        }
    }
}
