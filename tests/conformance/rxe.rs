//! Documented deviations of soft-RoCE from the verbs specification.

use super::Deviation;

/// Where soft-RoCE (rdma_rxe of Linux 6.1, rdma-core 44: Debian 12) deviates from the verbs
/// specification and from hardware. The simulator follows the specification unless told to
/// imitate rxe (`zverbs_sim::Personality::Rxe`); `conformance_sim.rs` runs the suite both
/// ways and requires these outcomes of the rxe personality.
pub const RXE_DEVIATIONS: &[Deviation] = &[
    Deviation {
        scenario: "comm_est_event",
        outcome: "a1=[1:SUCCESS Send]; b1=[101:SUCCESS Recv len=8]; a2=[2:SUCCESS Send]; \
                  b2=[102:SUCCESS Recv len=8]; events=-,-",
        why: "rxe of Linux 6.1 raises no COMM_EST when a request reaches a queue pair in \
              RTR; HCAs do (IBA o11-5.1.1; qib's responder, mlx5's COMM_EST event), and a \
              connection manager that waits for an RTU may use it",
    },
    Deviation {
        scenario: "responder_error_events",
        outcome: "access=none; request=none; write_imm=none",
        why: "rxe of Linux 6.1 raises no affiliated asynchronous error at the responder of \
              a class C error that no receive can carry (IBA C9-222.1.1): its owner sees \
              only the queue pair in ERR; HCAs raise QP_ACCESS_ERR or QP_REQ_ERR (mlx5's \
              WQ access and invalid-request events), and rxe raises QP_ACCESS_ERR for \
              R_Key violations from 2026 on",
    },
    Deviation {
        scenario: "dmabuf_registration",
        outcome: "dmabuf=false; register=Unsupported",
        why: "soft-RoCE registers no dmabufs: rdma-core's rxe provider has no \
              reg_dmabuf_mr (the dummy op answers EOPNOTSUPP); mlx5, irdma, bnxt_re and \
              efa register them (GPUDirect RDMA)",
    },
    Deviation {
        scenario: "srq_last_wqe",
        outcome: "event=none; b.flushed=[]; b=[100:SUCCESS Recv len=8]; consumer=1",
        why: "rxe of Linux 6.1 raises no QP_LAST_WQE_REACHED when a queue pair on an SRQ \
              moves to ERR (its responder returns without flushing; the event came with \
              flush_recv_queue in later kernels); the spec requires it before such a queue \
              pair is destroyed, so a wait for it must be bounded",
    },
    Deviation {
        scenario: "ud_source",
        outcome: "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=56]; b.src_qp=ok; b.sl=0; \
                  b.slid=0; b.grh=ok; b.pkey_index=0; reply=ok; bytes=ok",
        why: "RoCE has no LIDs (the completion's slid is 0) and rxe keeps no service level \
              (its completions leave sl 0); an InfiniBand HCA reports the sender's LID and \
              the service level of its address handle",
    },
    Deviation {
        scenario: "ud_no_grh",
        outcome: "create_ah=InvalidArgument",
        why: "a RoCE port needs the global route: the kernel refuses an address handle \
              without one (rdma_check_ah_attr, EINVAL); an InfiniBand HCA routes it by the \
              LID and the receive has no GRH",
    },
    Deviation {
        scenario: "loc_prot_bad_lkey",
        outcome: "a=[1:LOC_QP_OP_ERR]; a.state=Error; b=[]; b.state=ReadyToSend",
        why: "an lkey that names no MR fails rxe's copy_data with -EINVAL, which rxe_req \
              reports as LOC_QP_OP_ERR (only -EFAULT becomes LOC_PROT_ERR); the spec and \
              HCAs report LOC_PROT_ERR",
    },
    Deviation {
        scenario: "loc_len_short_recv",
        outcome: "a=[1:REM_OP_ERR]; b=[101:LOC_QP_OP_ERR]; a.state=Error; b.state=Error",
        why: "rxe treats a receive too short for the message as a malformed WQE (class A: \
              REM_OP_ERR NAK, LOC_QP_OP_ERR at the responder); the spec requires \
              LOC_LEN_ERR at the responder and REM_INV_REQ_ERR at the requester",
    },
    Deviation {
        scenario: "ud_silent_drops",
        outcome: "a=[1:SUCCESS Send, 2:SUCCESS Send, 3:SUCCESS Send, 4:SUCCESS Send]; \
                  b=[101:LOC_QP_OP_ERR]; b.late=[]; bytes=MISMATCH; b.state=Error",
        why: "a datagram longer than the receive fails rxe's copy_data (a malformed WQE: \
              LOC_QP_OP_ERR, the queue pair to ERR) in Linux 6.1; the IBTA drops it \
              silently and keeps the receive, as rxe does since \"RDMA/rxe: Fix responder \
              length checking for UD request packets\" (2024)",
    },
    Deviation {
        scenario: "rem_atomic_misaligned",
        outcome: "post_send=InvalidArgument; a.state=ReadyToSend",
        why: "the rxe userspace provider rejects a misaligned atomic at post time (EINVAL), \
              so the responder's invalid-request NAK (REM_INV_REQ_ERR) is never reached",
    },
    Deviation {
        scenario: "rem_write_imm_bad_rkey",
        outcome: "a=[1:REM_ACCESS_ERR]; a.state=Error; b=[101:REM_ACCESS_ERR]; \
                  b.state=Error; remote_untouched=ok",
        why: "rxe completes the consumed receive with REM_ACCESS_ERR; the spec and \
              ibv_poll_cq(3) give LOC_ACCESS_ERR for the responder of a failed RDMA WRITE \
              with immediate",
    },
    Deviation {
        scenario: "path_attributes",
        outcome: "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=64]; bytes=ok; a.sl=0; \
                  a.traffic_class=0x68; a.flow_label=0x12345; a.hop_limit=64; a.path_mtu=ok; \
                  a.dest_qp_num=ok; a.dgid=ok; b.sl=0; b.traffic_class=0x0; b.hop_limit=64; \
                  b.path_mtu=ok",
        why: "rxe keeps no service level (its address vector, rxe_av, has no SL field and \
              rxe_qp_to_attr never sets it), so ibv_query_qp reports SL 0; and Linux \
              resolves every RoCE path through the IP stack (ib_resolve_unicast_gid_dmac), \
              which replaces the hop limit asked for with the route's (64). The traffic \
              class and flow label are kept. The spec and IB HCAs keep all four",
    },
];
