//! The verbs loop's peer rig for sideway 0.4.3: RC queue pairs A → B on one device, set up as its
//! `rc_pingpong` does, posting through the extended QP's guard (`ibv_wr_*`). Its CQs are the
//! basic ones (`ibv_poll_cq` behind `start_poll`, which allocates its batch each call): with
//! `rc_pingpong`'s extended CQs (`ibv_start_poll`) no send completion ever reached A on rxe in
//! the guest, while B's CQ handed out 127 entries for one message.

use std::sync::Arc;

use sideway::ibverbs::address::AddressHandleAttribute;
use sideway::ibverbs::completion::{
    BasicCompletionQueue, PollCompletionQueueError, WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

/// The device port both queue pairs use.
const PORT: u8 = 1;
use super::{BATCH, BUF_LEN, DEPTH, RECV_WR_ID, SEND_WR_ID};

/// Entries asked for in each completion queue.
const CQ_ENTRIES: u32 = super::CQ_ENTRIES as u32;

/// Two RC queue pairs A and B on device `dev`, connected to each other (A -> B), each with a
/// 64-byte registered buffer; A's send completions on A's own CQ, B's receive completions on
/// B's own CQ.
pub struct Rig {
    // Field order is drop order: the QPs go first, then the MRs, then the memory under them.
    a: ExtendedQueuePair,
    b: ExtendedQueuePair,
    a_mr: Arc<MemoryRegion>,
    b_mr: Arc<MemoryRegion>,
    a_buf: Box<[u8]>,
    b_buf: Box<[u8]>,
    a_cq: Arc<BasicCompletionQueue>,
    b_cq: Arc<BasicCompletionQueue>,
    _pd: Arc<ProtectionDomain>,
    _ctx: Arc<DeviceContext>,
}

/// Builds the rig on `dev` (e.g. "rxe0"), GID index `gid_index` (1 on rxe), port 1. Panics with
/// a clear message on any setup failure (setup is not measured).
///
/// The address vector is global: source GID index `gid_index` on port 1, destination the same
/// port's GID at `gid_index` (both QPs are on it), hop limit 1, DLID the port's LID.
pub fn setup(dev: &str, gid_index: u8) -> Rig {
    let list = DeviceList::new().unwrap_or_else(|e| panic!("sideway: listing RDMA devices: {e:?}"));
    let device = list
        .iter()
        .find(|d| d.name() == dev)
        .unwrap_or_else(|| panic!("sideway: no RDMA device named {dev:?}"));
    let ctx = device
        .open()
        .unwrap_or_else(|e| panic!("sideway: opening {dev}: {e:?}"));

    let port = ctx
        .query_port(PORT)
        .unwrap_or_else(|e| panic!("sideway: querying {dev} port {PORT}: {e:?}"));
    let state = port.port_state();
    assert!(
        state == PortState::Active,
        "sideway: {dev} port {PORT} is {state:?}, not Active"
    );
    let gid = ctx
        .query_gid(PORT, gid_index.into())
        .unwrap_or_else(|e| panic!("sideway: {dev} port {PORT} GID index {gid_index}: {e:?}"));
    assert!(
        !gid.is_zero(),
        "sideway: {dev} port {PORT} has no GID at index {gid_index} (all zeroes)"
    );

    let pd = ctx
        .alloc_pd()
        .unwrap_or_else(|e| panic!("sideway: protection domain on {dev}: {e:?}"));
    let cq = |who: &str| {
        ctx.create_cq_builder()
            .setup_cqe(CQ_ENTRIES)
            .build()
            .unwrap_or_else(|e| panic!("sideway: {who}'s CQ on {dev}: {e:?}"))
    };
    let (a_cq, b_cq) = (cq("A"), cq("B"));
    let qp = |cq: &Arc<BasicCompletionQueue>, who: &str| {
        pd.create_qp_builder()
            .setup_send_cq(Arc::clone(cq))
            .setup_recv_cq(Arc::clone(cq))
            .setup_max_send_wr(DEPTH)
            .setup_max_recv_wr(DEPTH)
            .build_ex()
            .unwrap_or_else(|e| panic!("sideway: creating QP {who} on {dev}: {e:?}"))
    };
    let (mut a, mut b) = (qp(&a_cq, "A"), qp(&b_cq, "B"));
    let (a_qpn, b_qpn) = (a.qp_number(), b.qp_number());

    let connect = |qp: &mut ExtendedQueuePair, remote_qpn: u32, who: &str| {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(PORT)
            .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
        qp.modify(&attr)
            .unwrap_or_else(|e| panic!("sideway: QP {who} to INIT: {e:?}"));

        let mut av = AddressHandleAttribute::new();
        av.setup_dest_lid(port.lid())
            .setup_port(PORT)
            .setup_service_level(0)
            .setup_grh_src_gid_index(gid_index)
            .setup_grh_dest_gid(&gid)
            .setup_grh_hop_limit(1);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(Mtu::Mtu1024)
            .setup_dest_qp_num(remote_qpn)
            .setup_rq_psn(0)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&av);
        qp.modify(&attr)
            .unwrap_or_else(|e| panic!("sideway: QP {who} to RTR (GID index {gid_index}): {e:?}"));

        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(0)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(1);
        qp.modify(&attr)
            .unwrap_or_else(|e| panic!("sideway: QP {who} to RTS: {e:?}"));
    };
    connect(&mut a, b_qpn, "A");
    connect(&mut b, a_qpn, "B");

    let mut a_buf = vec![0u8; BUF_LEN].into_boxed_slice();
    let mut b_buf = vec![0u8; BUF_LEN].into_boxed_slice();
    let mr = |buf: &mut [u8], who: &str| {
        // SAFETY: the buffer is heap memory owned by the rig, which drops it only after this
        // MR (field order), so the registration never outlives the memory it covers.
        unsafe {
            pd.reg_mr(
                buf.as_mut_ptr() as usize,
                buf.len(),
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite,
            )
        }
        .unwrap_or_else(|e| panic!("sideway: registering {who}'s buffer: {e:?}"))
    };
    let (a_mr, b_mr) = (mr(&mut a_buf, "A"), mr(&mut b_buf, "B"));

    Rig {
        a,
        b,
        a_mr,
        b_mr,
        a_buf,
        b_buf,
        a_cq,
        b_cq,
        _pd: pd,
        _ctx: ctx,
    }
}

impl Rig {
    /// Posts one receive of 64 bytes on B (not measured).
    pub fn refill(&mut self) {
        let mut guard = self.b.start_post_recv();
        let wr = guard.construct_wr(RECV_WR_ID);
        // SAFETY: B's buffer is covered by `b_mr`, both live in the rig until after QP B is
        // destroyed (field order), and the program never reads or writes it, so the device may
        // write it until the completion is taken.
        unsafe {
            wr.setup_sge(
                self.b_mr.lkey(),
                self.b_buf.as_mut_ptr() as u64,
                BUF_LEN as u32,
            )
        };
        guard
            .post()
            .unwrap_or_else(|e| panic!("sideway: post_recv on B: {e:?}"));
    }

    /// Takes B's receive completions, asserting each succeeded; returns how many (not measured).
    pub fn drain(&mut self) -> usize {
        match self.b_cq.start_poll() {
            Ok(poller) => {
                let mut taken = 0;
                for wc in poller {
                    let status = wc.status();
                    assert!(
                        status == WorkCompletionStatus::Success as u32,
                        "sideway: receive on B failed: {:?}, vendor error {:#x}",
                        WorkCompletionStatus::from(status),
                        wc.vendor_err()
                    );
                    taken += 1;
                }
                taken
            }
            Err(PollCompletionQueueError::CompletionQueueEmpty) => 0,
            Err(e) => panic!("sideway: polling B's CQ: {e:?}"),
        }
    }
}

/// The measured post: one signaled 64-byte SEND (not inline) from A's buffer to B, wr_id 1.
#[inline(never)]
pub fn measured_post(rig: &mut Rig) {
    let mut guard = rig.a.start_post_send();
    let wr = guard
        .construct_wr(SEND_WR_ID, WorkRequestFlags::Signaled)
        .setup_send();
    // SAFETY: A's buffer is covered by `a_mr`, both live in the rig until after QP A is
    // destroyed (field order), and the program never writes it, so it stays valid and unchanged
    // until the SEND's completion is taken.
    unsafe { wr.setup_sge(rig.a_mr.lkey(), rig.a_buf.as_ptr() as u64, BUF_LEN as u32) };
    if let Err(e) = guard.post() {
        panic!("sideway: post_send on A: {e:?}");
    }
}

/// The measured poll: polls A's send CQ once for at most one completion; true if it took one
/// (panics if its status is not success).
#[inline(never)]
pub fn measured_poll(rig: &mut Rig) -> bool {
    match rig.a_cq.start_poll() {
        // `ibv_start_poll` took the completion; the first `next` hands it out without polling
        // again, and dropping the poller ends the poll (`ibv_end_poll`).
        Ok(mut poller) => match poller.next() {
            Some(wc) => {
                let status = wc.status();
                if status != WorkCompletionStatus::Success as u32 {
                    panic!(
                        "sideway: SEND on A failed: {:?}, vendor error {:#x}",
                        WorkCompletionStatus::from(status),
                        wc.vendor_err()
                    );
                }
                true
            }
            None => false,
        },
        Err(PollCompletionQueueError::CompletionQueueEmpty) => false,
        Err(e) => panic!("sideway: polling A's CQ: {e:?}"),
    }
}

/// The measured batch: `BATCH` RDMA WRITEs of A's buffer into B's under one guard (one
/// doorbell, `ibv_wr_complete`), only the last signaled.
#[inline(never)]
pub fn measured_batch(rig: &mut Rig) -> bool {
    let (rkey, remote) = (rig.b_mr.rkey(), rig.b_buf.as_ptr() as u64);
    let mut guard = rig.a.start_post_send();
    for i in 0..BATCH {
        let flags = if i + 1 == BATCH {
            WorkRequestFlags::Signaled
        } else {
            WorkRequestFlags::none()
        };
        let wr = guard
            .construct_wr(i as u64, flags)
            .setup_write(rkey, remote);
        // SAFETY: as in `measured_post`; B's buffer is covered by `b_mr` (remote write) and
        // never read or written by the program.
        unsafe { wr.setup_sge(rig.a_mr.lkey(), rig.a_buf.as_ptr() as u64, BUF_LEN as u32) };
    }
    if let Err(e) = guard.post() {
        panic!("sideway: post of a batch on A: {e:?}");
    }
    false
}

/// No scopes in sideway.
pub fn measured_scope(_: &mut Rig) -> bool {
    panic!("scope: zverbs only")
}

/// No batches built once in `sideway`.
pub fn measured_prepared(_: &mut Rig) -> bool {
    panic!("prepared: zverbs only")
}

/// No blocking calls in sideway.
pub fn measured_blocking(_: &mut Rig) -> bool {
    panic!("blocking: zverbs only")
}
