//! Barrier algorithms as sans-IO state machines: events in, messages out.
//!
//! A [`BarrierMachine`] runs one participant of a barrier over any subset of ranks. The
//! caller feeds it [`start`](BarrierMachine::start) and every [`Msg`] received from a
//! peer ([`on_message`](BarrierMachine::on_message)); the machine hands back the messages
//! to send through a callback, `out(to_rank, msg)`, and reports completion with
//! [`is_complete`](BarrierMachine::is_complete). It never allocates: `PEERS` bounds the number
//! of participants.
//!
//! Participants are a strictly increasing list of ranks ([`BarrierMachine::new`], at most
//! `PEERS`), or every rank of a world `0..P` ([`BarrierMachine::new_world`], up to
//! [`MAX_WORLD`] ranks whatever `PEERS`: then `PEERS` bounds only the fan-in, the ARRIVEs one participant
//! collects). The algorithms work on indices into the participants (index 0 is the root
//! where there is one); [`neighbours`] names the indices one participant exchanges
//! messages with, so a node can connect to those alone. With `P` participants:
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

mod error;
mod msg;
pub use error::BarrierError;
pub use msg::{Msg, MsgKind};

/// A rank in a world: 32 bits.
pub type Rank = u32;

/// The most ranks a world holds: every 32-bit rank (the barrier's wire carries no rank,
/// only a round below 32, so the dissemination barrier's ⌈log2 N⌉ rounds fit).
pub const MAX_WORLD: usize = u32::MAX as usize;

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

/// The index participant `i` sends ARRIVE to (centralized and tree; not meaningful for 0).
fn parent(alg: Algorithm, i: usize) -> usize {
    match alg {
        Algorithm::BinaryTree => i.saturating_sub(1) / 2,
        _ => 0,
    }
}

/// The indices that ARRIVE at `i` and that `i` RELEASEs, of `p` (centralized and tree).
fn children(alg: Algorithm, i: usize, p: usize) -> core::ops::Range<usize> {
    match alg {
        Algorithm::Centralized if i == 0 => 1..p,
        Algorithm::BinaryTree => (2 * i + 1).min(p)..(2 * i + 3).min(p),
        _ => 0..0,
    }
}

/// The participant indices that index `i` of `p` sends to or receives from in a barrier
/// of `alg`, each once, in increasing order: dissemination `i ± 2^k (mod p)`, the tree's
/// parent and children, the centralized root's everyone (a leaf's the root). Empty for
/// `i >= p` or `p` over [`MAX_WORLD`]. A node that connects to these ranks alone can run
/// whole-world barriers.
///
/// ```
/// use zverbs::node::barrier::{neighbours, Algorithm};
/// let n: Vec<_> = neighbours(Algorithm::Dissemination, 0, 8).collect();
/// assert_eq!(n, [1, 2, 4, 6, 7]); // sends to 1, 2, 4; hears from 7, 6, 4
/// assert_eq!(neighbours(Algorithm::BinaryTree, 1, 8).collect::<Vec<_>>(), [0, 3, 4]);
/// ```
pub fn neighbours(alg: Algorithm, i: usize, p: usize) -> impl Iterator<Item = usize> {
    let valid = i < p && p <= MAX_WORLD;
    let rounds = match alg {
        Algorithm::Dissemination if valid => ceil_log2(p), // at most 32
        _ => 0,
    };
    // Dissemination: 2^k < p for every round k < ⌈log2 p⌉, so `p - 2^k` does not wrap.
    let mut ring = [0usize; 64]; // two partners a round
    let mut n = 0;
    for k in 0..rounds {
        for j in [(i + (1 << k)) % p, (i + p - (1 << k)) % p] {
            if j != i && !ring[..n].contains(&j) {
                ring[n] = j;
                n += 1;
            }
        }
    }
    ring[..n].sort_unstable();
    // Tree and centralized: the parent is below `i`, the children above.
    let up = (valid && alg != Algorithm::Dissemination && i != 0).then(|| parent(alg, i));
    let down = if valid { children(alg, i, p) } else { 0..0 };
    ring.into_iter().take(n).chain(up).chain(down)
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

/// What one epoch has received.
#[derive(Clone, Copy)]
struct Inbox<const PEERS: usize> {
    /// ARRIVE received, by sender index less the first child's.
    arrived: [bool; PEERS],
    /// ARRIVEs received.
    arrivals: usize,
    /// Dissemination rounds received, bit `k` for round `k`.
    rounds: u32,
    /// RELEASE received.
    released: bool,
}

impl<const PEERS: usize> Inbox<PEERS> {
    const EMPTY: Self = Inbox {
        arrived: [false; PEERS],
        arrivals: 0,
        rounds: 0,
        released: false,
    };
}

/// One participant of a barrier. See the module docs.
#[derive(Clone)]
pub struct BarrierMachine<const PEERS: usize> {
    alg: Algorithm,
    /// The participants' ranks, `..len`, if listed; unused for a whole world.
    parts: [Rank; PEERS],
    listed: bool,
    len: usize,
    me: usize,
    epoch: u32,
    running: bool,
    /// Sends done in the running epoch: dissemination rounds sent; centralized and tree:
    /// 1 once ARRIVE went up.
    sent: u32,
    /// The running (or last completed) epoch.
    cur: Inbox<PEERS>,
    /// Early messages for the next epoch.
    next: Inbox<PEERS>,
}

impl<const PEERS: usize> fmt::Debug for BarrierMachine<PEERS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarrierMachine")
            .field("alg", &self.alg)
            .field("participants", &self.participants())
            .field("count", &self.len)
            .field("index", &self.me)
            .field("epoch", &self.epoch)
            .field("complete", &!self.running)
            .finish_non_exhaustive()
    }
}

impl<const PEERS: usize> BarrierMachine<PEERS> {
    /// A participant with rank `me` in a barrier over `participants`, which must be
    /// strictly increasing (sorted, distinct), non-empty, at most `PEERS`, and contain `me`.
    pub fn new(alg: Algorithm, me: Rank, participants: &[Rank]) -> Result<Self, BarrierError> {
        if participants.is_empty() {
            return Err(BarrierError::Empty);
        }
        if participants.len() > PEERS {
            return Err(BarrierError::TooMany {
                given: participants.len(),
                capacity: PEERS,
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
        let mut parts = [0; PEERS];
        parts[..participants.len()].copy_from_slice(participants);
        Ok(BarrierMachine {
            alg,
            parts,
            listed: true,
            len: participants.len(),
            me,
            epoch: 0,
            running: false,
            sent: 0,
            cur: Inbox::EMPTY,
            next: Inbox::EMPTY,
        })
    }

    /// A participant with rank `me` in a barrier over every rank of a world of `world`
    /// (`0..world`, at most [`MAX_WORLD`]), with no list stored: `PEERS` need only hold the ARRIVEs
    /// this participant collects (the centralized root `world - 1`, a tree node 2, none for
    /// dissemination), else [`BarrierError::FanIn`].
    pub fn new_world(alg: Algorithm, me: Rank, world: usize) -> Result<Self, BarrierError> {
        if world == 0 {
            return Err(BarrierError::Empty);
        }
        if world > MAX_WORLD {
            return Err(BarrierError::TooMany {
                given: world,
                capacity: MAX_WORLD,
            });
        }
        if me as usize >= world {
            return Err(BarrierError::NotMember(me));
        }
        let m = BarrierMachine {
            alg,
            parts: [0; PEERS],
            listed: false,
            len: world,
            me: me as usize,
            epoch: 0,
            running: false,
            sent: 0,
            cur: Inbox::EMPTY,
            next: Inbox::EMPTY,
        };
        let children = m.children().len();
        if children > PEERS {
            return Err(BarrierError::FanIn {
                children,
                capacity: PEERS,
            });
        }
        Ok(m)
    }

    /// The participating ranks in increasing order; `None` for a whole-world machine
    /// (ranks `0..`[`count`](Self::count)).
    pub fn participants(&self) -> Option<&[Rank]> {
        self.listed.then(|| &self.parts[..self.len])
    }

    /// The number of participants.
    pub fn count(&self) -> usize {
        self.len
    }

    /// The rank of participant index `j`, if there is one.
    pub fn participant(&self, j: usize) -> Option<Rank> {
        (j < self.len).then(|| self.rank(j))
    }

    /// The rank of participant index `j` (below `len`).
    fn rank(&self, j: usize) -> Rank {
        if self.listed {
            self.parts[j]
        } else {
            j as Rank // j < len <= MAX_WORLD
        }
    }

    /// The participant index of `rank`.
    fn index_of(&self, rank: Rank) -> Option<usize> {
        if self.listed {
            self.parts[..self.len].binary_search(&rank).ok()
        } else {
            let j = rank as usize;
            (j < self.len).then_some(j)
        }
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
    pub fn start(&mut self, out: &mut impl FnMut(Rank, Msg)) -> Result<(), BarrierError> {
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
        from: Rank,
        msg: Msg,
        out: &mut impl FnMut(Rank, Msg),
    ) -> Result<(), BarrierError> {
        let j = self
            .index_of(from)
            .ok_or(BarrierError::NotParticipant(from))?;
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
                let children = self.children();
                if msg.round != 0 || !children.contains(&j) {
                    return unexpected;
                }
                if inbox.arrived[j - children.start] {
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
        let first_child = self.children().start;
        let inbox = if is_cur {
            &mut self.cur
        } else {
            &mut self.next
        };
        match msg.kind {
            MsgKind::Round => inbox.rounds |= 1 << msg.round,
            MsgKind::Arrive => {
                // `j` is a child (checked above), and children fit in `PEERS` (`new`, `new_world`).
                inbox.arrived[j - first_child] = true;
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
        parent(self.alg, self.me)
    }

    /// The indices that ARRIVE at this one and that it RELEASEs (centralized and tree).
    fn children(&self) -> core::ops::Range<usize> {
        children(self.alg, self.me, self.len)
    }

    /// Sends RELEASE to the children and completes.
    fn release(&mut self, out: &mut impl FnMut(Rank, Msg)) {
        let msg = self.msg(MsgKind::Release, 0);
        self.children().for_each(|j| out(self.rank(j), msg));
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
    fn advance(&mut self, out: &mut impl FnMut(Rank, Msg)) {
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
                        self.rank((i + (1 << k)) % p),
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
                    out(self.rank(self.parent()), self.msg(MsgKind::Arrive, 0));
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
