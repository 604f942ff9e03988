//! The engine's peers: the address handle of each endpoint it talks to, named to the core
//! by an id that carries its slot's generation, and released once no session names it and
//! no datagram sent through it is still in flight.
//!
//! Invariants: a live peer's `sessions` counts the core sessions whose peer it is (client
//! sessions from [`Peers::attach`] at `create_session`, server sessions from the core's
//! `Accepted`); a peer is dropped only when that count is 0 and every send through its
//! handle has completed (`last_seq < tx_done`: rxe looks the handle up as it transmits);
//! a freed slot's generation moves on, so an id the core still holds for it (a reply
//! queued to a peer that left) names nothing, never the slot's next peer.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::provider::Provider;
use crate::qp::AddressHandle;
use crate::types::Gid;

/// One endpoint the engine talks to.
pub(super) struct Peer<P: Provider> {
    pub(super) gid: Gid,
    pub(super) qpn: u32,
    pub(super) ah: AddressHandle<P>,
    sessions: u32,
    /// The send sequence number of the last datagram through `ah`.
    last_seq: Option<u64>,
}

struct Slot<P: Provider> {
    gen: u32,
    peer: Option<Peer<P>>,
}

/// The table: at most as many peers as it has slots.
pub(super) struct Peers<P: Provider> {
    slots: Vec<Slot<P>>,
    /// The live peers by address: every received datagram looks its sender up here.
    /// Reserved for every slot at set-up, so inserting never allocates.
    index: HashMap<(Gid, u32), u64, BuildHasherDefault<Fold>>,
    /// The peer id of each core session (by session index), while it has one.
    by_session: Vec<Option<u64>>,
    /// A peer may have become free.
    check: bool,
    /// The last peer found: most datagrams come from the peer of the one before.
    last: Option<((Gid, u32), u64)>,
}

fn id(i: usize, gen: u32) -> u64 {
    u64::from(gen) << 32 | i as u64
}

impl<P: Provider> Peers<P> {
    /// Room for `max` peers and `sessions` sessions (allocated here, once).
    pub(super) fn new(max: usize, sessions: usize) -> Self {
        Peers {
            slots: (0..max).map(|_| Slot { gen: 0, peer: None }).collect(),
            index: HashMap::with_capacity_and_hasher(max, BuildHasherDefault::default()),
            by_session: vec![None; sessions],
            check: false,
            last: None,
        }
    }

    /// The id of the live peer at (`gid`, `qpn`).
    pub(super) fn find(&mut self, gid: Gid, qpn: u32) -> Option<u64> {
        match self.last {
            Some((key, id)) if key == (gid, qpn) => Some(id),
            _ => {
                let id = self.index.get(&(gid, qpn)).copied()?;
                self.last = Some(((gid, qpn), id));
                Some(id)
            }
        }
    }

    /// The live peer `id` names.
    pub(super) fn get(&self, id: u64) -> Option<&Peer<P>> {
        let s = self.slots.get((id & u64::from(u32::MAX)) as usize)?;
        s.peer.as_ref().filter(|_| u64::from(s.gen) == id >> 32)
    }

    /// Whether a peer can be added.
    pub(super) fn is_full(&self) -> bool {
        self.slots.iter().all(|s| s.peer.is_some())
    }

    /// Adds a peer (no session names it yet: it is released unless one does); its id.
    pub(super) fn insert(&mut self, gid: Gid, qpn: u32, ah: AddressHandle<P>) -> Option<u64> {
        let i = self.slots.iter().position(|s| s.peer.is_none())?;
        let s = &mut self.slots[i];
        s.peer = Some(Peer {
            gid,
            qpn,
            ah,
            sessions: 0,
            last_seq: None,
        });
        self.check = true;
        let id = id(i, s.gen);
        self.index.insert((gid, qpn), id);
        Some(id)
    }

    /// A datagram with send sequence number `seq` goes through `id`'s handle.
    pub(super) fn used(&mut self, id: u64, seq: u64) {
        let i = (id & u64::from(u32::MAX)) as usize;
        if let Some(p) = self.slots.get_mut(i).and_then(|s| s.peer.as_mut()) {
            p.last_seq = Some(seq);
        }
    }

    /// Core session `session` now belongs to peer `id`.
    pub(super) fn attach(&mut self, session: usize, id: u64) {
        self.detach(session);
        let i = (id & u64::from(u32::MAX)) as usize;
        let live = self
            .slots
            .get_mut(i)
            .filter(|s| u64::from(s.gen) == id >> 32);
        if let (Some(p), Some(entry)) = (
            live.and_then(|s| s.peer.as_mut()),
            self.by_session.get_mut(session),
        ) {
            p.sessions += 1;
            *entry = Some(id);
        }
    }

    /// Core session `session` is gone.
    pub(super) fn detach(&mut self, session: usize) {
        let Some(id) = self.by_session.get_mut(session).and_then(Option::take) else {
            return;
        };
        let i = (id & u64::from(u32::MAX)) as usize;
        if let Some(p) = self.slots.get_mut(i).and_then(|s| s.peer.as_mut()) {
            p.sessions = p.sessions.saturating_sub(1);
            self.check = true;
        }
    }

    /// Drops the peers no session names once their last datagram has completed (sends
    /// with sequence numbers below `tx_done` have).
    pub(super) fn release(&mut self, tx_done: u64) {
        if !self.check {
            return;
        }
        self.check = false;
        for s in &mut self.slots {
            let Some(p) = &s.peer else { continue };
            if p.sessions > 0 {
                continue;
            }
            if p.last_seq.is_some_and(|seq| seq >= tx_done) {
                self.check = true; // still in flight: look again later
                continue;
            }
            self.index.remove(&(p.gid, p.qpn));
            self.last = None;
            s.peer = None;
            s.gen = s.gen.wrapping_add(1);
        }
    }

    /// Whether a peer no session names waits for its last datagram to complete.
    #[inline]
    pub(super) fn pending(&self) -> bool {
        self.check
    }

    /// Live peers.
    pub(super) fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.peer.is_some()).count()
    }
}

/// A multiply-rotate hash of the 20-byte address (FxHash's step): SipHash per lookup is a
/// noticeable part of a simulated RPC. Only admitted peers are in the table (at most
/// `max_sessions`), so crafted collisions cost at most a scan of that many entries.
#[derive(Default)]
struct Fold(u64);

impl Hasher for Fold {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
