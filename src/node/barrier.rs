//! Barrier algorithms as sans-IO state machines: events in, messages out.
//!
//! A [`BarrierMachine`] runs one participant of a barrier over any subset of ranks. The
//! caller feeds it [`start`](BarrierMachine::start) and every [`Msg`] received from a
//! peer ([`on_message`](BarrierMachine::on_message)); the machine hands back the messages
//! to send through a callback, `out(to_rank, msg)`, and reports completion with
//! [`is_complete`](BarrierMachine::is_complete). It never allocates: `N` bounds the number
//! of participants.
//!
//! Participants are a strictly increasing list of ranks; the algorithms work on indices
//! into that list (index 0 is the root where there is one). With `P` participants:
//!
//! | [`Algorithm`] | messages | critical path ([`rounds`]) |
//! |---|---|---|
//! | [`Centralized`](Algorithm::Centralized): all ARRIVE at index 0, it RELEASEs all | `2(P-1)` | `2` |
//! | [`Dissemination`](Algorithm::Dissemination): round `k` sends to `i+2^k`, waits for `i-2^k` (mod `P`) | `P·⌈log2 P⌉` | `⌈log2 P⌉` |
//! | [`BinaryTree`](Algorithm::BinaryTree): ARRIVE up the heap-ordered tree (parent `(i-1)/2`), RELEASE down | `2(P-1)` | `2⌊log2 P⌋` |
//!
//! Epochs count from 1: a fresh machine is at epoch 0, which counts as complete, and each
//! `start` begins the next epoch. A participant completes epoch `e` only after every
//! participant has started `e`, exactly once. A fast peer may start `e+1` before this
//! participant has completed `e`; its messages are buffered and used once `e+1` starts.
//! Any other epoch is an error, as is a message the algorithm does not expect here.
//!
//! ```
//! use zverbs::node::barrier::{Algorithm, BarrierMachine};
//! let ranks = [3, 7];
//! let mut a = BarrierMachine::<4>::new(Algorithm::Centralized, 3, &ranks)?;
//! let mut b = BarrierMachine::<4>::new(Algorithm::Centralized, 7, &ranks)?;
//! let mut to_a = None;
//! b.start(&mut |to, m| { assert_eq!(to, 3); to_a = Some(m) })?; // ARRIVE at the root
//! assert!(!b.is_complete());
//! let mut to_b = None;
//! a.start(&mut |_, _| unreachable!())?;
//! a.on_message(7, to_a.unwrap(), &mut |to, m| { assert_eq!(to, 7); to_b = Some(m) })?;
//! assert!(a.is_complete());
//! b.on_message(3, to_b.unwrap(), &mut |_, _| unreachable!())?; // RELEASE
//! assert!(b.is_complete() && b.epoch() == 1);
//! # Ok::<(), zverbs::node::barrier::BarrierError>(())
//! ```

use core::fmt;

use crate::error::ErrorKind;

/// Which barrier algorithm a machine runs. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A counter at index 0: everyone sends ARRIVE to it, it sends RELEASE to everyone.
    Centralized,
    /// `⌈log2 P⌉` rounds; in round `k`, index `i` sends to `i + 2^k` and waits for
    /// `i - 2^k` (mod `P`).
    Dissemination,
    /// ARRIVE up a binary tree over indices (children of `i` are `2i+1`, `2i+2`), RELEASE
    /// down from index 0.
    BinaryTree,
}

/// `⌈log2 p⌉`, 0 for `p <= 1`.
fn ceil_log2(p: usize) -> u32 {
    if p <= 1 {
        0
    } else {
        usize::BITS - (p - 1).leading_zeros()
    }
}

/// The number of sequential message latencies on the critical path of `alg` with `p`
/// participants, when all start at once: centralized 2, dissemination `⌈log2 p⌉`, binary
/// tree `2⌊log2 p⌋` (= `2⌈log2(p+1)⌉ - 2`: up to the root and back down the deepest
/// branch). 0 for `p <= 1`, which completes at `start`.
pub fn rounds(alg: Algorithm, p: usize) -> u32 {
    if p <= 1 {
        return 0;
    }
    match alg {
        Algorithm::Centralized => 2,
        Algorithm::Dissemination => ceil_log2(p),
        Algorithm::BinaryTree => 2 * (usize::BITS - 1 - p.leading_zeros()),
    }
}

/// What a barrier message means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgKind {
    /// Centralized and tree: the sender (and, in the tree, its subtree) has started.
    Arrive,
    /// Centralized and tree: everyone has started; complete.
    Release,
    /// Dissemination: the sender has finished the previous rounds.
    Round,
}

impl MsgKind {
    const fn to_byte(self) -> u8 {
        match self {
            MsgKind::Arrive => 1,
            MsgKind::Release => 2,
            MsgKind::Round => 3,
        }
    }
}

/// One barrier message. On the wire: 8 bytes, `[kind, round, 0, 0, epoch (big endian)]`,
/// with kind 1 = ARRIVE, 2 = RELEASE, 3 = ROUND.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Msg {
    /// The barrier epoch it belongs to.
    pub epoch: u32,
    /// The dissemination round; 0 for the other algorithms.
    pub round: u8,
    /// What it means.
    pub kind: MsgKind,
}

/// Size of an encoded [`Msg`].
pub const MSG_LEN: usize = 8;

impl Msg {
    /// The wire form.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let e = self.epoch.to_be_bytes();
        [
            self.kind.to_byte(),
            self.round,
            0,
            0,
            e[0],
            e[1],
            e[2],
            e[3],
        ]
    }

    /// Parses the wire form. The length, the kind and the reserved bytes are checked;
    /// whether the round makes sense is for the [`BarrierMachine`] to judge.
    pub fn decode(bytes: &[u8]) -> Result<Msg, MsgError> {
        let b: &[u8; MSG_LEN] = bytes
            .try_into()
            .map_err(|_| MsgError::Length { got: bytes.len() })?;
        let kind = match b[0] {
            1 => MsgKind::Arrive,
            2 => MsgKind::Release,
            3 => MsgKind::Round,
            k => return Err(MsgError::Kind(k)),
        };
        if b[2] != 0 || b[3] != 0 {
            return Err(MsgError::Reserved([b[2], b[3]]));
        }
        Ok(Msg {
            epoch: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            round: b[1],
            kind,
        })
    }
}

/// Bytes that are not a barrier message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgError {
    /// Not [`MSG_LEN`] bytes long.
    Length {
        /// Bytes given.
        got: usize,
    },
    /// An unknown kind byte.
    Kind(u8),
    /// The reserved bytes 2..4 are not zero.
    Reserved([u8; 2]),
}

impl fmt::Display for MsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgError::Length { got } => {
                write!(f, "barrier message of {got} bytes, expected {MSG_LEN}")
            }
            MsgError::Kind(k) => write!(f, "unknown barrier message kind {k}"),
            MsgError::Reserved(r) => write!(f, "reserved barrier message bytes {r:?} not zero"),
        }
    }
}

impl core::error::Error for MsgError {}

/// A barrier call that was refused. The machine is unchanged by a refused call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierError {
    /// No participants.
    Empty,
    /// More participants than the machine's capacity `N`.
    TooMany {
        /// Participants given.
        given: usize,
        /// The capacity.
        capacity: usize,
    },
    /// The participants are not in increasing order: `participants[index - 1] >
    /// participants[index]`.
    Unsorted {
        /// Where the order breaks.
        index: usize,
    },
    /// A rank is listed twice.
    DuplicateRank(u16),
    /// This participant's own rank is not in the list.
    NotMember(u16),
    /// `start` was called before the current epoch completed.
    InProgress {
        /// The epoch still running.
        epoch: u32,
    },
    /// A message from a rank that does not take part.
    NotParticipant(u16),
    /// A message for an epoch that is over here (or never ran).
    EpochTooOld {
        /// The message's epoch.
        got: u32,
        /// This participant's epoch.
        current: u32,
    },
    /// A message for an epoch more than one ahead, or one ahead of a running epoch.
    EpochTooNew {
        /// The message's epoch.
        got: u32,
        /// This participant's epoch.
        current: u32,
    },
    /// A message this algorithm never sends from that sender to this participant, or not
    /// at this point (e.g. a RELEASE before this participant arrived).
    Unexpected {
        /// The sender's rank.
        from: u16,
        /// The message.
        msg: Msg,
    },
    /// The same message twice.
    Duplicate {
        /// The sender's rank.
        from: u16,
        /// The message.
        msg: Msg,
    },
}

impl BarrierError {
    /// What the error means in the crate-wide classification.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BarrierError::InProgress { .. } => ErrorKind::InvalidState,
            _ => ErrorKind::InvalidArgument,
        }
    }
}

impl fmt::Display for BarrierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BarrierError::Empty => f.write_str("a barrier needs at least one participant"),
            BarrierError::TooMany { given, capacity } => {
                write!(f, "{given} barrier participants, capacity is {capacity}")
            }
            BarrierError::Unsorted { index } => {
                write!(f, "barrier participants not sorted at index {index}")
            }
            BarrierError::DuplicateRank(r) => write!(f, "rank {r} listed twice in the barrier"),
            BarrierError::NotMember(r) => write!(f, "own rank {r} is not a barrier participant"),
            BarrierError::InProgress { epoch } => {
                write!(f, "barrier epoch {epoch} has not completed yet")
            }
            BarrierError::NotParticipant(r) => {
                write!(f, "barrier message from rank {r}, which does not take part")
            }
            BarrierError::EpochTooOld { got, current } => {
                write!(
                    f,
                    "stale barrier message for epoch {got} (at epoch {current})"
                )
            }
            BarrierError::EpochTooNew { got, current } => {
                write!(
                    f,
                    "barrier message for future epoch {got} (at epoch {current})"
                )
            }
            BarrierError::Unexpected { from, msg } => {
                write!(f, "unexpected barrier message {msg:?} from rank {from}")
            }
            BarrierError::Duplicate { from, msg } => {
                write!(f, "duplicate barrier message {msg:?} from rank {from}")
            }
        }
    }
}

impl core::error::Error for BarrierError {}

/// What one epoch has received.
#[derive(Clone, Copy)]
struct Inbox<const N: usize> {
    /// ARRIVE received, by sender index.
    arrived: [bool; N],
    /// ARRIVEs received.
    arrivals: usize,
    /// Dissemination rounds received, bit `k` for round `k`.
    rounds: u32,
    /// RELEASE received.
    released: bool,
}

impl<const N: usize> Inbox<N> {
    const EMPTY: Self = Inbox {
        arrived: [false; N],
        arrivals: 0,
        rounds: 0,
        released: false,
    };
}

/// One participant of a barrier. See the module docs.
#[derive(Clone)]
pub struct BarrierMachine<const N: usize> {
    alg: Algorithm,
    parts: [u16; N],
    len: usize,
    me: usize,
    epoch: u32,
    running: bool,
    /// Sends done in the running epoch: dissemination rounds sent; centralized and tree:
    /// 1 once ARRIVE went up.
    sent: u32,
    /// The running (or last completed) epoch.
    cur: Inbox<N>,
    /// Early messages for the next epoch.
    next: Inbox<N>,
}

impl<const N: usize> fmt::Debug for BarrierMachine<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarrierMachine")
            .field("alg", &self.alg)
            .field("participants", &self.participants())
            .field("index", &self.me)
            .field("epoch", &self.epoch)
            .field("complete", &!self.running)
            .finish_non_exhaustive()
    }
}

impl<const N: usize> BarrierMachine<N> {
    /// A participant with rank `me` in a barrier over `participants`, which must be
    /// strictly increasing (sorted, distinct), non-empty, at most `N`, and contain `me`.
    pub fn new(alg: Algorithm, me: u16, participants: &[u16]) -> Result<Self, BarrierError> {
        if participants.is_empty() {
            return Err(BarrierError::Empty);
        }
        if participants.len() > N {
            return Err(BarrierError::TooMany {
                given: participants.len(),
                capacity: N,
            });
        }
        for (i, w) in participants.windows(2).enumerate() {
            if w[0] == w[1] {
                return Err(BarrierError::DuplicateRank(w[0]));
            }
            if w[0] > w[1] {
                return Err(BarrierError::Unsorted { index: i + 1 });
            }
        }
        let me = participants
            .binary_search(&me)
            .map_err(|_| BarrierError::NotMember(me))?;
        let mut parts = [0; N];
        parts[..participants.len()].copy_from_slice(participants);
        Ok(BarrierMachine {
            alg,
            parts,
            len: participants.len(),
            me,
            epoch: 0,
            running: false,
            sent: 0,
            cur: Inbox::EMPTY,
            next: Inbox::EMPTY,
        })
    }

    /// The participating ranks, in increasing order.
    pub fn participants(&self) -> &[u16] {
        &self.parts[..self.len]
    }

    /// This participant's index into [`participants`](Self::participants).
    pub fn index(&self) -> usize {
        self.me
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The current epoch: the last one started (0 before the first `start`).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Whether the current epoch is complete (released). True before the first `start`.
    pub fn is_complete(&self) -> bool {
        !self.running
    }

    /// Begins the next epoch, sending through `out(to_rank, msg)`. Refused while the
    /// current epoch is running. With one participant, completes at once.
    pub fn start(&mut self, out: &mut impl FnMut(u16, Msg)) -> Result<(), BarrierError> {
        if self.running {
            return Err(BarrierError::InProgress { epoch: self.epoch });
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.running = true;
        self.sent = 0;
        self.cur = self.next;
        self.next = Inbox::EMPTY;
        self.advance(out);
        Ok(())
    }

    /// Takes in `msg` from rank `from`, sending whatever it enables through `out`.
    pub fn on_message(
        &mut self,
        from: u16,
        msg: Msg,
        out: &mut impl FnMut(u16, Msg),
    ) -> Result<(), BarrierError> {
        let j = self
            .participants()
            .binary_search(&from)
            .map_err(|_| BarrierError::NotParticipant(from))?;
        let (current, got) = (self.epoch, msg.epoch);
        let ahead = got.wrapping_sub(current);
        let is_cur = match ahead {
            0 if self.running => true,
            1 => false,
            0 => return Err(BarrierError::EpochTooOld { got, current }),
            d if d > u32::MAX / 2 => return Err(BarrierError::EpochTooOld { got, current }),
            _ => return Err(BarrierError::EpochTooNew { got, current }),
        };
        let unexpected = Err(BarrierError::Unexpected { from, msg });
        let duplicate = Err(BarrierError::Duplicate { from, msg });
        let (p, i) = (self.len, self.me);
        let inbox = if is_cur { &self.cur } else { &self.next };
        match (self.alg, msg.kind) {
            (Algorithm::Dissemination, MsgKind::Round) => {
                let k = u32::from(msg.round);
                if k >= ceil_log2(p) || j != (i + p - (1 << k)) % p {
                    return unexpected;
                }
                if inbox.rounds & (1 << k) != 0 {
                    return duplicate;
                }
            }
            (Algorithm::Centralized | Algorithm::BinaryTree, MsgKind::Arrive) => {
                if msg.round != 0 || !self.children().contains(&j) {
                    return unexpected;
                }
                if inbox.arrived[j] {
                    return duplicate;
                }
            }
            (Algorithm::Centralized | Algorithm::BinaryTree, MsgKind::Release) => {
                if msg.round != 0 || i == 0 || j != self.parent() {
                    return unexpected;
                }
                if inbox.released {
                    return duplicate;
                }
                // The parent (the root, for centralized) releases only after this
                // participant has sent ARRIVE for the running epoch.
                if !is_cur || self.sent == 0 {
                    return unexpected;
                }
            }
            _ => return unexpected,
        }
        let inbox = if is_cur {
            &mut self.cur
        } else {
            &mut self.next
        };
        match msg.kind {
            MsgKind::Round => inbox.rounds |= 1 << msg.round,
            MsgKind::Arrive => {
                inbox.arrived[j] = true;
                inbox.arrivals += 1;
            }
            MsgKind::Release => inbox.released = true,
        }
        if is_cur {
            self.advance(out);
        }
        Ok(())
    }

    /// The index ARRIVE goes to and RELEASE comes from (not meaningful for index 0).
    fn parent(&self) -> usize {
        match self.alg {
            Algorithm::BinaryTree => self.me.saturating_sub(1) / 2,
            _ => 0,
        }
    }

    /// The indices that ARRIVE at this one and that it RELEASEs (centralized and tree).
    fn children(&self) -> core::ops::Range<usize> {
        let (p, i) = (self.len, self.me);
        match self.alg {
            Algorithm::Centralized if i == 0 => 1..p,
            Algorithm::BinaryTree => (2 * i + 1).min(p)..(2 * i + 3).min(p),
            _ => 0..0,
        }
    }

    /// Sends RELEASE to the children and completes.
    fn release(&mut self, out: &mut impl FnMut(u16, Msg)) {
        let msg = self.msg(MsgKind::Release, 0);
        self.children().for_each(|j| out(self.parts[j], msg));
        self.running = false;
    }

    fn msg(&self, kind: MsgKind, round: u8) -> Msg {
        Msg {
            epoch: self.epoch,
            round,
            kind,
        }
    }

    /// Sends whatever the running epoch's state allows, and completes if it can.
    fn advance(&mut self, out: &mut impl FnMut(u16, Msg)) {
        if !self.running {
            return;
        }
        let (p, i) = (self.len, self.me);
        match self.alg {
            Algorithm::Dissemination => {
                let r = ceil_log2(p);
                // Round k goes out once round k-1 has come in (round 0 at once).
                while self.sent < r
                    && (self.sent == 0 || (self.cur.rounds >> (self.sent - 1)) & 1 != 0)
                {
                    let k = self.sent;
                    out(
                        self.parts[(i + (1 << k)) % p],
                        self.msg(MsgKind::Round, k as u8),
                    );
                    self.sent += 1;
                }
                if r == 0 || (self.sent == r && (self.cur.rounds >> (r - 1)) & 1 != 0) {
                    self.running = false;
                }
            }
            Algorithm::Centralized | Algorithm::BinaryTree => {
                if self.sent == 0 && self.cur.arrivals == self.children().len() {
                    if i == 0 {
                        return self.release(out);
                    }
                    out(self.parts[self.parent()], self.msg(MsgKind::Arrive, 0));
                    self.sent = 1;
                }
                if self.sent == 1 && self.cur.released {
                    self.release(out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
