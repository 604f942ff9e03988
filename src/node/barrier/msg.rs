//! The barrier message: what a barrier machine sends and receives. Its wire form is the
//! node's ([`crate::node`]'s `wire.rs`): 32 bits of immediate data.

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

/// One barrier message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Msg {
    /// The barrier epoch it belongs to.
    pub epoch: u32,
    /// The dissemination round; 0 for the other algorithms.
    pub round: u8,
    /// What it means.
    pub kind: MsgKind,
}
