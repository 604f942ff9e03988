//! [`RpcCore`]: the protocol core's tables, queues, and the calls its user makes.
//!
//! Map: this file holds the state and the user's calls (sessions, requests, responses,
//! events, the dispatch of packets, transmits and timers); `client.rs` the client's
//! packet handling, sends and timers; `server.rs` the server's packet handling and
//! replies.

use std::collections::VecDeque;
use std::vec::Vec;

use super::header::{Header, HeaderError, Limits, PktType, HEADER_LEN};
use super::session::{Arena, Session, Slot, SlotState, State};
use super::{Config, Event, RequestHandle, RpcError, ServerHandle, SessionId, Stats, Transmit};

/// A server packet waiting to be sent. Slot replies name their request, so that one
/// whose slot has moved on is skipped.
#[derive(Clone, Copy, Debug)]
pub(super) enum Reply {
    /// Credit return for request packet `pkt`.
    Cr {
        session: SessionId,
        slot: usize,
        req_num: u64,
        pkt: u16,
    },
    /// Response packet `pkt`.
    Resp {
        session: SessionId,
        slot: usize,
        req_num: u64,
        pkt: u16,
    },
    /// A connect or disconnect response.
    Session {
        to: u64,
        pkt_type: PktType,
        /// The client's session number.
        dest: u16,
        /// Ours.
        src: u16,
        status: u8,
        token: u64,
    },
}

/// One RPC endpoint: client and server of up to [`Config::max_sessions`] sessions. See
/// the [module docs](super).
//
// So that sending and the timers need not scan every slot of every session, three
// facts are kept at every change (and checked after each call in debug builds):
//
// - bit `w` of a session's `sendable` is set iff its slot `w` can send (`Slot::can_send`):
//   `sync_slot` after any change to a client slot;
// - bit `i` of `ready` is set iff session `i` can send (`Session::can_send`), and
//   `ready_count` bits are set: `sync_session` after any change to
//   a session's state, `sm_due`, credits or `sendable`;
// - `timer_floor` is `Some` whenever a timer runs (serving sessions' idle timeouts
//   included), and no running timer is due before it: `arm` with every deadline set
//   earlier than before; `handle_timeout` makes it exact.
#[derive(Debug)]
pub struct RpcCore {
    pub(super) cfg: Config,
    pub(super) limits: Limits,
    /// `cfg.window` as a `u64`, for request-number arithmetic.
    pub(super) window: u64,
    pub(super) sessions: Vec<Session>,
    /// `window` slots per session, session by session.
    pub(super) slots: Vec<Slot>,
    pub(super) bufs: Arena,
    /// Server replies (and session answers) waiting for `poll_transmit`; never grown.
    pub(super) replies: VecDeque<Reply>,
    /// Never grown.
    pub(super) events: VecDeque<Event>,
    /// The client session `poll_transmit` looks at first (round robin).
    pub(super) cursor: usize,
    /// One bit per session: whether it can send (see above).
    ready: Vec<u64>,
    /// Bits set in `ready`.
    ready_count: usize,
    /// No timer is due before this; `None` when none runs (see above).
    timer_floor: Option<u64>,
    pub(super) stats: Stats,
}

impl RpcCore {
    /// An endpoint with every table and buffer `cfg` calls for, allocated now.
    pub fn new(cfg: Config) -> Result<RpcCore, RpcError> {
        let arena = cfg.validate()?;
        let n = cfg.max_sessions;
        let slots = n * cfg.window; // checked by `validate`
        let bufs = Arena::new(slots, cfg.max_msg_size, arena).ok_or(RpcError::InvalidConfig(
            "the message buffers do not fit in memory",
        ))?;
        Ok(RpcCore {
            limits: cfg.limits(),
            window: u64::try_from(cfg.window).unwrap_or(u64::MAX),
            sessions: vec![Session::FREE; n],
            slots: vec![Slot::FREE; slots],
            bufs,
            replies: VecDeque::with_capacity(n.saturating_mul(cfg.credits.saturating_add(1))),
            events: VecDeque::with_capacity(slots.saturating_add(n.saturating_mul(4))),
            cursor: 0,
            ready: vec![0; n.div_ceil(64)],
            ready_count: 0,
            timer_floor: None,
            stats: Stats::default(),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Opens a client session to `peer`; [`Event::Connected`] or
    /// [`Event::ConnectFailed`] follows.
    pub fn connect(&mut self, peer: u64) -> Result<SessionId, RpcError> {
        let i = self
            .sessions
            .iter()
            .position(|s| s.state == State::Free)
            .ok_or(RpcError::NoFreeSession)?;
        let id = self.reset_session(i, State::Connecting, peer);
        let s = &mut self.sessions[i];
        s.token = u64::from(self.cfg.endpoint_id) << 32 | u64::from(s.gen);
        s.sm_due = true;
        self.sync_session(i);
        self.debug_check();
        Ok(id)
    }

    /// Closes a session. A connected client session sends a disconnect request
    /// ([`Event::Disconnected`] follows, also if it goes unanswered) and is refused while
    /// any slot is in use; a connecting, failed or server session is freed at once
    /// (unreleased responses of a failed one with it), with [`Event::Disconnected`].
    pub fn disconnect(&mut self, session: SessionId) -> Result<(), RpcError> {
        let i = self.session_index(session)?;
        match self.sessions[i].state {
            State::Connected => {
                let outstanding = self
                    .session_slots(i)
                    .filter(|s| matches!(s.state, SlotState::Sending | SlotState::Done))
                    .count();
                if outstanding > 0 {
                    return Err(RpcError::Busy { outstanding });
                }
                let s = &mut self.sessions[i];
                s.state = State::Disconnecting;
                s.sm_due = true;
                s.sm_tries = 0;
                s.sm_at = None;
                self.sync_session(i);
            }
            State::Disconnecting => {}
            _ => self.close_session(i),
        }
        self.debug_check();
        Ok(())
    }

    /// Whether `session` is a connected client session.
    pub fn is_connected(&self, session: SessionId) -> bool {
        self.session_index(session)
            .is_ok_and(|i| self.sessions[i].state == State::Connected)
    }

    /// Packets a client session has in flight (credits in use), if it exists.
    pub fn in_flight(&self, session: SessionId) -> Option<usize> {
        let i = self.session_index(session).ok()?;
        Some(self.session_slots(i).map(Slot::in_flight).sum())
    }

    /// Sends `msg` as a request of type `req_type` on a connected client session,
    /// copying it in. [`Event::Response`] or [`Event::Failed`] follows, once.
    pub fn enqueue_request(
        &mut self,
        session: SessionId,
        req_type: u8,
        msg: &[u8],
    ) -> Result<RequestHandle, RpcError> {
        let i = self.session_index(session)?;
        match self.sessions[i].state {
            State::Connected => {}
            State::Failed => return Err(RpcError::SessionFailed),
            State::Serving => return Err(RpcError::UnknownSession),
            _ => return Err(RpcError::NotConnected),
        }
        let max = self.cfg.max_msg_size;
        if msg.len() > max {
            return Err(RpcError::TooLarge {
                len: msg.len(),
                max,
            });
        }
        let si = self
            .session_slot_range(i)
            .filter(|&si| self.slots[si].state == SlotState::Free)
            .min_by_key(|&si| self.slots[si].req_num)
            .ok_or(RpcError::WindowFull {
                window: self.cfg.window,
            })?;
        self.bufs.buf_mut(si, false)[..msg.len()].copy_from_slice(msg);
        let slot = &mut self.slots[si];
        *slot = Slot {
            state: SlotState::Sending,
            req_num: slot.req_num,
            req_type,
            req_len: msg.len(),
            req_pkts: self.limits.num_pkts(msg.len()),
            ..Slot::FREE
        };
        let req_num = slot.req_num;
        self.sync_slot(i, si);
        self.debug_check();
        Ok(RequestHandle { session, req_num })
    }

    /// The bytes of a complete response, until it is [released](Self::release).
    #[inline]
    pub fn response(&self, handle: RequestHandle) -> Result<&[u8], RpcError> {
        let si = self.client_slot(handle, SlotState::Done)?;
        Ok(&self.bufs.buf(si, true)[..self.slots[si].resp_len])
    }

    /// Frees the slot of a complete response for the next request.
    pub fn release(&mut self, handle: RequestHandle) -> Result<(), RpcError> {
        let si = self.client_slot(handle, SlotState::Done)?;
        self.advance_slot(usize::from(handle.session.index), si);
        self.debug_check();
        Ok(())
    }

    /// The bytes of a request delivered by [`Event::Request`], until it is answered.
    #[inline]
    pub fn request(&self, handle: ServerHandle) -> Result<&[u8], RpcError> {
        let si = self.server_slot(handle)?;
        Ok(&self.bufs.buf(si, false)[..self.slots[si].req_len])
    }

    /// Answers a request with `msg`, copying it in. The response is kept until the
    /// client's next request on the slot, to answer resent packets without the handler.
    pub fn respond(&mut self, handle: ServerHandle, msg: &[u8]) -> Result<(), RpcError> {
        let si = self.server_slot(handle)?;
        let max = self.cfg.max_msg_size;
        if msg.len() > max {
            return Err(RpcError::TooLarge {
                len: msg.len(),
                max,
            });
        }
        self.bufs.buf_mut(si, true)[..msg.len()].copy_from_slice(msg);
        self.answered(handle, si, msg.len());
        Ok(())
    }

    /// [`respond`](Self::respond) without the copy: `write` gets the request and the
    /// response buffer ([`Config::max_msg_size`] bytes), writes the response at its start
    /// and returns its length (capped at the buffer's).
    pub fn respond_with(
        &mut self,
        handle: ServerHandle,
        write: impl FnOnce(&[u8], &mut [u8]) -> usize,
    ) -> Result<(), RpcError> {
        let si = self.server_slot(handle)?;
        let (req, out) = self.bufs.req_and_resp(si);
        let len = write(&req[..self.slots[si].req_len], out).min(out.len());
        self.answered(handle, si, len);
        Ok(())
    }

    /// Server slot `si` holds its response of `len` bytes: it goes out next.
    fn answered(&mut self, handle: ServerHandle, si: usize, len: usize) {
        let slot = &mut self.slots[si];
        slot.resp_len = len;
        slot.state = SlotState::Responded;
        // With no handler running, the session's idle timeout may run again.
        let i = usize::from(handle.session.index);
        if let Some(d) = self.session_deadline(i) {
            self.arm(d);
        }
        self.push_reply(Reply::Resp {
            session: handle.session,
            slot: si,
            req_num: handle.req_num,
            pkt: 0,
        });
    }

    /// The next event, oldest first.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Takes in one datagram from `from`. Never fails: what is not acceptable is counted
    /// in [`Stats`] and dropped.
    pub fn handle_packet(&mut self, now: u64, from: u64, bytes: &[u8]) {
        self.stats.rx_packets += 1;
        let h = match Header::decode(bytes).and_then(|h| h.validate(&self.limits).map(|()| h)) {
            Ok(h) => h,
            Err(e) => {
                self.stats.malformed += 1;
                if let HeaderError::Version(_) = e {
                    self.refuse_other_version(from, bytes);
                }
                return;
            }
        };
        let payload = bytes.get(HEADER_LEN..).unwrap_or_default();
        match h.pkt_type {
            PktType::ConnectReq => self.on_connect_req(now, from, &h),
            PktType::DisconnectReq => self.on_disconnect_req(from, &h),
            PktType::Req => self.on_req(now, from, &h, payload),
            PktType::Rfr => self.on_rfr(now, from, &h),
            PktType::ConnectResp => self.on_connect_resp(from, &h),
            PktType::DisconnectResp => self.on_disconnect_resp(from, &h),
            PktType::Resp => self.on_resp(now, from, &h, payload),
            PktType::CreditReturn => self.on_credit_return(now, from, &h),
        }
        self.debug_check();
    }

    /// Writes the next datagram to send into `out`, which must hold [`Config::mtu`]
    /// bytes (else nothing is written). Server replies go first, then the client
    /// sessions' sends, one session after another.
    #[inline]
    pub fn poll_transmit(&mut self, now: u64, out: &mut [u8]) -> Option<Transmit> {
        if self.replies.is_empty() && self.ready_count == 0 {
            return None;
        }
        self.next_transmit(now, out)
    }

    fn next_transmit(&mut self, now: u64, out: &mut [u8]) -> Option<Transmit> {
        let out = out.get_mut(..self.cfg.mtu)?;
        let t = self
            .next_reply(out)
            .or_else(|| self.next_client_send(now, out));
        self.debug_check();
        self.stats.tx_packets += u64::from(t.is_some());
        t
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due, if a timer runs.
    pub fn next_timeout(&self) -> Option<u64> {
        self.timer_floor?;
        self.exact_timeout()
    }

    /// Fires every timer due at `now`: resends, handshake give-ups, session timeouts.
    /// Costs a comparison when none is due.
    #[inline]
    pub fn handle_timeout(&mut self, now: u64) {
        if self.timer_floor.is_some_and(|t| t <= now) {
            self.fire_timers(now);
        }
    }

    fn fire_timers(&mut self, now: u64) {
        for i in 0..self.sessions.len() {
            self.session_timeout(i, now);
        }
        self.timer_floor = self.exact_timeout();
        self.debug_check();
    }

    fn exact_timeout(&self) -> Option<u64> {
        (0..self.sessions.len())
            .filter_map(|i| self.session_deadline(i))
            .min()
    }

    // --- helpers shared by the client and server halves ---

    /// Sets entry `i` up afresh in `state`, for `peer`, with fresh slots.
    pub(super) fn reset_session(&mut self, i: usize, state: State, peer: u64) -> SessionId {
        let s = &mut self.sessions[i];
        s.free();
        s.gen = s.gen.wrapping_add(1);
        s.state = state;
        s.peer = peer;
        let gen = s.gen;
        for (w, si) in self.session_slot_range(i).enumerate() {
            // A client's slot `w` starts at request number `w`; a server's is unset.
            self.slots[si] = Slot {
                req_num: w as u64, // w < window <= 64
                ..Slot::FREE
            };
        }
        self.sync_session(i); // `free` cleared `sendable`, and every slot is free
        SessionId {
            index: u16::try_from(i).unwrap_or(u16::MAX), // i < max_sessions <= 65536
            gen,
        }
    }

    /// Frees entry `i` and reports it.
    pub(super) fn close_session(&mut self, i: usize) {
        let id = self.id(i);
        self.sessions[i].free();
        for si in self.session_slot_range(i) {
            self.slots[si] = Slot::FREE;
        }
        self.sync_session(i);
        self.push_event(Event::Disconnected(id));
    }

    pub(super) fn id(&self, i: usize) -> SessionId {
        SessionId {
            index: u16::try_from(i).unwrap_or(u16::MAX),
            gen: self.sessions[i].gen,
        }
    }

    /// Moves client slot `si` of session `i` to its next request number, free (or spent
    /// if none is left).
    pub(super) fn advance_slot(&mut self, i: usize, si: usize) {
        let slot = &mut self.slots[si];
        *slot = match slot.req_num.checked_add(self.window) {
            Some(req_num) => Slot {
                req_num,
                ..Slot::FREE
            },
            None => Slot {
                state: SlotState::Spent,
                ..*slot
            },
        };
        self.sync_slot(i, si);
    }

    /// Sets slot `si`'s bit in session `i`'s `sendable` to whether it can send, then the
    /// session's bit in `ready`.
    pub(super) fn sync_slot(&mut self, i: usize, si: usize) {
        debug_assert!(self.session_slot_range(i).contains(&si));
        let bit = 1u64 << (si - i * self.cfg.window);
        let s = &mut self.sessions[i];
        if self.slots[si].can_send() {
            s.sendable |= bit;
        } else {
            s.sendable &= !bit;
        }
        self.sync_session(i);
    }

    /// Sets session `i`'s bit in `ready` to whether it can send, and `ready_count`.
    pub(super) fn sync_session(&mut self, i: usize) {
        let can = self.sessions[i].can_send();
        let (word, bit) = (&mut self.ready[i / 64], 1u64 << (i % 64));
        if can != (*word & bit != 0) {
            *word ^= bit;
            if can {
                self.ready_count += 1;
            } else {
                self.ready_count -= 1;
            }
        }
    }

    /// The first session at or after `from` that can send.
    pub(super) fn next_ready(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = *self.ready.get(word)? & (!0u64 << (from % 64));
        while bits == 0 {
            word += 1;
            bits = *self.ready.get(word)?;
        }
        Some(word * 64 + bits.trailing_zeros() as usize)
    }

    /// Notes a timer set to run out at `deadline`.
    pub(super) fn arm(&mut self, deadline: u64) {
        self.timer_floor = Some(self.timer_floor.map_or(deadline, |t| t.min(deadline)));
    }

    /// Checks the bookkeeping of the struct docs against the tables (debug builds, tables
    /// of up to 4096 slots).
    fn debug_check(&self) {
        if !cfg!(debug_assertions) || self.slots.len() > 4096 {
            return;
        }
        for (i, s) in self.sessions.iter().enumerate() {
            let mut mask = 0;
            for (w, slot) in self.session_slots(i).enumerate() {
                mask |= u64::from(slot.can_send()) << w;
            }
            assert_eq!(s.sendable, mask, "session {i}: sendable");
            let bit = self.ready[i / 64] >> (i % 64) & 1 != 0;
            assert_eq!(bit, s.can_send(), "session {i}: ready");
            if let Some(d) = self.session_deadline(i) {
                assert!(
                    self.timer_floor.is_some_and(|t| t <= d),
                    "session {i}: timer at {d}, floor {:?}",
                    self.timer_floor
                );
            }
        }
        let count: u32 = self.ready.iter().map(|w| w.count_ones()).sum();
        assert_eq!(count as usize, self.ready_count);
    }

    pub(super) fn session_slot_range(&self, i: usize) -> core::ops::Range<usize> {
        let w = self.cfg.window;
        i * w..(i + 1) * w
    }

    pub(super) fn session_slots(&self, i: usize) -> impl Iterator<Item = &Slot> {
        self.slots[self.session_slot_range(i)].iter()
    }

    /// The global slot index of request `req_num` in session `i`.
    #[inline]
    pub(super) fn slot_of(&self, i: usize, req_num: u64) -> usize {
        // A mask for the usual power-of-two window rather than a division.
        let w = if self.window.is_power_of_two() {
            req_num & (self.window - 1)
        } else {
            req_num % self.window
        };
        i * self.cfg.window + w as usize // w < window <= 64
    }

    fn session_index(&self, id: SessionId) -> Result<usize, RpcError> {
        let i = usize::from(id.index);
        match self.sessions.get(i) {
            Some(s) if s.gen == id.gen && s.state != State::Free => Ok(i),
            _ => Err(RpcError::UnknownSession),
        }
    }

    fn client_slot(&self, h: RequestHandle, want: SlotState) -> Result<usize, RpcError> {
        let i = self.session_index(h.session)?;
        let si = self.slot_of(i, h.req_num);
        let s = &self.slots[si];
        let client = self.sessions[i].state != State::Serving;
        (client && s.state == want && s.req_num == h.req_num)
            .then_some(si)
            .ok_or(RpcError::StaleHandle)
    }

    fn server_slot(&self, h: ServerHandle) -> Result<usize, RpcError> {
        let i = self.session_index(h.session)?;
        let si = self.slot_of(i, h.req_num);
        let s = &self.slots[si];
        let serving = self.sessions[i].state == State::Serving;
        (serving && s.state == SlotState::Handling && s.req_num == h.req_num)
            .then_some(si)
            .ok_or(RpcError::StaleHandle)
    }

    /// Whether an event can be queued without growing the queue.
    pub(super) fn event_room(&self) -> bool {
        self.events.len() < self.events.capacity()
    }

    pub(super) fn push_event(&mut self, ev: Event) {
        if self.event_room() {
            self.events.push_back(ev);
        } else {
            self.stats.events_dropped += 1;
        }
    }

    pub(super) fn push_reply(&mut self, r: Reply) {
        if self.replies.len() < self.replies.capacity() {
            self.replies.push_back(r);
        } else {
            self.stats.replies_dropped += 1;
        }
    }
}
