//! The verbs loop's peer rig for rust-ibverbs (`ibverbs` 0.9.2): RC queue pairs A → B on one
//! device, joined by the crate's `endpoint`/`handshake`; `post_send` and `poll` are measured.

use ibverbs::{ibv_access_flags, ibv_qp_type, ibv_wc, CompletionQueue, MemoryRegion, QueuePair};

use super::{BUF_LEN, DEPTH, RECV_WR_ID, SEND_WR_ID};

/// Entries asked for in each completion queue.
const CQ_ENTRIES: i32 = super::CQ_ENTRIES as i32;
/// `IBV_MTU_1024` (the crate takes the raw `enum ibv_mtu` value).
const PATH_MTU_1024: u32 = 3;

/// Two RC queue pairs A and B on device `dev`, connected to each other (A -> B), each with a
/// 64-byte registered buffer; A's send completions on A's own CQ, B's receive completions on
/// B's own CQ.
///
/// The crate ties QPs to borrowed CQs and PD (and those to a borrowed `Context`), so an owning
/// struct cannot hold them all without `unsafe`: [`setup`] leaks the context, PD and the two CQs
/// for the process's life (one rig per process in the loop). The QPs and MRs drop with the rig.
pub struct Rig {
    // Field order is drop order: the QPs are destroyed before the MRs they may reference.
    a: QueuePair<'static>,
    b: QueuePair<'static>,
    a_mr: MemoryRegion<u8>,
    b_mr: MemoryRegion<u8>,
    a_cq: &'static CompletionQueue<'static>,
    b_cq: &'static CompletionQueue<'static>,
    /// Room for the one completion [`measured_poll`] takes.
    wc: [ibv_wc; 1],
    /// Room for [`Rig::drain`]'s completions.
    drained: [ibv_wc; DEPTH as usize],
}

/// Builds the rig on `dev` (e.g. "rxe0"), GID index `gid_index` (1 on rxe), port 1. Panics with
/// a clear message on any setup failure (setup is not measured).
///
/// Port: ibverbs 0.9.2 always uses port 1 (its `PORT_NUM`, not configurable). GID: selected with
/// `QueuePairBuilder::set_gid_index`, which the crate resolves by position in its table of the
/// port's *valid* GID entries; the set-up checks that position `gid_index` is GID index
/// `gid_index`. The handshake routes globally with hop limit 0xff and SQ PSN 0 (fixed by the
/// crate); everything else is set as in `peer_sideway`.
pub fn setup(dev: &str, gid_index: u8) -> Rig {
    let devices =
        ibverbs::devices().unwrap_or_else(|e| panic!("ibverbs: listing RDMA devices: {e}"));
    let device = devices
        .iter()
        .find(|d| d.name().is_some_and(|n| n.to_bytes() == dev.as_bytes()))
        .unwrap_or_else(|| panic!("ibverbs: no RDMA device named {dev:?}"));
    let ctx: &'static ibverbs::Context =
        Box::leak(Box::new(device.open().unwrap_or_else(|e| {
            panic!("ibverbs: opening {dev} (port 1 must be ACTIVE): {e}")
        })));

    let gid = u32::from(gid_index);
    let table = ctx.gid_table();
    match table.get(gid as usize) {
        Some(entry) if entry.gid_index == gid => {}
        Some(entry) => panic!(
            "ibverbs: {dev} port 1 has holes in its GID table: ibverbs 0.9.2 takes position \
             {gid} of its valid entries, which is GID index {}, not {gid}",
            entry.gid_index
        ),
        None => panic!(
            "ibverbs: {dev} port 1 has no GID at index {gid} ({} valid entries)",
            table.len()
        ),
    }

    let pd: &'static ibverbs::ProtectionDomain<'static> =
        Box::leak(Box::new(ctx.alloc_pd().unwrap_or_else(|e| {
            panic!("ibverbs: protection domain on {dev}: {e}")
        })));
    let cq = |who: &str| -> &'static CompletionQueue<'static> {
        Box::leak(Box::new(
            ctx.create_cq(CQ_ENTRIES, 0)
                .unwrap_or_else(|e| panic!("ibverbs: {who}'s CQ on {dev}: {e}")),
        ))
    };
    let (a_cq, b_cq) = (cq("A"), cq("B"));

    let prepare = |cq: &'static CompletionQueue<'static>, who: &str| {
        pd.create_qp(cq, cq, ibv_qp_type::IBV_QPT_RC)
            .set_gid_index(gid)
            .set_max_send_wr(DEPTH)
            .set_max_recv_wr(DEPTH)
            .set_access(
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
            )
            .set_path_mtu(PATH_MTU_1024)
            .set_rq_psn(0)
            .set_timeout(14)
            .set_retry_count(7)
            .set_rnr_retry(7)
            .set_max_rd_atomic(1)
            .set_max_dest_rd_atomic(1)
            .set_min_rnr_timer(12)
            .build()
            .unwrap_or_else(|e| panic!("ibverbs: creating QP {who} on {dev}: {e}"))
    };
    let (pa, pb) = (prepare(a_cq, "A"), prepare(b_cq, "B"));
    let (ea, eb) = (pa.endpoint(), pb.endpoint());
    let a = pa
        .handshake(eb)
        .unwrap_or_else(|e| panic!("ibverbs: connecting A to B (GID index {gid}): {e}"));
    let b = pb
        .handshake(ea)
        .unwrap_or_else(|e| panic!("ibverbs: connecting B to A (GID index {gid}): {e}"));

    let mr = |who: &str| {
        pd.allocate::<u8>(BUF_LEN)
            .unwrap_or_else(|e| panic!("ibverbs: registering {who}'s buffer: {e}"))
    };
    Rig {
        a,
        b,
        a_mr: mr("A"),
        b_mr: mr("B"),
        a_cq,
        b_cq,
        wc: [ibv_wc::default(); 1],
        drained: [ibv_wc::default(); DEPTH as usize],
    }
}

impl Rig {
    /// Posts one receive of 64 bytes on B (not measured).
    pub fn refill(&mut self) {
        // SAFETY: B's MR lives in the rig and is dropped only after QP B is destroyed (field
        // order), and the program never reads or writes its bytes, so the device may write them
        // until the completion is taken.
        unsafe { self.b.post_receive(&mut self.b_mr, .., RECV_WR_ID) }
            .unwrap_or_else(|e| panic!("ibverbs: post_receive on B: {e}"));
    }

    /// Takes B's receive completions, asserting each succeeded; returns how many (not measured).
    pub fn drain(&mut self) -> usize {
        let mut taken = 0;
        loop {
            let got = self
                .b_cq
                .poll(&mut self.drained)
                .unwrap_or_else(|e| panic!("ibverbs: polling B's CQ: {e}"));
            for wc in got.iter() {
                if let Some((status, vendor_err)) = wc.error() {
                    panic!("ibverbs: receive on B failed: status {status}, vendor {vendor_err:#x}");
                }
            }
            taken += got.len();
            if got.len() < self.drained.len() {
                return taken;
            }
        }
    }
}

/// The measured post: one signaled 64-byte SEND (not inline) from A's buffer to B, wr_id 1.
#[inline(never)]
pub fn measured_post(rig: &mut Rig) {
    // SAFETY: A's MR lives in the rig and is dropped only after QP A is destroyed (field
    // order), and the program never writes its bytes, so it stays valid and unchanged until the
    // SEND's completion is taken.
    if let Err(e) = unsafe { rig.a.post_send(&mut rig.a_mr, .., SEND_WR_ID) } {
        panic!("ibverbs: post_send on A: {e}");
    }
}

/// The measured poll: polls A's send CQ once for at most one completion; true if it took one
/// (panics if its status is not success).
#[inline(never)]
pub fn measured_poll(rig: &mut Rig) -> bool {
    let done = match rig.a_cq.poll(&mut rig.wc) {
        Ok(done) => done,
        Err(e) => panic!("ibverbs: polling A's CQ: {e}"),
    };
    match done.first() {
        None => false,
        Some(wc) => {
            if let Some((status, vendor_err)) = wc.error() {
                panic!("ibverbs: SEND on A failed: status {status}, vendor error {vendor_err:#x}");
            }
            true
        }
    }
}

/// `ibverbs` 0.9.2 has SEND but no RDMA WRITE, and no chained posts: no batch.
pub fn measured_batch(_: &mut Rig) -> bool {
    panic!("batch: ibverbs 0.9.2 has no RDMA WRITE")
}

/// No scopes in `ibverbs`.
pub fn measured_scope(_: &mut Rig) -> bool {
    panic!("scope: zverbs only")
}

/// No batches built once in `ibverbs`.
pub fn measured_prepared(_: &mut Rig) -> bool {
    panic!("prepared: zverbs only")
}

/// No blocking calls in `ibverbs`.
pub fn measured_blocking(_: &mut Rig) -> bool {
    panic!("blocking: zverbs only")
}
