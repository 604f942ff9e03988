//! Sessions, their request slots, and the message arena.

use std::vec::Vec;

/// What a session entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Unused.
    Free,
    /// Client: connect request sent (or due), no answer yet.
    Connecting,
    /// Client: open.
    Connected,
    /// Client: disconnect request sent (or due).
    Disconnecting,
    /// Client: timed out; only `disconnect` frees it.
    Failed,
    /// Server: open.
    Serving,
}

/// One session: its peer, state, credits and session-management timers.
#[derive(Clone, Debug)]
pub(super) struct Session {
    /// Bumped at each reuse of the entry (wrapping: a handle from 2^32 reuses ago
    /// aliases).
    pub gen: u32,
    pub state: State,
    /// The peer's name (the caller's).
    pub peer: u64,
    /// The peer's session number.
    pub remote: u16,
    /// The client's token: its endpoint id and the client session's generation.
    pub token: u64,
    /// Client: packets that may still be sent before a reply returns a credit.
    pub credits: usize,
    /// Client: a connect or disconnect request is to be sent.
    pub sm_due: bool,
    /// Client: connect or disconnect requests sent so far.
    pub sm_tries: u32,
    /// Client: when the last one sent is to be resent.
    pub sm_at: Option<u64>,
    /// Client: when the session last heard from its server while requests were
    /// outstanding (or first sent one): the session timeout runs from here. Server: when
    /// its client was last heard: the idle timeout runs from here.
    pub quiet_since: Option<u64>,
    /// Client: bit `w` is set iff slot `w` has a send to make ([`Slot::can_send`]).
    /// Kept by [`RpcCore::sync_slot`](super::RpcCore::sync_slot).
    pub sendable: u64,
}

impl Session {
    pub const FREE: Session = Session {
        gen: 0,
        state: State::Free,
        peer: 0,
        remote: 0,
        token: 0,
        credits: 0,
        sm_due: false,
        sm_tries: 0,
        sm_at: None,
        quiet_since: None,
        sendable: 0,
    };

    /// Frees the entry, keeping its generation.
    pub fn free(&mut self) {
        *self = Session {
            gen: self.gen,
            ..Session::FREE
        };
    }

    /// Whether `poll_transmit` has a packet of this session to send now: a due connect
    /// or disconnect request, or a send of some slot while a credit is left.
    pub fn can_send(&self) -> bool {
        match self.state {
            State::Connecting | State::Disconnecting => self.sm_due,
            State::Connected => self.credits > 0 && self.sendable != 0,
            _ => false,
        }
    }
}

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    /// Client: unused. Server: no request seen in this session.
    Free,
    /// Client: the slot's request numbers are used up.
    Spent,
    /// Client: request outstanding.
    Sending,
    /// Client: response complete, not yet released.
    Done,
    /// Server: receiving the request's packets.
    Receiving,
    /// Server: request complete, delivered, not answered yet.
    Handling,
    /// Server: answered; the response is kept for resent requests and RFRs.
    Responded,
}

/// One request slot of a session.
///
/// Client go-back-N: the request's `n` packets and the response's `m` are exchanged as
/// `n + m - 1` sends (request packets, then an RFR for each response packet after the
/// first) and as many replies (a CR for each request packet but the last, then the
/// response packets). Send `i` gets reply `i`. `tx` sends have gone out, `rx` replies
/// have come in; `tx - rx` are in flight, each holding a credit.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub state: SlotState,
    /// Client: the current (or next) request's number. Server: the last one seen.
    pub req_num: u64,
    pub req_type: u8,
    pub req_len: usize,
    /// Client: the request's packets (`Limits::num_pkts(req_len)`).
    pub req_pkts: usize,
    pub resp_len: usize,
    /// Client: response packets, once the first has come (else 0).
    pub resp_pkts: usize,
    /// Client: sends made.
    pub tx: usize,
    /// Client: replies taken in. Server: request packets received.
    pub rx: usize,
    /// Client: when the oldest unacknowledged send went out or the last reply came.
    pub progress_at: u64,
}

impl Slot {
    pub const FREE: Slot = Slot {
        state: SlotState::Free,
        req_num: 0,
        req_type: 0,
        req_len: 0,
        req_pkts: 0,
        resp_len: 0,
        resp_pkts: 0,
        tx: 0,
        rx: 0,
        progress_at: 0,
    };

    /// Sends in flight.
    pub fn in_flight(&self) -> usize {
        self.tx.saturating_sub(self.rx)
    }

    /// Whether a client slot has a send to make now: a request packet, or an RFR once
    /// the response's size is known.
    pub fn can_send(&self) -> bool {
        self.state == SlotState::Sending
            && (self.tx < self.req_pkts
                || (self.resp_pkts > 0 && self.tx < self.req_pkts + self.resp_pkts - 1))
    }
}

/// The message buffers of every slot, in one allocation: slot `i`'s request buffer,
/// then its response buffer, each `msg` bytes. The only way to message bytes, so that a
/// registered region could take its place.
#[derive(Debug)]
pub(super) struct Arena {
    bytes: Vec<u8>,
    msg: usize,
}

impl Arena {
    /// `slots` slots of `msg` bytes each way, `len` bytes in all (the caller checked the
    /// product); `None` if the allocator has no room.
    pub fn new(slots: usize, msg: usize, len: usize) -> Option<Arena> {
        debug_assert_eq!(Some(len), slots.checked_mul(2 * msg));
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).ok()?;
        bytes.resize(len, 0);
        Some(Arena { bytes, msg })
    }

    #[inline]
    fn range(&self, slot: usize, resp: bool) -> core::ops::Range<usize> {
        let start = (slot * 2 + usize::from(resp)) * self.msg;
        start..start + self.msg
    }

    /// Slot `slot`'s request (`resp` false) or response buffer.
    #[inline]
    pub fn buf(&self, slot: usize, resp: bool) -> &[u8] {
        &self.bytes[self.range(slot, resp)]
    }

    /// Slot `slot`'s request buffer, to read, and its response buffer, to write.
    #[inline]
    pub fn req_and_resp(&mut self, slot: usize) -> (&[u8], &mut [u8]) {
        let start = self.range(slot, false).start;
        let (req, resp) = self.bytes[start..start + 2 * self.msg].split_at_mut(self.msg);
        (req, resp)
    }

    /// Slot `slot`'s request or response buffer, to write.
    #[inline]
    pub fn buf_mut(&mut self, slot: usize, resp: bool) -> &mut [u8] {
        let r = self.range(slot, resp);
        &mut self.bytes[r]
    }
}
