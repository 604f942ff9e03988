//! What a multi-peer call reports: each peer's outcome, and the first failure.

use core::fmt;

use crate::error::{Error, ErrorKind, ProviderError};
use crate::ring::Completion;

/// One peer's outcome in a multi-peer call: its last receive completion (`None` for
/// sends only), or its first error.
pub type Outcome<E> = Result<Option<Completion>, Error<E>>;

/// A multi-peer call failed: the first peer (the first refused post, else the lowest peer
/// index whose work failed), its queue pair, and its error. The outcomes of the other
/// peers of the same call, successes included, stay readable with
/// [`MultiChannel::outcome`](super::MultiChannel::outcome). Converts into the [`Error`] it carries, so `?` works in
/// functions returning `Error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerError<E> {
    /// The peer index.
    pub peer: usize,
    /// The local queue pair number of the channel to that peer (`None`: no such peer).
    pub qp_num: Option<u32>,
    /// What went wrong there.
    pub error: Error<E>,
}

impl<E: ProviderError> PeerError<E> {
    /// What the error means.
    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }
}

impl<E: fmt::Display> fmt::Display for PeerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer {}", self.peer)?;
        if let Some(qp) = self.qp_num {
            write!(f, " (QP {qp:#x})")?;
        }
        write!(f, ": {}", self.error)
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for PeerError<E> {}

impl<E> From<PeerError<E>> for Error<E> {
    fn from(e: PeerError<E>) -> Self {
        e.error
    }
}
