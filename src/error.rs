//! Errors: one shared [`ErrorKind`] every backend maps into, and the library's [`Error`].
//!
//! Each provider keeps its own error type (an errno for verbs, a `SimError` for the
//! simulator) and says what it means through [`ProviderError::kind`], so code generic over
//! the provider can branch on meaning (the embedded-hal pattern).

use core::fmt;

use crate::types::{QpState, WcOpcode, WcStatus};

/// What went wrong, independent of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument or attribute is invalid, or the call is illegal in the current state
    /// (`EINVAL`).
    InvalidArgument,
    /// A work queue is full (`ENOMEM` from a post, or a ring with no free slot).
    QueueFull,
    /// A device, port or GID index does not exist (`ENODEV`, `ENOENT`).
    NotFound,
    /// The resource is in use (`EBUSY`).
    Busy,
    /// The device ran out of a resource while creating an object.
    OutOfResources,
    /// The operation is not supported by this device.
    Unsupported,
    /// Permission denied (`EPERM`, `EACCES`).
    PermissionDenied,
    /// A completion queue overflowed.
    CqOverflow,
    /// A work request completed with an error status.
    Completion,
    /// A wait ran out of time.
    Timeout,
    /// The local device is dead (`IBV_EVENT_DEVICE_FATAL`, or verbs failing with `EIO`):
    /// it does no more DMA and completes nothing; its objects can only be destroyed.
    DeviceFatal,
    /// A range lies outside a memory region or remote region.
    OutOfBounds,
    /// A queue pair is in a state that does not allow the operation (e.g. the error state).
    InvalidState,
    /// Any other failure.
    Other,
}

/// A backend's error type: printable, and mapped to an [`ErrorKind`].
pub trait ProviderError: fmt::Debug + fmt::Display {
    /// What the error means.
    fn kind(&self) -> ErrorKind;
}

/// A work request that completed with an error status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletionError {
    /// The verbs status.
    pub status: WcStatus,
    /// The `wr_id` of the failed work request.
    pub wr_id: u64,
    /// What the work request was (as posted).
    pub opcode: WcOpcode,
    /// The local queue pair number.
    pub qp_num: u32,
    /// The peer's queue pair number, when the channel knows it.
    pub peer_qp_num: Option<u32>,
}

impl fmt::Display for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} (wr_id {}) on QP {:#x}",
            self.opcode, self.wr_id, self.qp_num
        )?;
        if let Some(peer) = self.peer_qp_num {
            write!(f, " to peer QP {peer:#x}")?;
        }
        write!(f, " failed: {}", self.status)
    }
}

impl core::error::Error for CompletionError {}

/// A byte range that does not fit inside a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundsError {
    /// Start of the requested range, relative to the region.
    pub offset: u64,
    /// Length of the requested range.
    pub len: u64,
    /// Length of the region.
    pub region_len: u64,
}

impl fmt::Display for BoundsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "range {}..{} is outside a region of {} bytes",
            self.offset,
            self.offset.saturating_add(self.len),
            self.region_len
        )
    }
}

impl core::error::Error for BoundsError {}

/// The library's error, generic over the backend's error `E`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error<E> {
    /// A verb failed; `op` names it (e.g. `"ibv_post_send"`).
    Provider {
        /// The verb that failed.
        op: &'static str,
        /// The backend's error.
        source: E,
    },
    /// A work request completed with an error status.
    Completion(CompletionError),
    /// A ring or queue has no free slot.
    QueueFull {
        /// Its capacity.
        capacity: usize,
    },
    /// More scatter/gather entries than the request type holds.
    TooManySges {
        /// Entries given.
        given: usize,
        /// Entries allowed.
        max: usize,
    },
    /// A byte range lies outside its region.
    OutOfBounds(BoundsError),
    /// An attribute failed validation before reaching the device.
    InvalidAttribute(&'static str),
    /// A configuration asks for more than the device (or its port) offers, as its
    /// attributes report it; nothing was created or changed.
    ExceedsDevice {
        /// The field asked, as the configuration names it (e.g. `"caps.max_send_wr"`).
        field: &'static str,
        /// The value asked.
        value: u64,
        /// The device's limit.
        limit: u64,
    },
    /// The device does not support the operation (e.g. an atomic on a device whose
    /// `atomic_cap` is `NONE`); nothing was posted.
    Unsupported(&'static str),
    /// The queue pair is not in a state that allows the operation.
    InvalidState(QpState),
    /// A wait ran out of time. The queue pair was moved to the error state so that no
    /// work stays in flight on borrowed buffers.
    Timeout,
    /// A [`close`](crate::Channel::close) ran out of time before every send posted was
    /// acknowledged; those sends were ended as a timed-out wait ends its work.
    Undrained {
        /// Sends not acknowledged (nor failed) in time.
        sends: usize,
    },
    /// A completion arrived that matches no outstanding work request.
    UnexpectedCompletion {
        /// Its `wr_id`.
        wr_id: u64,
    },
    /// A peer index with no connected channel: beyond the capacity, or not set up.
    NoSuchPeer {
        /// The index given.
        peer: usize,
        /// The capacity (`N`) of the multi-channel.
        capacity: usize,
    },
    /// A [`Pending`](crate::Pending) handle was given to a channel that did not post it
    /// ([`Channel::wait`](crate::Channel::wait),
    /// [`Channel::try_complete`](crate::Channel::try_complete)). Nothing was polled or
    /// taken: the channel's own work is untouched, and the work the handle names is still
    /// in flight on its own channel. The handle was consumed; use
    /// [`Channel::owns`](crate::Channel::owns) to route handles without losing them. The two
    /// numbers may be equal: queue pairs of different devices can share a number.
    ForeignPending {
        /// The local queue pair number of the channel that posted the work.
        owner_qp_num: u32,
        /// The local queue pair number of the channel the handle was given to.
        qp_num: u32,
    },
}

impl<E: ProviderError> Error<E> {
    /// What the error means, for branching in generic code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Provider { source, .. } => source.kind(),
            Error::Completion(_) => ErrorKind::Completion,
            Error::QueueFull { .. } => ErrorKind::QueueFull,
            Error::TooManySges { .. }
            | Error::InvalidAttribute(_)
            | Error::ExceedsDevice { .. }
            | Error::ForeignPending { .. } => ErrorKind::InvalidArgument,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::OutOfBounds(_) => ErrorKind::OutOfBounds,
            Error::InvalidState(_) => ErrorKind::InvalidState,
            Error::Timeout | Error::Undrained { .. } => ErrorKind::Timeout,
            Error::UnexpectedCompletion { .. } => ErrorKind::Other,
            Error::NoSuchPeer { .. } => ErrorKind::InvalidArgument,
        }
    }

    /// The completion error, if this is one.
    pub fn completion(&self) -> Option<&CompletionError> {
        match self {
            Error::Completion(c) => Some(c),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Provider { op, source } => write!(f, "{op} failed: {source}"),
            Error::Completion(c) => c.fmt(f),
            Error::QueueFull { capacity } => write!(f, "queue full ({capacity} slots in use)"),
            Error::TooManySges { given, max } => {
                write!(f, "{given} scatter/gather entries given, at most {max} fit")
            }
            Error::OutOfBounds(b) => b.fmt(f),
            Error::InvalidAttribute(why) => write!(f, "invalid attribute: {why}"),
            Error::ExceedsDevice {
                field,
                value,
                limit,
            } => write!(f, "{field} = {value} exceeds the device's limit {limit}"),
            Error::Unsupported(what) => write!(f, "not supported by the device: {what}"),
            Error::InvalidState(s) => write!(f, "queue pair is in state {s:?}"),
            Error::Timeout => f.write_str("timed out waiting for completions"),
            Error::Undrained { sends } => {
                write!(f, "{sends} sends not acknowledged when the close timed out")
            }
            Error::UnexpectedCompletion { wr_id } => {
                write!(f, "completion for unknown work request {wr_id:#x}")
            }
            Error::ForeignPending {
                owner_qp_num,
                qp_num,
            } => write!(
                f,
                "pending work posted on the channel of QP {owner_qp_num:#x} was given to \
                 another channel (QP {qp_num:#x}); only its own channel can complete it"
            ),
            Error::NoSuchPeer { peer, capacity } => {
                write!(f, "no channel to peer {peer} (capacity {capacity})")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for Error<E> {}

impl<E> From<BoundsError> for Error<E> {
    fn from(b: BoundsError) -> Self {
        Error::OutOfBounds(b)
    }
}

impl<E> From<CompletionError> for Error<E> {
    fn from(c: CompletionError) -> Self {
        Error::Completion(c)
    }
}

/// `Ok` when `value` is at most the device's `limit`, else [`Error::ExceedsDevice`] naming
/// `field`.
pub(crate) fn within<E>(field: &'static str, value: u64, limit: u64) -> Result<(), Error<E>> {
    if value <= limit {
        Ok(())
    } else {
        Err(Error::ExceedsDevice {
            field,
            value,
            limit,
        })
    }
}

/// Shorthand to wrap a provider error with the verb's name.
pub(crate) fn verb<T, E>(op: &'static str, r: Result<T, E>) -> Result<T, Error<E>> {
    r.map_err(|source| {
        crate::trace::event!(debug, op, "the provider refused a verb");
        Error::Provider { op, source }
    })
}
