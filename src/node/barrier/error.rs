//! Why a barrier call was refused: [`BarrierError`], each variant naming what was wrong.

use core::fmt;

use super::{Msg, Rank};
use crate::error::ErrorKind;

/// A barrier call that was refused. The machine is unchanged by a refused call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierError {
    /// No participants.
    Empty,
    /// More participants than the machine's capacity `PEERS`.
    TooMany {
        /// Participants given.
        given: usize,
        /// The capacity.
        capacity: usize,
    },
    /// A whole-world machine whose participant collects more ARRIVEs than its capacity
    /// `PEERS` (the centralized root collects `P - 1`, a tree node at most 2).
    FanIn {
        /// ARRIVEs this participant would collect.
        children: usize,
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
    DuplicateRank(Rank),
    /// This participant's own rank is not in the list.
    NotMember(Rank),
    /// `start` was called before the current epoch completed.
    InProgress {
        /// The epoch still running.
        epoch: u32,
    },
    /// A message from a rank that does not take part.
    NotParticipant(Rank),
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
        from: Rank,
        /// The message.
        msg: Msg,
    },
    /// The same message twice.
    Duplicate {
        /// The sender's rank.
        from: Rank,
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
            BarrierError::FanIn { children, capacity } => {
                write!(
                    f,
                    "a barrier participant collecting {children} arrivals, capacity is {capacity}"
                )
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
