//! The server half: session answers, request reassembly, at-most-once delivery, and the
//! replies (CRs and response packets) that `poll_transmit` sends first.

use super::header::{Header, PktType, HEADER_LEN};
use super::protocol::{Reply, RpcCore};
use super::session::{SlotState, State};
use super::{Event, Refusal, ServerHandle, Transmit};

impl RpcCore {
    /// The index of the serving session a Req or RFR names, if it is `from`'s.
    /// Its client is heard at `now`: the idle timeout starts again.
    fn serving(&mut self, now: u64, from: u64, h: &Header) -> Option<usize> {
        let i = usize::from(h.dest_session);
        match self.sessions.get_mut(i) {
            Some(s) if s.state == State::Serving && s.peer == from && s.remote == h.src_session => {
                // Later than before: the timer floor stays below the deadline.
                s.quiet_since = Some(now);
                Some(i)
            }
            _ => {
                self.stats.unknown_session += 1;
                None
            }
        }
    }

    pub(super) fn on_connect_req(&mut self, now: u64, from: u64, h: &Header) {
        let answer = |src, status| Reply::Session {
            to: from,
            pkt_type: PktType::ConnectResp,
            dest: h.src_session,
            src,
            status,
            token: h.req_num,
        };
        if usize::try_from(h.msg_size).ok() != Some(self.cfg.mtu) {
            self.stats.refused_connects += 1;
            return self.push_reply(answer(0, Refusal::Mtu.to_status()));
        }
        // A resent request gets the session it already has.
        let known = self.sessions.iter().position(|s| {
            s.state == State::Serving
                && s.peer == from
                && s.remote == h.src_session
                && s.token == h.req_num
        });
        let free = || self.sessions.iter().position(|s| s.state == State::Free);
        let Some(i) = known.or_else(free) else {
            self.stats.refused_connects += 1;
            return self.push_reply(answer(0, Refusal::NoFreeSession.to_status()));
        };
        if known.is_none() {
            let id = self.reset_session(i, State::Serving, from);
            let s = &mut self.sessions[i];
            s.remote = h.src_session;
            s.token = h.req_num;
            self.push_event(Event::Accepted { session: id, from });
        }
        self.sessions[i].quiet_since = Some(now);
        self.arm(now.saturating_add(self.cfg.idle_timeout_ns));
        self.push_reply(answer(self.id(i).index, 0));
    }

    pub(super) fn on_disconnect_req(&mut self, from: u64, h: &Header) {
        let i = usize::from(h.dest_session);
        let s = &self.sessions[i]; // dest_session < max_sessions: validated
        if s.state == State::Serving
            && s.peer == from
            && s.remote == h.src_session
            && s.token == h.req_num
        {
            self.close_session(i);
        }
        // Answered even when already closed: the first answer may have been lost.
        self.push_reply(Reply::Session {
            to: from,
            pkt_type: PktType::DisconnectResp,
            dest: h.src_session,
            src: h.dest_session,
            status: 0,
            token: h.req_num,
        });
    }

    /// A connect request in a header version this code does not read: bytes 0..8 keep
    /// their meaning across versions, so it can still be refused.
    pub(super) fn refuse_other_version(&mut self, from: u64, bytes: &[u8]) {
        if let [_, _, t, _, _, _, s0, s1, ..] = *bytes {
            if bytes.len() >= HEADER_LEN && t == PktType::ConnectReq as u8 {
                self.stats.refused_connects += 1;
                self.push_reply(Reply::Session {
                    to: from,
                    pkt_type: PktType::ConnectResp,
                    dest: u16::from_le_bytes([s0, s1]),
                    src: 0,
                    status: Refusal::Version.to_status(),
                    token: 0,
                });
            }
        }
    }

    pub(super) fn on_req(&mut self, now: u64, from: u64, h: &Header, payload: &[u8]) {
        let Some(i) = self.serving(now, from, h) else {
            return;
        };
        let si = self.slot_of(i, h.req_num);
        let session = self.id(i);
        // Validated: msg_size <= max_msg_size, a usize; pkt_num names one of its packets.
        let size = usize::try_from(h.msg_size).unwrap_or(usize::MAX);
        let (k, n) = (usize::from(h.pkt_num), self.limits.num_pkts(size));
        let slot = self.slots[si];
        let new = match slot.state {
            SlotState::Free => true,
            SlotState::Responded => h.req_num > slot.req_num,
            _ => false,
        };
        if new {
            // A new request starts with its first packet; a client moves to the slot's
            // next request only once it has the response to the last.
            if k != 0 {
                self.stats.stale += 1;
                return;
            }
            let s = &mut self.slots[si];
            s.state = SlotState::Receiving;
            s.req_num = h.req_num;
            s.req_type = h.req_type;
            s.req_len = size;
            s.rx = 0;
        } else if h.req_num != slot.req_num
            || h.msg_size != u32::try_from(slot.req_len).unwrap_or(u32::MAX)
            || h.req_type != slot.req_type
        {
            self.stats.stale += 1;
            return;
        }
        let slot = self.slots[si];
        let cr = Reply::Cr {
            session,
            slot: si,
            req_num: h.req_num,
            pkt: h.pkt_num,
        };
        match slot.state {
            SlotState::Receiving if k == slot.rx => {
                let last = k + 1 == n;
                if last && !self.event_room() {
                    self.stats.events_dropped += 1; // the client resends
                    return;
                }
                let at = k * self.limits.data_per_pkt; // k < n: within the message
                let Some(dst) = self.bufs.buf_mut(si, false).get_mut(at..at + payload.len()) else {
                    self.stats.malformed += 1;
                    return;
                };
                dst.copy_from_slice(payload);
                self.slots[si].rx = k + 1;
                if last {
                    self.slots[si].state = SlotState::Handling;
                    let handle = ServerHandle {
                        session,
                        req_num: h.req_num,
                    };
                    self.push_event(Event::Request {
                        handle,
                        req_type: h.req_type,
                    });
                } else {
                    self.push_reply(cr);
                }
            }
            SlotState::Receiving if k > slot.rx => self.stats.stale += 1,
            // A packet received before: its reply was lost, or is slow.
            _ => {
                self.stats.duplicate_requests += 1;
                if k + 1 < n || slot.state == SlotState::Handling {
                    // The last packet's CR says "received, handler running".
                    self.push_reply(cr);
                } else if slot.state == SlotState::Responded {
                    self.push_reply(Reply::Resp {
                        session,
                        slot: si,
                        req_num: h.req_num,
                        pkt: 0,
                    });
                }
            }
        }
    }

    pub(super) fn on_rfr(&mut self, now: u64, from: u64, h: &Header) {
        let Some(i) = self.serving(now, from, h) else {
            return;
        };
        let si = self.slot_of(i, h.req_num);
        let s = &self.slots[si];
        let pkts = self.limits.num_pkts(s.resp_len);
        if s.state == SlotState::Responded
            && s.req_num == h.req_num
            && usize::from(h.pkt_num) < pkts
        {
            let session = self.id(i);
            self.push_reply(Reply::Resp {
                session,
                slot: si,
                req_num: h.req_num,
                pkt: h.pkt_num,
            });
        } else {
            self.stats.stale += 1;
        }
    }

    /// Writes the first queued reply that still applies.
    pub(super) fn next_reply(&mut self, out: &mut [u8]) -> Option<Transmit> {
        while let Some(r) = self.replies.pop_front() {
            if let Some(t) = self.write_reply(r, out) {
                return Some(t);
            }
        }
        None
    }

    fn write_reply(&mut self, r: Reply, out: &mut [u8]) -> Option<Transmit> {
        let (session, si, req_num, pkt, resp) = match r {
            Reply::Session {
                to,
                pkt_type,
                dest,
                src,
                status,
                token,
            } => {
                let h = Header {
                    pkt_type,
                    req_type: status,
                    dest_session: dest,
                    src_session: src,
                    msg_size: 0,
                    pkt_num: 0,
                    payload_len: 0,
                    req_num: token,
                };
                let len = h.encode(out).ok()?;
                return Some(Transmit { to, len });
            }
            Reply::Cr {
                session,
                slot,
                req_num,
                pkt,
            } => (session, slot, req_num, pkt, false),
            Reply::Resp {
                session,
                slot,
                req_num,
                pkt,
            } => (session, slot, req_num, pkt, true),
        };
        let i = usize::from(session.index);
        let s = &self.sessions[i];
        let slot = &self.slots[si];
        if s.gen != session.gen || s.state != State::Serving || slot.req_num != req_num {
            return None;
        }
        let mut h = Header {
            pkt_type: PktType::CreditReturn,
            req_type: 0,
            dest_session: s.remote,
            src_session: session.index,
            msg_size: 0,
            pkt_num: pkt,
            payload_len: 0,
            req_num,
        };
        let mut len = HEADER_LEN;
        if resp {
            if slot.state != SlotState::Responded {
                return None;
            }
            let k = usize::from(pkt);
            let at = k * self.limits.data_per_pkt;
            let n = self.limits.pkt_len(slot.resp_len, k);
            let bytes = self.bufs.buf(si, true).get(at..at + n)?;
            out.get_mut(HEADER_LEN..HEADER_LEN + n)?
                .copy_from_slice(bytes);
            h.pkt_type = PktType::Resp;
            h.req_type = slot.req_type;
            h.msg_size = u32::try_from(slot.resp_len).ok()?;
            h.payload_len = u16::try_from(n).ok()?;
            len += n;
        }
        h.encode(out).ok()?;
        Some(Transmit { to: s.peer, len })
    }
}
