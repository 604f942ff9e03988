//! Translation between zverbs' work requests and completions and the C ones, and the layout
//! and value assertions that make the translation cheap.
//!
//! Gather/scatter lists are not copied: an `ibv_send_wr` points straight into the
//! [`SendWr`]'s own `[Sge; SGES]`, which is sound because [`Sge`] and `ibv_sge` have the same
//! layout (asserted below). Flags and access rights are passed through bit for bit (values
//! asserted below), and completion statuses through [`WcStatus::from_raw`] (every named
//! value asserted below; a value without a name stays [`WcStatus::Unknown`]).

use core::mem::{align_of, offset_of, size_of};

use ibverbs_sys as ffi;

use crate::types::{
    AccessFlags, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

// `ibv_send_wr::sg_list` / `ibv_recv_wr::sg_list` point at our `[Sge; SGES]` arrays.
static_assertions::assert_eq_size!(Sge, ffi::ibv_sge);
static_assertions::assert_eq_align!(Sge, ffi::ibv_sge);
static_assertions::const_assert_eq!(offset_of!(Sge, addr), offset_of!(ffi::ibv_sge, addr));
static_assertions::const_assert_eq!(offset_of!(Sge, length), offset_of!(ffi::ibv_sge, length));
static_assertions::const_assert_eq!(offset_of!(Sge, lkey), offset_of!(ffi::ibv_sge, lkey));
static_assertions::const_assert_eq!(size_of::<ffi::ibv_sge>(), 16);
static_assertions::const_assert_eq!(align_of::<ffi::ibv_sge>(), 8);

// Our flag types carry the verbs bit values, so they are passed through unchanged.
macro_rules! same_bits {
    ($($ours:expr => $theirs:expr;)*) => {
        $(static_assertions::const_assert_eq!($ours.bits(), $theirs.0);)*
    };
}
same_bits! {
    SendFlags::FENCE => ffi::ibv_send_flags::IBV_SEND_FENCE;
    SendFlags::SIGNALED => ffi::ibv_send_flags::IBV_SEND_SIGNALED;
    SendFlags::SOLICITED => ffi::ibv_send_flags::IBV_SEND_SOLICITED;
    SendFlags::INLINE => ffi::ibv_send_flags::IBV_SEND_INLINE;
    AccessFlags::LOCAL_WRITE => ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
    AccessFlags::REMOTE_WRITE => ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
    AccessFlags::REMOTE_READ => ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
    AccessFlags::REMOTE_ATOMIC => ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
}

// Every completion status keeps its verbs value.
macro_rules! same_status {
    ($($ours:ident = $theirs:ident;)*) => {
        $(static_assertions::const_assert_eq!(
            WcStatus::$ours.raw(),
            ffi::ibv_wc_status::$theirs
        );)*
    };
}
same_status! {
    Success = IBV_WC_SUCCESS;
    LocLenErr = IBV_WC_LOC_LEN_ERR;
    LocQpOpErr = IBV_WC_LOC_QP_OP_ERR;
    LocEecOpErr = IBV_WC_LOC_EEC_OP_ERR;
    LocProtErr = IBV_WC_LOC_PROT_ERR;
    WrFlushErr = IBV_WC_WR_FLUSH_ERR;
    MwBindErr = IBV_WC_MW_BIND_ERR;
    BadRespErr = IBV_WC_BAD_RESP_ERR;
    LocAccessErr = IBV_WC_LOC_ACCESS_ERR;
    RemInvReqErr = IBV_WC_REM_INV_REQ_ERR;
    RemAccessErr = IBV_WC_REM_ACCESS_ERR;
    RemOpErr = IBV_WC_REM_OP_ERR;
    RetryExcErr = IBV_WC_RETRY_EXC_ERR;
    RnrRetryExcErr = IBV_WC_RNR_RETRY_EXC_ERR;
    LocRddViolErr = IBV_WC_LOC_RDD_VIOL_ERR;
    RemInvRdReqErr = IBV_WC_REM_INV_RD_REQ_ERR;
    RemAbortErr = IBV_WC_REM_ABORT_ERR;
    InvEecnErr = IBV_WC_INV_EECN_ERR;
    InvEecStateErr = IBV_WC_INV_EEC_STATE_ERR;
    FatalErr = IBV_WC_FATAL_ERR;
    RespTimeoutErr = IBV_WC_RESP_TIMEOUT_ERR;
    GeneralErr = IBV_WC_GENERAL_ERR;
    TmErr = IBV_WC_TM_ERR;
    TmRndvIncomplete = IBV_WC_TM_RNDV_INCOMPLETE;
}

/// Fills `out` from `wr` (the chain link `next` is left to the caller).
///
/// `out.sg_list` borrows `wr.sg_list`: `out` must not outlive `wr`, and the verbs library
/// only reads through the pointer (the `*mut` is the C signature's).
pub(super) fn send_wr<const SGES: usize>(wr: &SendWr<SGES>, out: &mut ffi::ibv_send_wr) {
    let sges = wr.sges();
    out.wr_id = wr.wr_id;
    out.sg_list = sges.as_ptr().cast::<ffi::ibv_sge>().cast_mut();
    out.num_sge = sges.len() as i32; // at most 255 (`num_sge` is a u8)
    out.send_flags = wr.flags.bits();
    set_send_op(wr.op, out);
}

/// Writes `op` into `out`: its opcode, and the members of the immediate and operand
/// unions that the opcode has. The others keep what they held: the library reads only
/// the members its opcode names (a request built over an earlier one may hold that one's
/// operands where its own opcode has none, never read).
#[inline(always)]
pub(super) fn set_send_op(op: SendOp, out: &mut ffi::ibv_send_wr) {
    use ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 as Rdma;
    use ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 as Atomic;
    use ffi::ibv_wr_opcode as code;
    // Immediate data travels in network byte order; our API carries the value.
    let imm = |out: &mut ffi::ibv_send_wr, v: u32| out.__bindgen_anon_1.imm_data = v.to_be();
    out.opcode = match op {
        SendOp::Send => code::IBV_WR_SEND,
        SendOp::SendWithImm(v) => {
            imm(out, v);
            code::IBV_WR_SEND_WITH_IMM
        }
        SendOp::Write { remote_addr, rkey } => {
            out.wr.rdma = Rdma { remote_addr, rkey };
            code::IBV_WR_RDMA_WRITE
        }
        SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: v,
        } => {
            out.wr.rdma = Rdma { remote_addr, rkey };
            imm(out, v);
            code::IBV_WR_RDMA_WRITE_WITH_IMM
        }
        SendOp::Read { remote_addr, rkey } => {
            out.wr.rdma = Rdma { remote_addr, rkey };
            code::IBV_WR_RDMA_READ
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            out.wr.atomic = Atomic {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
            code::IBV_WR_ATOMIC_CMP_AND_SWP
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            out.wr.atomic = Atomic {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
            code::IBV_WR_ATOMIC_FETCH_AND_ADD
        }
        SendOp::Datagram { dest, imm: v } => {
            // The key is an `ibv_ah *` as an integer (`Verbs::ah_key`); that it names a
            // live handle is `post_send`'s contract.
            let ah = dest.ah.0 as usize as *mut ffi::ibv_ah;
            out.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah,
                remote_qpn: dest.remote_qpn,
                remote_qkey: dest.remote_qkey,
            };
            match v {
                Some(v) => {
                    imm(out, v);
                    code::IBV_WR_SEND_WITH_IMM
                }
                None => code::IBV_WR_SEND,
            }
        }
    };
}

/// Fills `out` from `wr`; as [`send_wr`], `out.sg_list` borrows `wr.sg_list`. The verbs
/// library reads the scatter list at post time and does not write it.
pub(super) fn recv_wr<const SGES: usize>(wr: &RecvWr<SGES>, out: &mut ffi::ibv_recv_wr) {
    let sges = wr.sges();
    out.wr_id = wr.wr_id;
    out.sg_list = sges.as_ptr().cast::<ffi::ibv_sge>().cast_mut();
    out.num_sge = sges.len() as i32;
}

/// The completion opcode for a verbs value. Values zverbs never posts (memory windows,
/// TSO, tag matching) cannot occur on its queue pairs; they map by direction.
#[inline(always)]
fn wc_opcode(v: ffi::ibv_wc_opcode::Type) -> WcOpcode {
    use ffi::ibv_wc_opcode as op;
    // The send side's values are 0..5 in this order (asserted below): one load.
    const SEND_SIDE: [WcOpcode; 5] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompareSwap,
        WcOpcode::FetchAdd,
    ];
    match v {
        v if (v as usize) < SEND_SIDE.len() => SEND_SIDE[v as usize],
        op::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        v if v & op::IBV_WC_RECV != 0 => WcOpcode::Recv,
        _ => WcOpcode::Send,
    }
}

// `wc_opcode`'s table.
static_assertions::const_assert_eq!(ffi::ibv_wc_opcode::IBV_WC_SEND, 0);
static_assertions::const_assert_eq!(ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE, 1);
static_assertions::const_assert_eq!(ffi::ibv_wc_opcode::IBV_WC_RDMA_READ, 2);
static_assertions::const_assert_eq!(ffi::ibv_wc_opcode::IBV_WC_COMP_SWAP, 3);
static_assertions::const_assert_eq!(ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD, 4);

/// The status of a failed completion, out of the way of the usual one.
#[cold]
#[inline(never)]
fn failed_status(status: ffi::ibv_wc_status::Type) -> WcStatus {
    WcStatus::from_raw(status)
}

impl crate::provider::CompletionRecord for ffi::ibv_wc {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        ffi::ibv_wc::wr_id(self)
    }
    #[inline(always)]
    fn succeeded(&self) -> bool {
        self.is_valid()
    }
    #[inline(always)]
    fn completion(&self) -> WorkCompletion {
        work_completion(self)
    }
}

/// Our completion for a C one.
#[inline(always)]
pub(super) fn work_completion(wc: &ffi::ibv_wc) -> WorkCompletion {
    let status = match wc.error() {
        None => WcStatus::Success,
        Some((failed, _vendor_err)) => failed_status(failed),
    };
    let opcode = wc_opcode(wc.opcode());
    // Immediate data belongs to receive completions only (`IBV_WC_RECV` set, as
    // `wc_opcode` maps it); some providers (rxe) also set `IBV_WC_WITH_IMM` on the sender's
    // completion, with a meaningless value.
    let with_imm = wc.wc_flags.0 & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0
        && wc.opcode() & ffi::ibv_wc_opcode::IBV_WC_RECV != 0;
    WorkCompletion {
        wr_id: wc.wr_id(),
        status,
        opcode,
        byte_len: wc.len() as u32, // `ibv_wc::byte_len` is a u32
        imm: with_imm.then(|| u32::from_be(wc.imm_data)),
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        grh: wc.wc_flags.0 & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0,
        sl: wc.sl,
        slid: wc.slid,
        pkey_index: wc.pkey_index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_wr_points_at_our_sges_and_keeps_values() {
        let mut wr = SendWr::<4>::new(
            7,
            SendOp::CompareSwap {
                remote_addr: 0x1000,
                rkey: 0x42,
                compare: 1,
                swap: 2,
            },
            SendFlags::SIGNALED | SendFlags::FENCE,
        );
        wr.sg_list[0] = Sge {
            addr: 0x2000,
            length: 8,
            lkey: 9,
        };
        wr.num_sge = 1;
        let mut c = ffi::ibv_send_wr::default();
        send_wr(&wr, &mut c);
        assert_eq!(c.wr_id, 7);
        assert_eq!(c.num_sge, 1);
        assert_eq!(c.opcode, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP);
        assert_eq!(c.send_flags, 3);
        assert_eq!(c.sg_list.cast_const(), wr.sg_list.as_ptr().cast());
        // SAFETY: `sg_list` points at `wr.sg_list[0]`, alive and laid out as `ibv_sge`.
        let sge = unsafe { *c.sg_list };
        assert_eq!((sge.addr, sge.length, sge.lkey), (0x2000, 8, 9));
        // SAFETY: the atomic member is the one `send_wr` wrote for this opcode.
        let a = unsafe { c.wr.atomic };
        assert_eq!(
            (a.remote_addr, a.rkey, a.compare_add, a.swap),
            (0x1000, 0x42, 1, 2)
        );

        let wr = SendWr::<1>::new(8, SendOp::SendWithImm(0x0102_0304), SendFlags::empty());
        send_wr(&wr, &mut c);
        // SAFETY: the imm member is the one `send_wr` wrote for this opcode.
        assert_eq!(
            unsafe { c.__bindgen_anon_1.imm_data },
            0x0102_0304u32.to_be()
        );
    }

    #[test]
    fn wc_status_without_a_name_is_kept() {
        // `ibv_wc` keeps `status` private; it follows the 8-byte `wr_id` (C layout).
        assert_eq!(size_of::<u64>(), 8);
        for (raw, want) in [
            (
                ffi::ibv_wc_status::IBV_WC_REM_ABORT_ERR,
                WcStatus::RemAbortErr,
            ),
            (
                ffi::ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE,
                WcStatus::TmRndvIncomplete,
            ),
            (99, WcStatus::Unknown(99)),
        ] {
            let mut c = ffi::ibv_wc::default();
            // SAFETY: `ibv_wc` is `#[repr(C)]` with `wr_id: u64` then `status: u32` at
            // offset 8, inside the struct; `c` is a live, exclusively borrowed value.
            unsafe {
                core::ptr::addr_of_mut!(c)
                    .cast::<u8>()
                    .add(8)
                    .cast::<u32>()
                    .write(raw)
            };
            assert_eq!(c.error().map(|e| e.0), Some(raw));
            let wc = work_completion(&c);
            assert_eq!((wc.status, wc.status.raw()), (want, raw));
        }
    }

    /// The `ibv_wc` read in place as a record agrees with its conversion.
    #[test]
    fn a_record_reads_what_its_conversion_reads() {
        use crate::provider::CompletionRecord;
        for (id, raw) in [
            (7u64, ffi::ibv_wc_status::IBV_WC_SUCCESS),
            (9, ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR),
        ] {
            let mut c = ffi::ibv_wc::default();
            // SAFETY: `ibv_wc` is `#[repr(C)]` with `wr_id: u64` at offset 0 and
            // `status: u32` at offset 8; `c` is a live, exclusively borrowed value.
            unsafe {
                let p = core::ptr::addr_of_mut!(c).cast::<u8>();
                p.cast::<u64>().write_unaligned(id);
                p.add(8).cast::<u32>().write(raw);
            }
            let wc = work_completion(&c);
            assert_eq!(CompletionRecord::wr_id(&c), id);
            assert_eq!(c.succeeded(), wc.status == WcStatus::Success);
            assert_eq!(c.succeeded(), raw == ffi::ibv_wc_status::IBV_WC_SUCCESS);
            assert_eq!(c.completion(), wc);
            assert!(c.as_ours().is_none());
        }
    }

    #[test]
    fn wc_opcodes_map() {
        use ffi::ibv_wc_opcode as op;
        assert_eq!(wc_opcode(op::IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            wc_opcode(op::IBV_WC_RECV_RDMA_WITH_IMM),
            WcOpcode::RecvRdmaWithImm
        );
        assert_eq!(wc_opcode(op::IBV_WC_FETCH_ADD), WcOpcode::FetchAdd);
        assert_eq!(wc_opcode(op::IBV_WC_COMP_SWAP), WcOpcode::CompareSwap);
        assert_eq!(wc_opcode(op::IBV_WC_RDMA_READ), WcOpcode::RdmaRead);
    }
}
