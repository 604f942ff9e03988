//! The verbs backend's queue pair attributes: the transitions of the typestate as
//! `ibv_modify_qp` calls, and what `ibv_query_qp` reports back.

use ibverbs_sys as ffi;

use super::error::{check, VerbsError};
use super::{Mtu, Qp};
use crate::provider::{PathAttr, Transition};
use crate::types::{Gid, QpState};

/// `ibv_modify_qp` for transition `t`, with the attributes and mask it needs.
pub(super) fn modify(qp: &Qp, t: &Transition) -> Result<(), VerbsError> {
    use ffi::ibv_qp_attr_mask as m;
    use ffi::ibv_qp_state as s;
    let mut a = ffi::ibv_qp_attr::default();
    let mask = match *t {
        Transition::Reset => {
            a.qp_state = s::IBV_QPS_RESET;
            m::IBV_QP_STATE
        }
        Transition::Error => {
            a.qp_state = s::IBV_QPS_ERR;
            m::IBV_QP_STATE
        }
        Transition::Init(i) => {
            a.qp_state = s::IBV_QPS_INIT;
            a.pkey_index = i.pkey_index;
            a.port_num = i.port;
            a.qp_access_flags = i.access.bits();
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS
        }
        Transition::Rtr(r) => {
            a.qp_state = s::IBV_QPS_RTR;
            a.path_mtu = r.path_mtu as ffi::ibv_mtu;
            a.dest_qp_num = r.dest_qp_num;
            a.rq_psn = r.rq_psn;
            a.max_dest_rd_atomic = r.max_dest_rd_atomic;
            a.min_rnr_timer = r.min_rnr_timer;
            a.ah_attr.dlid = r.dlid;
            a.ah_attr.sl = r.sl;
            a.ah_attr.port_num = r.port;
            if let Some(dgid) = r.dgid {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh = ffi::ibv_global_route {
                    dgid: ffi::ibv_gid { raw: dgid.0 },
                    flow_label: r.flow_label,
                    sgid_index: r.sgid_index,
                    hop_limit: r.hop_limit,
                    traffic_class: r.traffic_class,
                };
            }
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER
        }
        Transition::InitUd(i) => {
            a.qp_state = s::IBV_QPS_INIT;
            a.pkey_index = i.pkey_index;
            a.port_num = i.port;
            a.qkey = i.qkey;
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY
        }
        Transition::RtrUd => {
            a.qp_state = s::IBV_QPS_RTR;
            m::IBV_QP_STATE
        }
        Transition::RtsUd { sq_psn } => {
            a.qp_state = s::IBV_QPS_RTS;
            a.sq_psn = sq_psn;
            m::IBV_QP_STATE | m::IBV_QP_SQ_PSN
        }
        Transition::Rts(r) => {
            a.qp_state = s::IBV_QPS_RTS;
            a.sq_psn = r.sq_psn;
            a.timeout = r.timeout;
            a.retry_cnt = r.retry_cnt;
            a.rnr_retry = r.rnr_retry;
            a.max_rd_atomic = r.max_rd_atomic;
            m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC
        }
    };
    // SAFETY: live QP; `a` is a valid attribute struct whose masked fields are set.
    let ret = unsafe { ffi::ibv_modify_qp(qp.qp.as_ptr(), &mut a, mask.0 as i32) };
    check("ibv_modify_qp", ret)
}

/// The queue pair's state, as the device holds it.
pub(super) fn state(qp: &Qp) -> Result<QpState, VerbsError> {
    let a = query_qp(qp, ffi::ibv_qp_attr_mask::IBV_QP_STATE)?;
    Ok(qp_state(a.qp_state))
}

/// The path the queue pair was connected on (RTR and later).
pub(super) fn path(qp: &Qp) -> Result<PathAttr, VerbsError> {
    use ffi::ibv_qp_attr_mask as m;
    let mask = m::IBV_QP_STATE
        | m::IBV_QP_AV
        | m::IBV_QP_PATH_MTU
        | m::IBV_QP_DEST_QPN
        | m::IBV_QP_RQ_PSN
        | m::IBV_QP_SQ_PSN
        | m::IBV_QP_MIN_RNR_TIMER
        | m::IBV_QP_TIMEOUT
        | m::IBV_QP_RETRY_CNT
        | m::IBV_QP_RNR_RETRY;
    let a = query_qp(qp, mask)?;
    // Before RTR (and after a reset) the device holds no path, or a stale one.
    if matches!(qp_state(a.qp_state), QpState::Reset | QpState::Init) {
        return Err(VerbsError::Invalid("the queue pair has no path before RTR"));
    }
    let path_mtu = u8::try_from(a.path_mtu)
        .ok()
        .and_then(Mtu::from_raw)
        .ok_or(VerbsError::Invalid("ibv_query_qp gave no valid path MTU"))?;
    let (ah, grh) = (&a.ah_attr, &a.ah_attr.grh);
    let global = ah.is_global != 0;
    // SAFETY: `raw` is the byte view of the GID union; every bit pattern is valid.
    let dgid = Gid(unsafe { grh.dgid.raw });
    Ok(PathAttr {
        path_mtu,
        dest_qp_num: a.dest_qp_num,
        sq_psn: a.sq_psn,
        rq_psn: a.rq_psn,
        dlid: ah.dlid,
        dgid: global.then_some(dgid),
        sgid_index: if global { grh.sgid_index } else { 0 },
        sl: ah.sl,
        traffic_class: if global { grh.traffic_class } else { 0 },
        flow_label: if global { grh.flow_label } else { 0 },
        hop_limit: if global { grh.hop_limit } else { 0 },
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    })
}

/// `ibv_query_qp` of the attributes in `mask`.
fn query_qp(qp: &Qp, mask: ffi::ibv_qp_attr_mask) -> Result<ffi::ibv_qp_attr, VerbsError> {
    let mut a = ffi::ibv_qp_attr::default();
    let mut init = ffi::ibv_qp_init_attr::default();
    // SAFETY: live QP; `a` and `init` are valid, writable out-structs of the library's
    // layout; the call writes only them.
    let ret = unsafe { ffi::ibv_query_qp(qp.qp.as_ptr(), &mut a, mask.0 as i32, &mut init) };
    check("ibv_query_qp", ret)?;
    Ok(a)
}

fn qp_state(state: ffi::ibv_qp_state::Type) -> QpState {
    use ffi::ibv_qp_state as s;
    match state {
        s::IBV_QPS_RESET => QpState::Reset,
        s::IBV_QPS_INIT => QpState::Init,
        s::IBV_QPS_RTR => QpState::ReadyToReceive,
        s::IBV_QPS_RTS => QpState::ReadyToSend,
        s::IBV_QPS_SQD => QpState::SendQueueDrained,
        s::IBV_QPS_SQE => QpState::SendQueueError,
        _ => QpState::Error,
    }
}
