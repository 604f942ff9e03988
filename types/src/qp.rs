//! Queue pairs: states, capacities and the transitions between states.

use crate::{AccessFlags, Gid, Mtu};

/// Queue pair state (`ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Freshly created or reset; holds no work.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    ReadyToReceive,
    /// Ready to send.
    ReadyToSend,
    /// Send queue drained.
    SendQueueDrained,
    /// Send queue error.
    SendQueueError,
    /// Error: all work is flushed; only a reset leaves this state.
    Error,
}

/// Capacities of a queue pair (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Gather entries per send.
    pub max_send_sge: u32,
    /// Scatter entries per receive.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline_data: u32,
}

/// The size and limit of a shared receive queue (`ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receives it holds at most (a device may grant more than asked).
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// The limit: `SRQ_LIMIT_REACHED` is raised once when a receive taken leaves fewer
    /// than this many; 0 when not armed (after the event, the device disarms it).
    pub srq_limit: u32,
}

/// Attributes of the RESET → INIT transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    /// Physical port (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote operations the queue pair accepts as responder.
    pub access: AccessFlags,
}

/// Attributes of the INIT → RTR transition: the path to the peer and the receive side's
/// limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The peer's queue pair number (< 2^24).
    pub dest_qp_num: u32,
    /// First packet sequence number expected from the peer (< 2^24).
    pub rq_psn: u32,
    /// Reads and atomics accepted in flight as responder (0 refuses them).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (0..=31).
    pub min_rnr_timer: u8,
    /// The peer's LID.
    pub dlid: u16,
    /// The peer's GID, when routing by GID (RoCE, or across subnets).
    pub dgid: Option<Gid>,
    /// Local GID index used for the path.
    pub sgid_index: u8,
    /// Local port.
    pub port: u8,
    /// Service level (0..=15): the lane on InfiniBand, the priority on RoCE.
    pub sl: u8,
    /// Traffic class of the GRH (on RoCE v2 the IP DSCP and ECN bits). Used with `dgid`.
    pub traffic_class: u8,
    /// Flow label of the GRH (20 bits). Used with `dgid`.
    pub flow_label: u32,
    /// Hop limit of the GRH (on RoCE v2 the IP TTL). Used with `dgid`.
    pub hop_limit: u8,
}

/// Attributes of the RTR → RTS transition: the requester's reliability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// First packet sequence number sent (< 2^24).
    pub sq_psn: u32,
    /// ACK timeout code: 4.096 µs × 2^timeout (0..=31; 0 = infinite).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// Reads and atomics in flight as requester.
    pub max_rd_atomic: u8,
}

/// A queue pair state transition (`ibv_modify_qp` with the mask it implies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Any state → RESET: outstanding work is discarded without completions.
    Reset,
    /// RESET (or INIT) → INIT.
    Init(InitAttr),
    /// INIT → RTR.
    Rtr(RtrAttr),
    /// RTR (or RTS) → RTS.
    Rts(RtsAttr),
    /// Any state → ERR: outstanding work is flushed with `WR_FLUSH_ERR`.
    Error,
    /// An unreliable-datagram queue pair's RESET (or INIT) → INIT: its port, partition
    /// and the Q_Key its receives accept (`IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY`).
    InitUd(UdInitAttr),
    /// An unreliable-datagram queue pair's INIT → RTR: no destination, a datagram names
    /// its own.
    RtrUd,
    /// An unreliable-datagram queue pair's RTR (or RTS) → RTS.
    RtsUd {
        /// PSN of its first packet.
        sq_psn: u32,
    },
}

/// A queue pair's transport (`ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`): one peer, acknowledged, in order.
    Rc,
    /// Unreliable datagram (`IBV_QPT_UD`): any peer per message, one packet each, no
    /// acknowledgement, no retransmission.
    Ud,
}

/// Attributes of an unreliable-datagram queue pair's RESET → INIT transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdInitAttr {
    /// Port number (1-based).
    pub port: u8,
    /// P_Key table index.
    pub pkey_index: u16,
    /// The Q_Key a datagram must carry to be accepted (and what sends carry when their
    /// `remote_qkey` has the high bit set).
    pub qkey: u32,
}

/// The largest [`AhAttr::static_rate`]: `IBV_RATE_1200_GBPS`.
pub const MAX_STATIC_RATE: u8 = 24;

/// Where an address handle leads (`ibv_ah_attr`): a port, a LID, and a global route
/// (GRH) when `dgid` is set, as RoCE always needs and an InfiniBand subnet does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Port number (1-based).
    pub port: u8,
    /// The destination's GID: the global route's (`is_global`); `None` routes by `dlid`
    /// alone, which only InfiniBand can (a RoCE device refuses such a handle).
    pub dgid: Option<Gid>,
    /// The local GID table index to send from (with a global route).
    pub sgid_index: u8,
    /// Destination LID (ignored on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// The most the handle's datagrams may be sent at (`enum ibv_rate`: 0 for the port's
    /// full rate, 2 for 2.5 Gb/s, 3 for 10 Gb/s, ... 24 for 1,200 Gb/s). Devices that pace
    /// by it do; rxe and the simulator keep it and send at their own pace.
    pub static_rate: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH flow label (20 bits).
    pub flow_label: u32,
    /// GRH hop limit.
    pub hop_limit: u8,
}

impl AhAttr {
    /// A global route to `dgid` (and `dlid`, for InfiniBand) from port `port` and the
    /// local GID at `sgid_index`: service level 0, full rate, traffic class 0, no flow
    /// label, hop limit 64.
    pub const fn new(port: u8, dgid: Gid, sgid_index: u8, dlid: u16) -> AhAttr {
        AhAttr {
            dgid: Some(dgid),
            sgid_index,
            ..AhAttr::local(port, dlid)
        }
    }

    /// A route to `dlid` within the InfiniBand subnet of port `port`, without a global
    /// route header: service level 0, full rate.
    pub const fn local(port: u8, dlid: u16) -> AhAttr {
        AhAttr {
            port,
            dgid: None,
            sgid_index: 0,
            dlid,
            sl: 0,
            static_rate: 0,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    }
}
