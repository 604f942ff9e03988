//! Test helpers: owned buffers, WR builders and a connected pair of queue pairs.
#![allow(dead_code)]

use zverbs_sim::*;

/// Heap memory handed to the simulator by raw pointer and inspected by copying out.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Buf` owns its allocation like a `Box<[u8]>`.
unsafe impl Send for Buf {}

impl Buf {
    /// `len` bytes, each `fill`, 8-byte aligned.
    pub fn new(len: usize, fill: u8) -> Buf {
        let ptr = Box::into_raw(vec![0u64; len.div_ceil(8).max(1)].into_boxed_slice());
        let b = Buf {
            ptr: ptr.cast::<u8>(),
            len,
        };
        b.set(0, &vec![fill; len]);
        b
    }

    /// Address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    /// Registers the whole buffer.
    pub fn reg(&self, pd: &Pd, access: AccessFlags) -> Mr {
        // SAFETY: the buffer outlives the MR in every test (declared before it) and is only
        // accessed through raw pointers.
        unsafe { pd.register_mr(self.ptr, self.len, access) }.expect("register")
    }

    /// A copy of the contents.
    pub fn get(&self) -> Vec<u8> {
        // SAFETY: `ptr..ptr+len` is our live allocation; no simulator work runs concurrently
        // with the calling test thread's inspection.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }

    /// Overwrites bytes from `off`.
    pub fn set(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds (checked), our live allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let words = self.len.div_ceil(8).max(1);
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.cast::<u64>(), words);
        // SAFETY: allocated as a `Box<[u64]>` of `words` elements in `new`, freed once here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// An SGE over `len` bytes of `mr` from offset `off`.
pub fn sge(mr: &Mr, off: usize, len: u32) -> Sge {
    Sge {
        addr: mr.addr() + off as u64,
        length: len,
        lkey: mr.lkey(),
    }
}

/// A send WR, with room for the most entries a device allows.
pub fn swr(wr_id: u64, op: SendOp, sges: &[Sge], flags: SendFlags) -> SendWr<MAX_SGE> {
    let mut wr = SendWr::new(wr_id, op, flags);
    wr.sg_list[..sges.len()].copy_from_slice(sges);
    wr.num_sge = sges.len() as u8;
    wr
}

/// A signaled send WR.
pub fn sig(wr_id: u64, op: SendOp, sges: &[Sge]) -> SendWr<MAX_SGE> {
    swr(wr_id, op, sges, SendFlags::SIGNALED)
}

/// A receive WR, with room for the most entries a device allows.
pub fn rwr(wr_id: u64, sges: &[Sge]) -> RecvWr<MAX_SGE> {
    let mut wr = RecvWr::new(wr_id);
    wr.sg_list[..sges.len()].copy_from_slice(sges);
    wr.num_sge = sges.len() as u8;
    wr
}

/// A placeholder completion for poll buffers.
pub fn blank_wc() -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: WcStatus::GeneralErr,
        opcode: WcOpcode::Send,
        byte_len: 0,
        ..WorkCompletion::EMPTY
    }
}

/// Every completion currently in `cq`.
pub fn drain(cq: &Cq) -> Vec<WorkCompletion> {
    try_drain(cq).expect("poll")
}

/// Every completion currently in `cq`, or the error polling met.
pub fn try_drain(cq: &Cq) -> Result<Vec<WorkCompletion>, SimError> {
    let mut all = Vec::new();
    let mut wc = [blank_wc(); 4];
    loop {
        let n = cq.poll(&mut wc)?;
        all.extend_from_slice(&wc[..n]);
        if n < wc.len() {
            return Ok(all);
        }
    }
}

/// The one completion in `cq` (panics unless exactly one).
pub fn one(cq: &Cq) -> WorkCompletion {
    let all = drain(cq);
    assert_eq!(all.len(), 1, "expected one completion, got {all:?}");
    all[0]
}

/// Knobs of [`pair_with`].
#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    /// Caps of both QPs.
    pub cap: QpCaps,
    /// Depth of each side's CQ.
    pub cq_depth: u32,
    /// Remote access both QPs grant.
    pub access: AccessFlags,
    /// `max_dest_rd_atomic` of both QPs.
    pub max_dest_rd_atomic: u8,
    /// `sq_sig_all` of both QPs.
    pub sig_all: bool,
}

impl Default for Cfg {
    fn default() -> Self {
        Cfg {
            cap: QpCaps {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            cq_depth: 64,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            max_dest_rd_atomic: 4,
            sig_all: false,
        }
    }
}

/// One end of a connection: device context, PD, one CQ for sends and receives, QP.
pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
}

/// Two connected QPs on devices `sim0` (a) and `sim1` (b).
pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub fabric: Fabric,
}

/// A side on `dev`, in RESET.
pub fn side(fabric: &Fabric, dev: &str, cfg: &Cfg) -> Side {
    let ctx = fabric.open_device(dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(cfg.cq_depth).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: cfg.cap,
            sq_sig_all: cfg.sig_all,
        })
        .unwrap();
    Side { ctx, pd, cq, qp }
}

/// INIT attributes granting `access`.
pub fn init_attr(access: AccessFlags) -> InitAttr {
    InitAttr {
        port: 1,
        pkey_index: 0,
        access,
    }
}

/// RTR attributes towards `dest_qp_num` at `dlid`.
pub fn rtr_attr(dest_qp_num: u32, dlid: u16, max_dest_rd_atomic: u8) -> RtrAttr {
    RtrAttr {
        path_mtu: Mtu::Mtu4096,
        dest_qp_num,
        rq_psn: 0,
        max_dest_rd_atomic,
        min_rnr_timer: 12,
        dlid,
        dgid: None,
        sgid_index: 0,
        port: 1,
        sl: 0,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
    }
}

/// RTS attributes.
pub fn rts_attr() -> RtsAttr {
    RtsAttr {
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
    }
}

/// Brings `qp` to RTS towards `rtr`.
pub fn connect(qp: &Qp, access: AccessFlags, rtr: RtrAttr) {
    qp.modify(&Transition::Init(init_attr(access))).unwrap();
    qp.modify(&Transition::Rtr(rtr)).unwrap();
    qp.modify(&Transition::Rts(rts_attr())).unwrap();
}

/// A connected pair with `cfg`.
pub fn pair_with(cfg: Cfg) -> Pair {
    let fabric = Fabric::with_devices(2);
    let a = side(&fabric, "sim0", &cfg);
    let b = side(&fabric, "sim1", &cfg);
    let (la, lb) = (lid(&a), lid(&b));
    let rd = cfg.max_dest_rd_atomic;
    connect(&a.qp, cfg.access, rtr_attr(b.qp.qp_num(), lb, rd));
    connect(&b.qp, cfg.access, rtr_attr(a.qp.qp_num(), la, rd));
    Pair { a, b, fabric }
}

/// A connected pair with the default [`Cfg`].
pub fn pair() -> Pair {
    pair_with(Cfg::default())
}

/// LID of a side's device.
pub fn lid(s: &Side) -> u16 {
    s.ctx.query_port(1).unwrap().lid
}

/// All remote and local access.
pub fn all_access() -> AccessFlags {
    AccessFlags::all()
}

/// Brings `qp` to RTS towards `rtr` with `rts`.
pub fn connect_with(qp: &Qp, access: AccessFlags, rtr: RtrAttr, rts: RtsAttr) {
    qp.modify(&Transition::Init(init_attr(access))).unwrap();
    qp.modify(&Transition::Rtr(rtr)).unwrap();
    qp.modify(&Transition::Rts(rts)).unwrap();
}

/// A connected pair on devices `sim0` (a) and `sim1` (b) of `fabric`, both with `rts`.
pub fn pair_in(fabric: Fabric, cfg: Cfg, rts: RtsAttr) -> Pair {
    let a = side(&fabric, "sim0", &cfg);
    let b = side(&fabric, "sim1", &cfg);
    let (la, lb) = (lid(&a), lid(&b));
    let rd = cfg.max_dest_rd_atomic;
    connect_with(&a.qp, cfg.access, rtr_attr(b.qp.qp_num(), lb, rd), rts);
    connect_with(&b.qp, cfg.access, rtr_attr(a.qp.qp_num(), la, rd), rts);
    Pair { a, b, fabric }
}

/// A stepped fabric of `n` devices with `seed`, `faults` and the trace on.
pub fn stepped(seed: u64, faults: Faults, n: usize) -> Fabric {
    let cfg = FabricConfig {
        faults,
        trace: true,
        ..FabricConfig::stepped(seed)
    };
    Fabric::with_config(cfg, n)
}

/// The fabric's trace as Chrome JSON.
pub fn trace_json(f: &Fabric) -> String {
    let mut out = Vec::new();
    f.write_chrome_trace(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// How many trace events are called `name`.
pub fn count(json: &str, name: &str) -> usize {
    json.matches(&format!("{{\"name\":\"{name}\",")).count()
}

/// (wr_id, status) of each completion.
pub fn ids(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}
