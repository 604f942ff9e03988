//! Devices: the limits and capabilities `ibv_query_device` reports.

/// How a device executes remote atomics (`ibv_device_attr.atomic_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`: no atomic operations; zverbs refuses to post one.
    None,
    /// `IBV_ATOMIC_HCA`: atomic against every other atomic through this device.
    #[default]
    Hca,
    /// `IBV_ATOMIC_GLOB`: atomic also against the host CPU's own atomics on the word.
    Glob,
}

impl AtomicCap {
    /// Whether atomic operations may be posted at all.
    pub const fn supported(self) -> bool {
        !matches!(self, AtomicCap::None)
    }
}

/// Device attributes (`ibv_device_attr`, the fields zverbs checks configurations against).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Most work requests one queue of a queue pair may hold (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Most scatter/gather entries of one work request (`max_sge`).
    pub max_sge: u32,
    /// Deepest completion queue (`max_cqe`).
    pub max_cqe: u32,
    /// Most RDMA READs and atomics a queue pair may have outstanding as responder
    /// (`max_qp_rd_atom`: the limit of `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// The same as requester (`max_qp_init_rd_atom`: the limit of `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Largest memory registration (`max_mr_size`).
    pub max_mr_size: u64,
    /// How remote atomics are executed.
    pub atomic_cap: AtomicCap,
    /// Most shared receive queues (`max_srq`; 0: the device has none).
    pub max_srq: u32,
    /// Most receives one shared receive queue may hold (`max_srq_wr`).
    pub max_srq_wr: u32,
    /// Most scatter entries of one receive on a shared receive queue (`max_srq_sge`).
    pub max_srq_sge: u32,
    /// Whether the device registers dmabufs (`ibv_reg_dmabuf_mr`: an accelerator's
    /// memory, GPUDirect RDMA). Verbs has no attribute for it: the verbs backend asks the
    /// device's provider library when the device is opened.
    pub dmabuf: bool,
}
