//! The client half: handshakes, sends under credits, go-back-N on replies, and the
//! retransmission and session timers.

use super::header::{Header, PktType, HEADER_LEN};
use super::protocol::RpcCore;
use super::session::{SlotState, State};
use super::{Event, Refusal, RequestHandle, RpcError, Transmit};

impl RpcCore {
    /// The index of the client session in `state` a reply names, if it is `from`'s.
    fn client_session(&mut self, from: u64, h: &Header, state: State) -> Option<usize> {
        let i = usize::from(h.dest_session);
        let s = &self.sessions[i]; // dest_session < max_sessions: validated
        let remote_ok = state == State::Connecting || s.remote == h.src_session;
        if s.state == state && s.peer == from && remote_ok {
            Some(i)
        } else {
            self.stats.unknown_session += 1;
            None
        }
    }

    pub(super) fn on_connect_resp(&mut self, from: u64, h: &Header) {
        let Some(i) = self.client_session(from, h, State::Connecting) else {
            return;
        };
        // A refusal of our version carries no token: we cannot have sent it any.
        let refusal = Refusal::from_status(h.req_type);
        if h.req_num != self.sessions[i].token && refusal != Some(Refusal::Version) {
            self.stats.stale += 1;
            return;
        }
        let id = self.id(i);
        match refusal {
            None => {
                let s = &mut self.sessions[i];
                s.state = State::Connected;
                s.remote = h.src_session;
                s.credits = self.cfg.credits;
                s.sm_at = None;
                self.sync_session(i);
                self.push_event(Event::Connected(id));
            }
            Some(r) => {
                self.sessions[i].free();
                self.sync_session(i);
                self.push_event(Event::ConnectFailed {
                    session: id,
                    error: RpcError::Refused(r),
                });
            }
        }
    }

    pub(super) fn on_disconnect_resp(&mut self, from: u64, h: &Header) {
        let Some(i) = self.client_session(from, h, State::Disconnecting) else {
            return;
        };
        if h.req_num == self.sessions[i].token {
            self.close_session(i);
        } else {
            self.stats.stale += 1;
        }
    }

    /// The connected session and the slot of a CR or response, if it is the slot's
    /// current request and still outstanding.
    fn reply_slot(&mut self, from: u64, h: &Header) -> Option<(usize, usize)> {
        let i = self.client_session(from, h, State::Connected)?;
        let si = self.slot_of(i, h.req_num);
        let s = &self.slots[si];
        if s.state == SlotState::Sending && s.req_num == h.req_num {
            Some((i, si))
        } else {
            self.stats.stale += 1;
            None
        }
    }

    /// Takes in replies up to reply `rx` (exclusive) of slot `si`: their credits come
    /// back, and the session heard from its server.
    fn ack(&mut self, now: u64, i: usize, si: usize, rx: usize) {
        let slot = &mut self.slots[si];
        let before = slot.in_flight();
        slot.rx = rx;
        slot.tx = slot.tx.max(rx);
        slot.progress_at = now;
        let returned = before - slot.in_flight(); // rx only grows: in flight only shrinks
        let s = &mut self.sessions[i];
        s.credits += returned;
        debug_assert!(s.credits <= self.cfg.credits);
        self.heard(now, i);
        if self.slots[si].in_flight() > 0 {
            self.arm(now.saturating_add(self.cfg.rto_ns));
        }
        self.sync_slot(i, si);
    }

    /// Session `i` heard from its server: its session timer starts again.
    fn heard(&mut self, now: u64, i: usize) {
        self.sessions[i].quiet_since = Some(now);
        self.arm(now.saturating_add(self.cfg.session_timeout_ns));
    }

    pub(super) fn on_credit_return(&mut self, now: u64, from: u64, h: &Header) {
        let Some((i, si)) = self.reply_slot(from, h) else {
            return;
        };
        let s = self.slots[si];
        let n = s.req_pkts;
        let k = usize::from(h.pkt_num);
        if k + 1 == n {
            // The last packet's CR: the handler runs. Alive, but no progress.
            self.heard(now, i);
        } else if k + 1 < n && k >= s.rx {
            // The server has request packets 0..=k: replies 0..=k are in.
            self.ack(now, i, si, k + 1);
        } else {
            self.stats.stale += 1;
        }
    }

    pub(super) fn on_resp(&mut self, now: u64, from: u64, h: &Header, payload: &[u8]) {
        let Some((i, si)) = self.reply_slot(from, h) else {
            return;
        };
        let s = self.slots[si];
        let n = s.req_pkts;
        let j = usize::from(h.pkt_num);
        let size = usize::try_from(h.msg_size).unwrap_or(usize::MAX); // validated
        let ok = h.req_type == s.req_type
            && if j == 0 {
                s.resp_pkts == 0 // the whole request is in: every reply before is implied
            } else {
                // In order, asked for, the same message.
                s.resp_pkts > 0 && n - 1 + j == s.rx && s.rx < s.tx && size == s.resp_len
            };
        if !ok {
            self.stats.stale += 1;
            return;
        }
        let pkts = self.limits.num_pkts(size);
        let complete = j + 1 == pkts;
        if complete && !self.event_room() {
            self.stats.events_dropped += 1; // resent after the timeout
            return;
        }
        let at = j * self.limits.data_per_pkt; // j < pkts: within the message
        let Some(dst) = self.bufs.buf_mut(si, true).get_mut(at..at + payload.len()) else {
            self.stats.malformed += 1;
            return;
        };
        dst.copy_from_slice(payload);
        if j == 0 {
            self.slots[si].resp_len = size;
            self.slots[si].resp_pkts = pkts;
        }
        self.ack(now, i, si, n + j);
        if complete {
            let session = self.id(i);
            let slot = &mut self.slots[si];
            slot.state = SlotState::Done;
            let handle = RequestHandle {
                session,
                req_num: slot.req_num,
            };
            let req_type = slot.req_type;
            self.sync_slot(i, si);
            self.push_event(Event::Response { handle, req_type });
            self.disarm_if_idle(i);
        }
    }

    /// Stops the session timer when nothing is outstanding.
    fn disarm_if_idle(&mut self, i: usize) {
        if !self.session_slots(i).any(|s| s.state == SlotState::Sending) {
            self.sessions[i].quiet_since = None;
        }
    }

    /// The next client send of any session, round robin from `cursor`: of the sessions
    /// that can send, the first at or after `cursor`, else the first.
    pub(super) fn next_client_send(&mut self, now: u64, out: &mut [u8]) -> Option<Transmit> {
        let (n, cursor) = (self.sessions.len(), self.cursor);
        for (from, end) in [(cursor, n), (0, cursor)] {
            let mut from = from;
            while let Some(i) = self.next_ready(from).filter(|&i| i < end) {
                if let Some(t) = self.session_send(i, now, out) {
                    self.cursor = if i + 1 == n { 0 } else { i + 1 };
                    return Some(t);
                }
                from = i + 1;
            }
        }
        None
    }

    fn session_send(&mut self, i: usize, now: u64, out: &mut [u8]) -> Option<Transmit> {
        let s = &self.sessions[i];
        let to = s.peer;
        let src_session = self.id(i).index;
        let mut h = Header {
            pkt_type: PktType::ConnectReq,
            req_type: 0,
            dest_session: 0,
            src_session,
            msg_size: 0,
            pkt_num: 0,
            payload_len: 0,
            req_num: s.token,
        };
        match s.state {
            State::Connecting | State::Disconnecting if s.sm_due => {
                if s.state == State::Connecting {
                    h.msg_size = u32::try_from(self.cfg.mtu).ok()?;
                } else {
                    h.pkt_type = PktType::DisconnectReq;
                    h.dest_session = s.remote;
                }
                let len = h.encode(out).ok()?;
                let s = &mut self.sessions[i];
                let at = now.saturating_add(self.cfg.rto_ns);
                s.sm_due = false;
                s.sm_tries = s.sm_tries.saturating_add(1);
                s.sm_at = Some(at);
                self.arm(at);
                self.sync_session(i);
                return Some(Transmit { to, len });
            }
            State::Connected if s.credits > 0 => {}
            _ => return None,
        }
        h.dest_session = s.remote;
        // The oldest request with something to send.
        let base = i * self.cfg.window;
        let mut si = None::<usize>;
        let mut bits = s.sendable;
        while bits != 0 {
            let sj = base + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if si.map_or(true, |si| self.slots[sj].req_num < self.slots[si].req_num) {
                si = Some(sj);
            }
        }
        let si = si?;
        let slot = self.slots[si];
        let n = slot.req_pkts;
        h.req_num = slot.req_num;
        h.req_type = slot.req_type;
        let mut len = HEADER_LEN;
        if slot.tx < n {
            let k = slot.tx;
            let at = k * self.limits.data_per_pkt;
            let pkt_len = self.limits.pkt_len(slot.req_len, k);
            let bytes = self.bufs.buf(si, false).get(at..at + pkt_len)?;
            out.get_mut(HEADER_LEN..HEADER_LEN + pkt_len)?
                .copy_from_slice(bytes);
            h.pkt_type = PktType::Req;
            h.msg_size = u32::try_from(slot.req_len).ok()?;
            h.pkt_num = u16::try_from(k).ok()?;
            h.payload_len = u16::try_from(pkt_len).ok()?;
            len += pkt_len;
        } else {
            h.pkt_type = PktType::Rfr;
            h.req_type = 0;
            h.pkt_num = u16::try_from(slot.tx - n + 1).ok()?;
        }
        h.encode(out).ok()?;
        let slot = &mut self.slots[si];
        if slot.in_flight() == 0 {
            slot.progress_at = now; // the retransmission timer starts
        }
        slot.tx += 1;
        let rto_at = slot.progress_at.saturating_add(self.cfg.rto_ns);
        let s = &mut self.sessions[i];
        s.credits -= 1;
        let quiet = *s.quiet_since.get_or_insert(now);
        self.arm(rto_at.min(quiet.saturating_add(self.cfg.session_timeout_ns)));
        self.sync_slot(i, si);
        Some(Transmit { to, len })
    }

    /// When session `i`'s next timer is due.
    pub(super) fn session_deadline(&self, i: usize) -> Option<u64> {
        let s = &self.sessions[i];
        match s.state {
            State::Connecting | State::Disconnecting => s.sm_at,
            State::Connected => {
                let rto = self
                    .session_slots(i)
                    .filter(|s| s.state == SlotState::Sending && s.in_flight() > 0)
                    .map(|s| s.progress_at.saturating_add(self.cfg.rto_ns))
                    .min();
                let dead = s
                    .quiet_since
                    .map(|q| q.saturating_add(self.cfg.session_timeout_ns));
                rto.into_iter().chain(dead).min()
            }
            State::Serving => {
                let busy = self
                    .session_slots(i)
                    .any(|s| s.state == SlotState::Handling);
                let idle = self.cfg.idle_timeout_ns;
                s.quiet_since
                    .filter(|_| !busy && idle != u64::MAX)
                    .map(|q| q.saturating_add(idle))
            }
            _ => None,
        }
    }

    /// Fires session `i`'s timers due at `now`.
    pub(super) fn session_timeout(&mut self, i: usize, now: u64) {
        if self.sessions[i].state == State::Serving {
            // Its client has been silent for the idle timeout, no handler running.
            let idle = self.session_deadline(i).is_some_and(|d| d <= now);
            if idle {
                self.close_session(i);
            }
            return;
        }
        let s = &mut self.sessions[i];
        match s.state {
            State::Connecting | State::Disconnecting if s.sm_at.is_some_and(|t| t <= now) => {
                s.sm_at = None;
                if s.sm_tries < self.cfg.handshake_tries {
                    s.sm_due = true;
                    self.sync_session(i);
                } else if s.state == State::Disconnecting {
                    self.close_session(i);
                } else {
                    let session = self.id(i);
                    self.sessions[i].free();
                    self.sync_session(i);
                    self.push_event(Event::ConnectFailed {
                        session,
                        error: RpcError::HandshakeTimedOut,
                    });
                }
            }
            State::Connected => {
                let dead = s
                    .quiet_since
                    .is_some_and(|q| q.saturating_add(self.cfg.session_timeout_ns) <= now);
                if dead {
                    return self.fail_session(i);
                }
                for si in self.session_slot_range(i) {
                    let slot = &mut self.slots[si];
                    let due = slot.progress_at.saturating_add(self.cfg.rto_ns) <= now;
                    if slot.state == SlotState::Sending && slot.in_flight() > 0 && due {
                        // Go back N: resend from the first send not answered.
                        self.sessions[i].credits += slot.in_flight();
                        slot.tx = slot.rx;
                        slot.progress_at = now;
                        self.stats.retransmits += 1;
                        self.sync_slot(i, si);
                    }
                }
            }
            _ => {}
        }
    }

    /// The session timed out: every outstanding request fails, once.
    fn fail_session(&mut self, i: usize) {
        self.stats.session_timeouts += 1;
        let session = self.id(i);
        let s = &mut self.sessions[i];
        s.state = State::Failed;
        s.quiet_since = None;
        s.credits = 0;
        for si in self.session_slot_range(i) {
            if self.slots[si].state == SlotState::Sending {
                let handle = RequestHandle {
                    session,
                    req_num: self.slots[si].req_num,
                };
                self.advance_slot(i, si);
                self.push_event(Event::Failed {
                    handle,
                    error: RpcError::TimedOut,
                });
            }
        }
        self.sync_session(i);
    }
}
