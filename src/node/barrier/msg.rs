//! The barrier message and its 8-byte wire form.

use core::fmt;

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
    /// whether the round makes sense is for the [`BarrierMachine`](super::BarrierMachine) to judge.
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
