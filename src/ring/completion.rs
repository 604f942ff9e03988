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
    /// Status.
    pub status: WcStatus,
    /// Completion opcode.
    pub opcode: WcOpcode,
    /// On a datagram channel's receives: whether the buffer starts with the sender's 40
    /// bytes of global route header (always on RoCE; without one, those bytes are left
    /// as they were).
    pub grh: bool,
    /// On a datagram channel's receives: the sender's service level (0 where the device
    /// keeps none, as rxe).
    pub sl: u8,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Immediate data.
    pub imm: Option<u32>,
    /// The sending queue pair's number, on a datagram channel's receives (where a reply
    /// goes); left as the device reports it otherwise (the verbs leave it undefined).
    pub src_qp: u32,
    /// On a datagram channel's receives: the sender's LID (0 on RoCE).
    pub slid: u16,
    /// The P_Key index the message matched (valid for the general services queue pair
    /// only; 0 otherwise).
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
#[allow(dead_code)]
fn same_fields(wc: &WorkCompletion) -> Completion {
    let WorkCompletion {
        wr_id: _,
        qp_num: _,
        status,
        opcode,
        grh,
        sl,
        byte_len,
        imm,
        src_qp,
        slid,
        pkey_index,
    } = *wc;
    Completion {
        status,
        opcode,
        grh,
        sl,
        byte_len,
        imm,
        src_qp,
        slid,
        pkey_index,
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
