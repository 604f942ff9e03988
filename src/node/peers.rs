//! Which rank each of a node's peer indices connects to.
//!
//! A node's channels are indexed by *peer index*. A full node ([`Node::prepare`]) has one
//! per rank, and the index is the rank. A node with chosen peers
//! ([`Node::prepare_with_peers`]) has one per chosen rank, in increasing rank order, so a
//! node of a 65,536-rank world that runs dissemination barriers holds 31 peers, not
//! 65,535: its per-peer tables are sized by the peers it has, not by the world.
//!
//! [`Node::prepare`]: super::Node::prepare
//! [`Node::prepare_with_peers`]: super::Node::prepare_with_peers

/// The largest world: every 32-bit rank (the barrier wire carries no rank).
pub(super) use super::barrier::MAX_WORLD;

/// Rank ↔ peer index, for one node.
#[derive(Clone, Copy, Debug)]
pub(super) struct PeerMap<const PEERS: usize> {
    /// This node's rank.
    pub(super) rank: usize,
    /// The number of ranks.
    pub(super) world: usize,
    /// Chosen peers: their ranks, strictly increasing, `..len`. Unused for a full node.
    ranks: [u32; PEERS],
    len: usize,
    /// Every other rank is a peer, at the index of its rank.
    full: bool,
}

/// Why a peer list was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeersRefused {
    /// A rank at or past the world, or this node's own.
    Rank(usize),
    /// More peers than `PEERS`.
    TooMany,
}

impl<const PEERS: usize> PeerMap<PEERS> {
    /// Every other rank, index = rank (`world <= PEERS` checked by the caller).
    pub(super) fn full(rank: usize, world: usize) -> Self {
        PeerMap {
            rank,
            world,
            ranks: [0; PEERS],
            len: 0,
            full: true,
        }
    }

    /// The ranks `peers` (any order, repeats ignored), at most `PEERS` of them.
    pub(super) fn chosen(
        rank: usize,
        world: usize,
        peers: impl IntoIterator<Item = usize>,
    ) -> Result<Self, PeersRefused> {
        let mut map = PeerMap {
            rank,
            world,
            ranks: [0; PEERS],
            len: 0,
            full: false,
        };
        for p in peers {
            if p >= world || p == rank {
                return Err(PeersRefused::Rank(p));
            }
            let p = p as u32; // p < world <= MAX_WORLD
            if let Err(at) = map.ranks[..map.len].binary_search(&p) {
                if map.len == PEERS {
                    return Err(PeersRefused::TooMany);
                }
                map.ranks.copy_within(at..map.len, at + 1);
                map.ranks[at] = p;
                map.len += 1;
            }
        }
        Ok(map)
    }

    /// The peer index of `rank`, if this node connects to it.
    pub(super) fn index(&self, rank: usize) -> Option<usize> {
        if self.full {
            return (rank < self.world && rank != self.rank).then_some(rank);
        }
        let r = u32::try_from(rank).ok()?;
        self.ranks[..self.len].binary_search(&r).ok()
    }

    /// The rank at peer index `index` (an index [`indices`](Self::indices) yields).
    pub(super) fn rank_of(&self, index: usize) -> usize {
        if self.full {
            index
        } else {
            self.ranks[index] as usize
        }
    }

    /// Every peer index, in increasing rank order.
    pub(super) fn indices(&self) -> impl Iterator<Item = usize> + Clone + use<PEERS> {
        let (rank, full) = (self.rank, self.full);
        let end = if full { self.world } else { self.len };
        (0..end).filter(move |&i| !full || i != rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_map_is_the_identity_but_for_itself() {
        let m = PeerMap::<8>::full(2, 5);
        assert_eq!(m.indices().collect::<std::vec::Vec<_>>(), [0, 1, 3, 4]);
        assert_eq!((m.index(3), m.index(2), m.index(5)), (Some(3), None, None));
        assert_eq!(m.rank_of(4), 4);
    }

    #[test]
    fn a_chosen_map_sorts_and_deduplicates() {
        let m = PeerMap::<4>::chosen(3, 1000, [900, 7, 900, 0]).unwrap();
        assert_eq!(m.indices().collect::<std::vec::Vec<_>>(), [0, 1, 2]);
        assert_eq!((m.rank_of(0), m.rank_of(1), m.rank_of(2)), (0, 7, 900));
        assert_eq!(
            (m.index(900), m.index(8), m.index(70_000)),
            (Some(2), None, None)
        );
    }

    #[test]
    fn a_chosen_map_refuses_bad_ranks_and_too_many() {
        let chosen = |peers: &[usize]| PeerMap::<2>::chosen(3, 10, peers.iter().copied());
        assert_eq!(chosen(&[3]).unwrap_err(), PeersRefused::Rank(3));
        assert_eq!(chosen(&[10]).unwrap_err(), PeersRefused::Rank(10));
        assert_eq!(chosen(&[1, 2, 4]).unwrap_err(), PeersRefused::TooMany);
        assert!(chosen(&[1, 2, 2, 1]).is_ok());
    }
}
