//! Work completions: what completed, and how.

use core::fmt;

/// What a work completion reports (`ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A send (with or without immediate) completed.
    Send,
    /// An RDMA write (with or without immediate) completed.
    RdmaWrite,
    /// An RDMA read completed.
    RdmaRead,
    /// A compare-and-swap completed.
    CompareSwap,
    /// A fetch-and-add completed.
    FetchAdd,
    /// A receive consumed by a send.
    Recv,
    /// A receive consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
}

macro_rules! wc_status {
    (
        $(#[$enum_doc:meta])*
        enum;
        $($(#[$doc:meta])* $name:ident = $val:literal, $c:literal, $msg:literal;)*
    ) => {
        $(#[$enum_doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum WcStatus {
            $($(#[$doc])* $name,)*
            /// A value with no name here (a newer provider's status), kept as the provider
            /// reported it (a value past 65,535, which no provider defines, as 65,535: two
            /// bytes keep a completion within its 40). [`WcStatus::from_raw`] gives it only
            /// for values without a name.
            Unknown(u16),
        }

        impl WcStatus {
            /// The status for a verbs value; a value without a name is kept as
            /// [`WcStatus::Unknown`].
            pub const fn from_raw(v: u32) -> WcStatus {
                match v {
                    $($val => WcStatus::$name,)*
                    v if v > u16::MAX as u32 => WcStatus::Unknown(u16::MAX),
                    v => WcStatus::Unknown(v as u16),
                }
            }
            /// The verbs value (for [`WcStatus::Unknown`], the value it keeps).
            pub const fn raw(self) -> u32 {
                match self { $(WcStatus::$name => $val,)* WcStatus::Unknown(v) => v as u32 }
            }
            /// The verbs name, e.g. `IBV_WC_REM_ACCESS_ERR`; `"unknown"` for
            /// [`WcStatus::Unknown`].
            pub const fn name(self) -> &'static str {
                match self { $(WcStatus::$name => $c,)* WcStatus::Unknown(_) => "unknown" }
            }
            /// What the status means, in a sentence fragment.
            pub const fn description(self) -> &'static str {
                match self {
                    $(WcStatus::$name => $msg,)*
                    WcStatus::Unknown(_) => "a status value this version of zverbs does not know",
                }
            }
        }
    };
}

wc_status! {
    /// Completion status (`ibv_wc_status`; [`WcStatus::raw`] is the verbs value).
    ///
    /// A provider's value that has no name here is kept as [`WcStatus::Unknown`], never
    /// folded into another status. The enum is `#[non_exhaustive]`: a status rdma-core adds
    /// later can get its name without breaking a `match`.
    ///
    /// # Which statuses an RC queue pair reports
    ///
    /// zverbs's `tests/wc_status.rs` provokes every status below that a zverbs RC queue pair
    /// can meet, through the public API on the simulator: `SUCCESS`, `LOC_LEN_ERR`,
    /// `LOC_QP_OP_ERR`, `LOC_PROT_ERR`, `WR_FLUSH_ERR`, `BAD_RESP_ERR`, `LOC_ACCESS_ERR`,
    /// `REM_INV_REQ_ERR`, `REM_ACCESS_ERR`, `REM_OP_ERR`, `RETRY_EXC_ERR`,
    /// `RNR_RETRY_EXC_ERR` and `FATAL_ERR` (the last as rxe reports it: an RDMA READ
    /// response answering a request that is not a read, `check_ack` in the kernel's
    /// `drivers/infiniband/sw/rxe/rxe_comp.c`). The others, and why no test provokes them:
    ///
    /// | status | why no RC test provokes it |
    /// |---|---|
    /// | `LOC_EEC_OP_ERR`, `LOC_RDD_VIOL_ERR`, `REM_INV_RD_REQ_ERR`, `INV_EECN_ERR`, `INV_EEC_STATE_ERR` | Reliable Datagram only: they report errors of an end-to-end context or a reliable datagram domain, which RC does not have ("relevant only to RD QPs or EE Context, which aren't supported": RDMAmojo's `ibv_poll_cq` reference, quoted in the docs of `ibverbs-sys`'s `ibv_wc::error`), and Linux verbs has no RD transport (`enum ibv_qp_type` in rdma-core's `libibverbs/verbs.h`: RC, UC, UD, raw packet, XRC, driver). Where a provider reuses `REM_INV_RD_REQ_ERR` it is for another transport: hns for an XRC violation (`providers/hns/hns_roce_u_hw_v2.c`), EFA's SRD for an unknown destination QP (`providers/efa/verbs.c`, `to_ibv_status`). |
    /// | `MW_BIND_ERR` | RC reports it only for a memory-window bind, a local invalidate or a fast registration work request (mlx5: syndrome `MW_BIND_ERR` in `mlx5_handle_error_cqe`, `providers/mlx5/cq.c`; irdma, bnxt_re and cxgb4 likewise). zverbs can post none of them: it has no `ibv_alloc_mw` / `ibv_bind_mw` and no bind or invalidate [`SendOp`](crate::SendOp). |
    /// | `REM_ABORT_ERR` | Defined for receives: "for UD or UC QPs associated with a SRQ, the responder aborted the operation" (same reference). Never a requester's status on RC: a responder tells the requester of an error only with an AETH NAK code (PSN sequence error, invalid request, remote access error, remote operational error, invalid RD request: IBA vol. 1, the AETH syndrome encoding; `AETH_NAK_*` in rxe), and none of them means "aborted" (rxe's `check_ack` maps each to another status). mlx5 reports it (syndrome `REMOTE_ABORTED_ERR`, 0x22) on a *receive* from a shared receive queue whose message is abandoned half-way, after a lost middle packet (vendor syndrome 0x99) or an on-demand-paging fault (0x93), and the queue pair stays usable: UCX releases that receive and carries on (`uct_rc_mlx5_iface_check_rx_completion`, openucx/ucx#5667). zverbs has neither shared receive queues nor on-demand paging, and the simulator moves each message as a whole, so no receive is ever left half-filled. |
    /// | `RESP_TIMEOUT_ERR` | No RC device reports it: an RC request nobody answers ends in `RETRY_EXC_ERR` after `retry_cnt` retransmissions (so report mlx5, rxe, bnxt_re, irdma and qedr). In rdma-core only EFA maps a device status to it (an unresponsive or unreachable peer on its SRD transport, `to_ibv_status` in `providers/efa/verbs.c`), besides ocrdma's one-to-one copy of the spec's codes; the kernel's MAD layer (UD) reports it for a MAD whose response never came (`timeout_sends`, `drivers/infiniband/core/mad.c`). |
    /// | `GENERAL_ERR` | Not a condition but the providers' catch-all for a vendor syndrome without a verbs name (`default:` of `mlx5_handle_error_cqe`, mlx4 and mthca); no RC error mlx5 or rxe defines maps to it. A value zverbs does not know arrives as [`WcStatus::Unknown`] instead. |
    /// | `TM_ERR`, `TM_RNDV_INCOMPLETE` | Tag matching only: completions of tag-list operations and rendezvous messages on a tag-matching shared receive queue (`handle_tag_matching`, `providers/mlx5/cq.c`); zverbs has no shared receive queue. |
    ///
    /// `FATAL_ERR` on other devices means a catastrophic error of the queue pair or the
    /// device, whose outstanding work is then flushed with it (irdma's `FLUSH_FATAL_ERR`,
    /// bnxt_re's hardware flush, cxgb4); mlx5 never reports it (a device in internal error
    /// completes outstanding work with `WR_FLUSH_ERR`: `mlx5_ib_poll_sw_comp` in the kernel).
    enum;
    /// The work request completed.
    Success = 0, "IBV_WC_SUCCESS", "success";
    /// A local length check failed (receive buffer too short, message too long).
    LocLenErr = 1, "IBV_WC_LOC_LEN_ERR", "local length error: a buffer is too short for the message";
    /// An internal consistency error of the local queue pair.
    LocQpOpErr = 2, "IBV_WC_LOC_QP_OP_ERR", "local QP operation error";
    /// Local EE context error (RD only).
    LocEecOpErr = 3, "IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error";
    /// A local key, bound or access right did not cover a scatter/gather entry.
    LocProtErr = 4, "IBV_WC_LOC_PROT_ERR", "local protection error: an lkey, bound or access right does not cover the buffer";
    /// The queue pair was in the error state; the request was not executed.
    WrFlushErr = 5, "IBV_WC_WR_FLUSH_ERR", "flushed: the queue pair entered the error state before this request ran";
    /// A memory-window bind (or another memory management operation) failed.
    MwBindErr = 6, "IBV_WC_MW_BIND_ERR", "memory window bind error";
    /// The responder sent an unexpected transport response.
    BadRespErr = 7, "IBV_WC_BAD_RESP_ERR", "bad response from the responder";
    /// Local access error on a responder-side protection check.
    LocAccessErr = 8, "IBV_WC_LOC_ACCESS_ERR", "local access error";
    /// The responder rejected the request as invalid (opcode not allowed, misaligned atomic, receive too short).
    RemInvReqErr = 9, "IBV_WC_REM_INV_REQ_ERR", "remote invalid request: the responder rejected the operation";
    /// The responder's rkey, bounds or access rights did not allow the access.
    RemAccessErr = 10, "IBV_WC_REM_ACCESS_ERR", "remote access error: the rkey, bounds or access rights do not allow it";
    /// The responder could not complete the operation (e.g. its receive buffer was unusable).
    RemOpErr = 11, "IBV_WC_REM_OP_ERR", "remote operation error: the responder could not complete it";
    /// No acknowledgement after `retry_cnt` retransmissions.
    RetryExcErr = 12, "IBV_WC_RETRY_EXC_ERR", "transport retry counter exceeded: the peer did not answer";
    /// The peer had no receive posted after `rnr_retry` retries.
    RnrRetryExcErr = 13, "IBV_WC_RNR_RETRY_EXC_ERR", "RNR retry counter exceeded: the peer had no receive posted";
    /// RD only.
    LocRddViolErr = 14, "IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation";
    /// RD only.
    RemInvRdReqErr = 15, "IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request";
    /// The responder aborted the operation (on mlx5: a shared-receive-queue receive whose
    /// message was abandoned half-way).
    RemAbortErr = 16, "IBV_WC_REM_ABORT_ERR", "remote aborted";
    /// RD only.
    InvEecnErr = 17, "IBV_WC_INV_EECN_ERR", "invalid EE context number";
    /// RD only.
    InvEecStateErr = 18, "IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state";
    /// A fatal transport, queue pair or device error (rxe: a response of the wrong kind).
    FatalErr = 19, "IBV_WC_FATAL_ERR", "fatal error";
    /// The response timed out (not an RC status).
    RespTimeoutErr = 20, "IBV_WC_RESP_TIMEOUT_ERR", "response timeout";
    /// A provider's catch-all for errors without a verbs name.
    GeneralErr = 21, "IBV_WC_GENERAL_ERR", "general error";
    /// A tag-matching operation failed (tag-matching shared receive queues only).
    TmErr = 22, "IBV_WC_TM_ERR", "tag matching error";
    /// A tag-matched rendezvous message was not completed by the device (tag matching only).
    TmRndvIncomplete = 23, "IBV_WC_TM_RNDV_INCOMPLETE", "tag matching rendezvous incomplete";
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Unknown(v) => {
                write!(f, "unknown completion status {v} ({})", self.description())
            }
            _ => write!(f, "{} ({})", self.name(), self.description()),
        }
    }
}

/// A work completion (`ibv_wc`), as polled from a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Laid out so that its 40 bytes hold the datagram fields, and a channel's completion
// (`zverbs::Completion`, the same fields from `status` on) is one run of its bytes.
#[repr(C)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// Local queue pair number.
    pub qp_num: u32,
    /// Status.
    pub status: WcStatus,
    /// What completed (meaningful on success).
    pub opcode: WcOpcode,
    /// A receive on an unreliable-datagram queue pair whose buffer starts with the 40
    /// bytes of a global route header (`IBV_WC_GRH`, always so on RoCE). Without one
    /// (an InfiniBand sender whose address handle has no global route) those 40 bytes are
    /// left as they were, and `byte_len` still counts them.
    pub grh: bool,
    /// The sender's service level, for a receive on an unreliable-datagram queue pair
    /// (`sl`; 0 on RoCE devices that keep none, such as rxe).
    pub sl: u8,
    /// Bytes transferred (meaningful for receives, reads and atomics).
    pub byte_len: u32,
    /// Immediate data of a receive, if the sender attached any.
    pub imm: Option<u32>,
    /// The sending queue pair's number, for a receive on an unreliable-datagram queue
    /// pair (`src_qp`); 0 otherwise.
    pub src_qp: u32,
    /// The sender's LID, for a receive on an unreliable-datagram queue pair (`slid`; 0 on
    /// RoCE, which has no LIDs).
    pub slid: u16,
    /// The index of the P_Key the message matched (`pkey_index`: valid for the general
    /// services queue pair only, as `ibv_poll_cq(3)` says; 0 otherwise).
    pub pkey_index: u16,
}

impl WorkCompletion {
    /// A zeroed completion, for initialising caller-owned poll arrays.
    pub const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        src_qp: 0,
        grh: false,
        sl: 0,
        slid: 0,
        pkey_index: 0,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn wc_status_round_trips_every_verbs_value() {
        for v in 0..=23 {
            let s = WcStatus::from_raw(v);
            assert!(!matches!(s, WcStatus::Unknown(_)), "{v} has a name");
            assert_eq!(s.raw(), v);
            assert!(s.name().starts_with("IBV_WC_"));
        }
        assert_eq!(WcStatus::RemAccessErr.name(), "IBV_WC_REM_ACCESS_ERR");
        assert_eq!(WcStatus::from_raw(23), WcStatus::TmRndvIncomplete);
    }

    #[test]
    fn wc_status_keeps_unknown_values() {
        for v in [24, 99, 0xffff] {
            let s = WcStatus::from_raw(v);
            assert_eq!(
                s,
                WcStatus::Unknown(v as u16),
                "not folded into GENERAL_ERR"
            );
            assert_eq!(s.raw(), v);
        }
        // Past two bytes (no provider's): the largest two-byte value, still unknown.
        for v in [0x1_0000, 0x8000_0000, u32::MAX] {
            assert_eq!(WcStatus::from_raw(v), WcStatus::Unknown(u16::MAX));
        }
        // What keeps a completion at 40 bytes with its datagram fields.
        assert_eq!(core::mem::size_of::<WcStatus>(), 4);
        assert_eq!(core::mem::size_of::<WorkCompletion>(), 40);
        let s = format!("{}", WcStatus::from_raw(99));
        assert!(s.starts_with("unknown completion status 99 ("), "{s}");
    }
}
