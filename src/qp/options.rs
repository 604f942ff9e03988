//! What a queue pair is created and moved through its states with: plain settings with
//! defaults, checked at the transition that applies them.

use crate::types::{AccessFlags, Mtu, QpCaps};

/// Creation settings of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Queue capacities.
    pub caps: QpCaps,
    /// Physical port (1-based).
    pub port: u8,
    /// GID table index used for addressing (the path's `sgid_index`; on RoCE choose it with
    /// `Verbs::select_gid`).
    pub gid_index: u8,
    /// First packet sequence number; `None` derives one from the queue pair number.
    pub psn: Option<u32>,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            port: 1,
            gid_index: 0,
            psn: None,
        }
    }
}

/// Attributes of RESET → INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitOptions {
    /// Remote operations accepted as responder.
    pub access: AccessFlags,
    /// P_Key index.
    pub pkey_index: u16,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            pkey_index: 0,
        }
    }
}

/// The largest flow label (20 bits).
pub const MAX_FLOW_LABEL: u32 = (1 << 20) - 1;

/// The largest service level.
pub const MAX_SL: u8 = 15;

/// Attributes of INIT → RTR besides the peer's endpoint: the receive side's limits and the
/// address vector of the path (`ibv_qp_attr.ah_attr`).
///
/// The MTU used is [`mtu`](Self::mtu) if given, else the smaller of the local port's and
/// the peer's; [`QueuePair::path`](super::QueuePair::path) reads back what the device applied. Every limit is
/// checked against the device first: [`Error::ExceedsDevice`](crate::Error::ExceedsDevice) names the field. The GRH fields
/// (`traffic_class`, `flow_label`, `hop_limit`) are sent when the path is routed by GID,
/// which is whenever the peer's endpoint carries a GID (always on RoCE).
///
/// ```
/// use zverbs::qp::RtrOptions;
/// // A C program's `ah_attr.sl = 3; ah_attr.grh.traffic_class = 106;` (DSCP 26, ECT(0)).
/// let opts = RtrOptions { sl: 3, traffic_class: 106, ..RtrOptions::default() };
/// assert_eq!(opts.hop_limit, 64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrOptions {
    /// The path MTU. `None` (the default) takes the largest both ends can use: the
    /// smaller of the local port's active MTU and the one the peer's endpoint names.
    /// `Some(mtu)` asks for exactly `mtu`, as a C program's `path_mtu` does; more than
    /// either port's active MTU is refused ([`Error::ExceedsDevice`](crate::Error::ExceedsDevice)), not lowered, so
    /// that the two ends of a path never run different MTUs.
    pub mtu: Option<Mtu>,
    /// RNR NAK timer code sent to a peer whose send finds no receive (0..=31; 12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Reads and atomics accepted in flight as responder.
    pub max_dest_rd_atomic: u8,
    /// Service level (0..=[`MAX_SL`]): the virtual lane on InfiniBand, the priority (PCP)
    /// on RoCE. Default 0. Soft-RoCE (`rxe`) does not keep it: its path reads back SL 0.
    pub sl: u8,
    /// Traffic class of the GRH: on RoCE v2 the IP DSCP (upper six bits) and ECN (lower
    /// two). Default 0.
    pub traffic_class: u8,
    /// Flow label of the GRH (0..=[`MAX_FLOW_LABEL`]); on RoCE v2 devices may derive the
    /// UDP source port from it. Default 0.
    pub flow_label: u32,
    /// Hop limit of the GRH: on RoCE v2 the IP TTL. Default 64. On RoCE, Linux resolves
    /// the path through the IP stack and uses the route's hop limit instead;
    /// [`QueuePair::path`](super::QueuePair::path) shows the one in use.
    pub hop_limit: u8,
}

impl Default for RtrOptions {
    fn default() -> Self {
        RtrOptions {
            mtu: None,
            min_rnr_timer: 12,
            max_dest_rd_atomic: 16,
            sl: 0,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    }
}

/// Attributes of RTR → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsOptions {
    /// ACK timeout code: 4.096 µs × 2^timeout (0..=31, 0 = infinite; 14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// Reads and atomics in flight as requester.
    pub max_rd_atomic: u8,
}

impl Default for RtsOptions {
    fn default() -> Self {
        RtsOptions {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }
}
