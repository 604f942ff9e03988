//! Raw verbs through the provider's work request builders (`ibv_wr_*` on the extended
//! queue pair, as `verbs.h`'s inline functions call them): the floor of the path zverbs'
//! RC sends and `sideway` take, where `raw` is the floor of `ibv_post_send`'s. The rig,
//! the poll and the receives are `raw`'s.

use ibverbs_sys as ffi;

pub use super::raw::{measured_blocking, measured_poll, measured_prepared, measured_scope, Rig};

/// `raw`'s rig, whose A zverbs created with builders: checked here, once, for those the
/// loops call.
pub fn setup(dev: &str, gid_index: u8) -> Rig {
    let rig = super::raw::setup(dev, gid_index);
    let q = rig.a_qpx;
    assert!(!q.is_null(), "A is not an extended queue pair");
    // SAFETY: A's extended queue pair, live in the rig.
    let q = unsafe { &*q };
    assert!(
        q.wr_start.is_some()
            && q.wr_complete.is_some()
            && q.wr_send.is_some()
            && q.wr_rdma_write.is_some()
            && q.wr_set_sge.is_some(),
        "A lacks a builder"
    );
    rig
}

/// One of A's builders or setters, called as `verbs.h`'s inline functions call it (no
/// test: `setup` checked it).
macro_rules! call {
    ($q:expr, $f:ident $(, $arg:expr)*) => {{
        let q = $q;
        // SAFETY: `q` is A's extended queue pair, live in the rig, whose `$f` `setup`
        // found present; called as `verbs.h` calls it, inside `ibv_wr_start` ..
        // `ibv_wr_complete`.
        unsafe { (*q).$f.unwrap_unchecked()(q $(, $arg)*) }
    }};
}

/// A's extended queue pair.
fn qpx(rig: &Rig) -> *mut ffi::ibv_qp_ex {
    rig.a_qpx
}

/// The SEND of `raw`'s `measured_post`: one region, its builder and its gather entry.
#[inline(never)]
pub fn measured_post(rig: &mut Rig) {
    let q = qpx(rig);
    call!(q, wr_start);
    // SAFETY: inside the region A's `wr_id` and `wr_flags` are the caller's to write.
    unsafe {
        (*q).wr_id = super::SEND_WR_ID;
        (*q).wr_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    call!(q, wr_send);
    let s = rig.src;
    call!(q, wr_set_sge, s.lkey, s.addr, s.length);
    assert_eq!(call!(q, wr_complete), 0, "ibv_wr_complete");
}

/// `raw`'s batch of writes built in one region, the last signaled.
#[inline(never)]
pub fn measured_batch(rig: &mut Rig) -> bool {
    let q = qpx(rig);
    let (s, (addr, rkey)) = (rig.src, rig.remote);
    call!(q, wr_start);
    for i in 0..super::BATCH {
        // SAFETY: as in `measured_post`.
        unsafe {
            (*q).wr_id = i as u64;
            (*q).wr_flags = if i + 1 == super::BATCH {
                ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
        }
        call!(q, wr_rdma_write, rkey, addr);
        call!(q, wr_set_sge, s.lkey, s.addr, s.length);
    }
    assert_eq!(call!(q, wr_complete), 0, "ibv_wr_complete");
    false
}
