//! A channel's completion: what it keeps of a work completion, and the one copy that
//! takes it.

use core::mem::{offset_of, size_of};
use core::ptr;

use crate::types::{WcOpcode, WcStatus, WorkCompletion};

/// The outcome of one work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// The fields of a [`WorkCompletion`] from its `status` on, in its order, so that filling
// one from the other copies one run of bytes.
#[repr(C)]
pub struct Completion {
    /// As [`WorkCompletion::status`].
    pub status: WcStatus,
    /// What completed; for a request that failed, what was posted.
    pub opcode: WcOpcode,
    /// As [`WorkCompletion::grh`] (datagram receives).
    pub grh: bool,
    /// As [`WorkCompletion::sl`] (datagram receives).
    pub sl: u8,
    /// As [`WorkCompletion::byte_len`].
    pub byte_len: u32,
    /// As [`WorkCompletion::imm`].
    pub imm: Option<u32>,
    /// As [`WorkCompletion::src_qp`]: on a datagram channel's receives, where a reply goes.
    pub src_qp: u32,
    /// As [`WorkCompletion::slid`] (datagram receives).
    pub slid: u16,
    /// As [`WorkCompletion::pkey_index`].
    pub pkey_index: u16,
}

impl Completion {
    /// A completion that reports only its status and opcode (no bytes, no sender).
    pub(crate) const fn bare(status: WcStatus, opcode: WcOpcode) -> Completion {
        Completion {
            status,
            opcode,
            byte_len: 0,
            imm: None,
            src_qp: 0,
            grh: false,
            sl: 0,
            slid: 0,
            pkey_index: 0,
        }
    }

    /// The completion of a request that succeeded, as `wc` reports it.
    #[inline(always)]
    pub(crate) fn succeeded(wc: &WorkCompletion) -> Completion {
        tail_of(wc)
    }

    /// As [`succeeded`](Self::succeeded), field by field: for a completion converted from
    /// a provider's own layout on its way here, whose fields are in registers, not in
    /// memory to copy from.
    #[inline(always)]
    pub(crate) fn succeeded_from(wc: WorkCompletion) -> Completion {
        same_fields(&wc)
    }
}

/// What a completion reports; a failed request's opcode comes from its slot (the device
/// leaves the completion's undefined).
#[inline]
pub(super) fn outcome(wc: &WorkCompletion, posted: WcOpcode) -> Completion {
    let mut c = tail_of(wc);
    if wc.status != WcStatus::Success {
        c.opcode = posted;
    }
    c
}

/// Where a [`Completion`] starts in a [`WorkCompletion`].
const AT: usize = offset_of!(WorkCompletion, status);

/// `wc` from its `status` on, which is a [`Completion`] ([`same_fields`] with one copy).
/// Field by field, the copy took nine loads and nine stores, eight instructions more per
/// operation than a channel's completion cost before it held the datagram fields.
#[inline(always)]
fn tail_of(wc: &WorkCompletion) -> Completion {
    let () = SAME_LAYOUT;
    // SAFETY: both types are `repr(C)`; `Completion` has `WorkCompletion`'s fields from
    // `status` on, of the same types (`same_fields` compiles) at the same offsets less
    // `AT`, and ends where it does (`SAME_LAYOUT`, checked at compile time). So the
    // `size_of::<Completion>()` bytes at `AT` lie within `*wc`, every field of the result
    // is read from a field of the same type, and its padding from padding.
    unsafe { ptr::read_unaligned(ptr::from_ref(wc).cast::<u8>().add(AT).cast::<Completion>()) }
}

/// What [`tail_of`] does, field by field: it compiles only while the fields' types agree.
#[inline(always)]
fn same_fields(wc: &WorkCompletion) -> Completion {
    Completion {
        status: wc.status,
        opcode: wc.opcode,
        grh: wc.grh,
        sl: wc.sl,
        byte_len: wc.byte_len,
        imm: wc.imm,
        src_qp: wc.src_qp,
        slid: wc.slid,
        pkey_index: wc.pkey_index,
    }
}

/// Every field of a [`Completion`] at its [`WorkCompletion`] offset less [`AT`], and the
/// same end.
const SAME_LAYOUT: () = {
    macro_rules! at {
        ($($f:ident),*) => {
            $(assert!(offset_of!(WorkCompletion, $f) - AT == offset_of!(Completion, $f));)*
        };
    }
    at!(status, opcode, grh, sl, byte_len, imm, src_qp, slid, pkey_index);
    assert!(size_of::<WorkCompletion>() - AT == size_of::<Completion>());
};
