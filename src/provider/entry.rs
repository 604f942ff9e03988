//! Work requests where they are built and posted from: the traits a ring's entries
//! implement, and the provider-neutral layout ([`SendWr`]) a backend may use as its own.
//!
//! A channel builds each send in an entry of its ring and posts the entries from there
//! ([`Provider::post_send_entries`](super::Provider::post_send_entries)). The entry type is
//! the provider's ([`Provider::SendEntry`](super::Provider::SendEntry)): for verbs an
//! `ibv_send_wr` with its gather list beside it, so building writes the library's fields
//! and posting links the entries and makes one call, with no translation between; for the
//! simulator our [`SendWr`], which it reads as it is.

use crate::types::{RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WorkCompletion};

/// A work request a ring can stage: it carries a `wr_id`.
pub trait WorkRequest: Copy {
    /// An empty request, what a ring's entries hold before their first build.
    const BLANK: Self;
    /// Sets the identifier returned in the completion.
    fn set_wr_id(&mut self, id: u64);
    /// The identifier returned in the completion.
    fn wr_id(&self) -> u64;
    /// The completion opcode the request produces (reported for failed requests, whose
    /// completion opcode the device leaves undefined).
    fn opcode(&self) -> WcOpcode;
    /// Asks for a completion on success (`on`), or not.
    fn set_signaled(&mut self, on: bool);
}

/// A send work request in a provider's own layout, with room for `SGES` gather entries,
/// built field by field where it lies. A builder sets every field a provider reads: the
/// operation ([`set_op`](Self::set_op)), the gather entries up to the count it sets
/// ([`sges_mut`](Self::sges_mut), [`set_num_sge`](Self::set_num_sge)) and the `wr_id`.
pub trait SendEntry<const SGES: usize>: WorkRequest + Send + Sync {
    /// The gather list, to fill; the first `num_sge` entries are posted.
    fn sges_mut(&mut self) -> &mut [Sge; SGES];
    /// Sets how many gather entries are posted: at most `SGES` (a larger count is refused
    /// when posted).
    fn set_num_sge(&mut self, n: u8);
    /// Sets the operation and its flags.
    fn set_op(&mut self, op: SendOp, flags: SendFlags);
}

impl<const SGES: usize> WorkRequest for SendWr<SGES> {
    const BLANK: Self = SendWr::new(0, SendOp::Send, SendFlags::empty());
    #[inline(always)]
    fn set_wr_id(&mut self, id: u64) {
        self.wr_id = id;
    }
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline(always)]
    fn opcode(&self) -> WcOpcode {
        self.op.wc_opcode()
    }
    #[inline(always)]
    fn set_signaled(&mut self, on: bool) {
        self.flags.set(SendFlags::SIGNALED, on);
    }
}

impl<const SGES: usize> SendEntry<SGES> for SendWr<SGES> {
    #[inline(always)]
    fn sges_mut(&mut self) -> &mut [Sge; SGES] {
        &mut self.sg_list
    }
    #[inline(always)]
    fn set_num_sge(&mut self, n: u8) {
        self.num_sge = n;
    }
    #[inline(always)]
    fn set_op(&mut self, op: SendOp, flags: SendFlags) {
        self.op = op;
        self.flags = flags;
    }
}

impl<const SGES: usize> WorkRequest for RecvWr<SGES> {
    const BLANK: Self = RecvWr::new(0);
    fn set_wr_id(&mut self, id: u64) {
        self.wr_id = id;
    }
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    fn opcode(&self) -> WcOpcode {
        WcOpcode::Recv
    }
    fn set_signaled(&mut self, _: bool) {}
}

/// A completion in a provider's own layout, as its poll wrote it
/// ([`Provider::poll_cq_one`](super::Provider::poll_cq_one)): the `wr_id` and the status
/// are read in place, the rest only when the whole completion is wanted. For verbs the
/// `ibv_wc` the library wrote; for the simulator our [`WorkCompletion`].
pub trait CompletionRecord {
    /// The work request's id.
    fn wr_id(&self) -> u64;
    /// Whether the request succeeded.
    fn succeeded(&self) -> bool;
    /// The whole completion.
    fn completion(&self) -> WorkCompletion;
    /// The record itself, if the provider's layout is ours (then read in place, not
    /// converted).
    #[inline(always)]
    fn as_ours(&self) -> Option<&WorkCompletion> {
        None
    }
    /// One of ours as a record, if the provider's layout is ours: a shared queue's
    /// completion (always ours) is then read as the provider's own are, with one code
    /// path for both.
    #[inline(always)]
    fn from_ours(_wc: &WorkCompletion) -> Option<&Self>
    where
        Self: Sized,
    {
        None
    }
}

impl CompletionRecord for WorkCompletion {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline(always)]
    fn succeeded(&self) -> bool {
        self.status == crate::types::WcStatus::Success
    }
    #[inline(always)]
    fn completion(&self) -> WorkCompletion {
        *self
    }
    #[inline(always)]
    fn as_ours(&self) -> Option<&WorkCompletion> {
        Some(self)
    }
    #[inline(always)]
    fn from_ours(wc: &WorkCompletion) -> Option<&Self> {
        Some(wc)
    }
}
