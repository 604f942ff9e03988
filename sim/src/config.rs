//! Configuration of a fabric: time mode, link model, packet faults, trace, seed.
//!
//! ```
//! use zverbs_sim::*;
//! // Simulated time that only moves when asked, one packet in five lost, reproducible.
//! let cfg = FabricConfig {
//!     faults: Faults { drop: 0.2, ..Faults::none() },
//!     ..FabricConfig::stepped(42)
//! };
//! let fabric = Fabric::with_config(cfg, 2);
//! assert_eq!(fabric.now(), std::time::Duration::ZERO);
//! ```

/// How simulated time advances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Simulated time is the wall clock (nanoseconds since the fabric was created). Every
    /// call on any handle first processes every event that is due, and with a timed link
    /// or timers a clock thread runs them as they fall due between calls, as an HCA works
    /// while its host sleeps on a completion channel (see
    /// [`CompChannel`](crate::CompChannel)) or reads memory its peers write.
    #[default]
    Threaded,
    /// Simulated time advances only through [`Fabric::step`](crate::Fabric::step),
    /// [`Fabric::run_until_idle`](crate::Fabric::run_until_idle),
    /// [`Fabric::run_for`](crate::Fabric::run_for) and, with
    /// [`FabricConfig::auto_step`], a [`Cq::poll`](crate::Cq::poll) that finds nothing.
    /// With the same seed the same calls give the same event trace, byte for byte.
    Stepped,
}

/// Timing of the links between devices.
///
/// Each device has one egress port, shared by all its queue pairs. A packet of `b` bytes
/// leaving at `now` starts at `max(now, port busy until)`, occupies the port for its
/// serialisation time `b * 8 / bandwidth_gbps` ns, and arrives `latency_ns` after it is
/// fully serialised. Packets carry a 64-byte header each (per path-MTU segment) besides
/// their payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinkModel {
    /// One-way latency in nanoseconds.
    pub latency_ns: u64,
    /// Port bandwidth in Gb/s; 0 means infinite (no serialisation time).
    pub bandwidth_gbps: u32,
}

impl Default for LinkModel {
    /// A 100 Gb/s NIC with 1 µs one-way latency.
    fn default() -> Self {
        LinkModel {
            latency_ns: 1_000,
            bandwidth_gbps: 100,
        }
    }
}

impl LinkModel {
    /// Instant delivery: no latency, infinite bandwidth.
    pub const INSTANT: LinkModel = LinkModel {
        latency_ns: 0,
        bandwidth_gbps: 0,
    };

    /// Nanoseconds `bytes` occupy the port.
    ///
    /// ```
    /// # use zverbs_sim::LinkModel;
    /// assert_eq!(LinkModel::default().serialisation_ns(4096), 327);
    /// assert_eq!(LinkModel::INSTANT.serialisation_ns(4096), 0);
    /// ```
    pub fn serialisation_ns(&self, bytes: u64) -> u64 {
        match self.bandwidth_gbps {
            0 => 0,
            g => bytes.saturating_mul(8) / u64::from(g),
        }
    }
}

/// Random packet faults, each a probability per packet (0.0 ..= 1.0).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Faults {
    /// The packet is lost.
    pub drop: f64,
    /// The packet arrives twice.
    pub duplicate: f64,
    /// The packet is held back by an extra uniform `0 ..= max_extra_delay_ns`, which also
    /// reorders it behind later packets.
    pub delay: f64,
    /// Largest extra delay, in nanoseconds.
    pub max_extra_delay_ns: u64,
}

impl Faults {
    /// No faults.
    pub const fn none() -> Faults {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            delay: 0.0,
            max_extra_delay_ns: 0,
        }
    }
}

/// Everything that configures a [`Fabric`](crate::Fabric).
///
/// `FabricConfig::default()` is threaded, seed 0, the 1 µs / 100 Gb/s [`LinkModel`], no
/// faults, no trace and real timers. [`Fabric::new`](crate::Fabric::new) and
/// [`Fabric::with_devices`](crate::Fabric::with_devices) use [`FabricConfig::instant`]
/// instead, so that code written against the untimed simulator keeps its speed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FabricConfig {
    /// Decides every random choice (faults).
    pub seed: u64,
    /// How time advances.
    pub mode: Mode,
    /// Link timing.
    pub link: LinkModel,
    /// Random packet faults (see also [`Fabric::set_faults`](crate::Fabric::set_faults)).
    pub faults: Faults,
    /// Record a trace (see [`Fabric::write_chrome_trace`](crate::Fabric::write_chrome_trace)).
    pub trace: bool,
    /// Stepped mode only: a [`Cq::poll`](crate::Cq::poll) that finds nothing steps the
    /// engine until that CQ has an entry, no events remain, or 65,536 events have run.
    pub auto_step: bool,
    /// ACK-timeout and RNR timers expire at once (after the packets due at the same
    /// instant), and a requester waiting on RNR with `rnr_retry = 7` sleeps instead of
    /// polling, until the responder posts a receive, leaves RTR/RTS (ERR, RESET, destroyed,
    /// crashed) or becomes unreachable (link down, partition); then it retries at once and
    /// meets the outcome hardware would (`RetryExcErr` when nobody answers). Meant for the
    /// threaded mode, where a real 67 ms × 8 timeout would make tests slow.
    pub instant_timers: bool,
    /// A WRITE_WITH_IMM whose rkey check fails consumes the responder's receive, which
    /// completes with `LocAccessErr` (as the IB spec defines it). When false the receive
    /// is flushed with `WrFlushErr` instead (the simulator's behaviour before timing).
    pub loc_access_err: bool,
    /// Which device the simulator imitates where devices disagree with the spec.
    pub personality: Personality,
    /// Size queue pairs' work queues, the packet heap and the timer heap as work arrives
    /// (doubling up to their capacity) instead of whole at creation: for worlds of many
    /// mostly idle queue pairs (`examples/barrier_scale.rs` runs 65,536 nodes so). Posting
    /// may then allocate until each queue has reached its busiest; with the default
    /// (false) it never does.
    pub lazy_queues: bool,
    /// How the devices execute remote atomics, as their
    /// [`DeviceAttr::atomic_cap`](crate::DeviceAttr) reports it. The simulator executes
    /// every atomic as one read-modify-write instruction on the word, which is atomic
    /// against the host's own atomics too (`Glob`); the default reports `Hca`, as hardware
    /// and rxe do. With [`AtomicCap::None`](crate::AtomicCap::None) a post of an atomic is
    /// refused (`Invalid`).
    pub atomic_cap: crate::types::AtomicCap,
    /// Threaded mode: queue pairs' send lanes run the direct path beside each other,
    /// without the fabric's exclusive lock (`gate.rs`; the default). When false every
    /// post takes the exclusive side: the same outcomes, one thread at a time, which the
    /// differential tests compare the lanes against.
    pub send_lanes: bool,
}

/// The device whose behaviour the simulator reproduces where real verbs stacks differ.
///
/// [`Personality::Hca`] (the default) follows the IB specification as hardware HCAs
/// implement it. [`Personality::Rxe`] reproduces Linux soft-RoCE (`rdma_rxe` of Linux 6.1,
/// rdma-core 44) where it departs from the spec, so that a suite run on the simulator gives
/// the answers it gives on an rxe device:
///
/// - a local SGE whose lkey names no usable MR (none, another PD's, or one lacking
///   LOCAL_WRITE where it is written) completes with `LocQpOpErr` (rxe's `copy_data`
///   fails with `-EINVAL`), not `LocProtErr`; an SGE outside a valid MR is still
///   `LocProtErr`;
/// - a SEND longer than the receive it consumes completes that receive with
///   `LocQpOpErr` and the request with `RemOpErr` (rxe's malformed-WQE path), not
///   `LocLenErr` and `RemInvReqErr`;
/// - an atomic at a remote address that is not 8-byte aligned is refused at post time
///   (`Invalid`, rxe's userspace provider), instead of a `RemInvReqErr` completion;
/// - the receive consumed by a WRITE_WITH_IMM that fails its rkey check completes with
///   `RemAccessErr` (regardless of [`FabricConfig::loc_access_err`]);
/// - a response corrupted by `Fabric::corrupt_next_response` is an RDMA READ response,
///   which fails a request that is not a read with `FatalErr` (rxe's `check_ack`), not
///   `BadRespErr`;
/// - the service level of an RTR path is not kept (rxe's address vector has none), so
///   [`Qp::query`](crate::Qp::query) reports 0; and the hop limit of a GID-routed path is
///   the IP route's, [`ROCE_ROUTE_HOP_LIMIT`], not the one
///   asked for (Linux resolves every RoCE path through the IP stack,
///   `ib_resolve_unicast_gid_dmac`, which overwrites it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Personality {
    /// The IB specification, as hardware HCAs implement it.
    #[default]
    Hca,
    /// Linux soft-RoCE (`rdma_rxe`).
    Rxe,
}

/// The hop limit Linux gives a RoCE path (the IP route's: the default TTL) in place of the
/// one asked for; see [`Personality::Rxe`].
pub const ROCE_ROUTE_HOP_LIMIT: u8 = 64;

/// The port's active (and largest) MTU: any RC path MTU fits, and a datagram's message may
/// be this long.
pub const PORT_MTU: crate::types::Mtu = crate::types::Mtu::Mtu4096;

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            seed: 0,
            mode: Mode::Threaded,
            link: LinkModel::default(),
            faults: Faults::none(),
            trace: false,
            auto_step: true,
            instant_timers: false,
            loc_access_err: true,
            personality: Personality::Hca,
            lazy_queues: false,
            atomic_cap: crate::types::AtomicCap::Hca,
            send_lanes: true,
        }
    }
}

impl FabricConfig {
    /// Whether this fabric's exchanges cannot depend on time (threaded, instant link and
    /// timers, no faults, no trace): requests on idle connections may then run inside their
    /// post (`direct.rs`).
    pub(crate) fn untimed(&self) -> bool {
        self.mode == Mode::Threaded
            && self.link == LinkModel::INSTANT
            && self.instant_timers
            && self.faults == Faults::none()
            && !self.trace
    }

    /// The untimed fabric of [`Fabric::with_devices`](crate::Fabric::with_devices):
    /// threaded, [`LinkModel::INSTANT`], instant timers, receives of failed
    /// WRITE_WITH_IMMs flushed. Work completes inside the call that makes it possible.
    ///
    /// With no random faults and no trace, a send work request posted while nothing else
    /// is in flight on its connection executes inside the post itself, without packets,
    /// timers or the event queue (the direct path; the outcome is the one the packet path
    /// computes, which it falls back to whenever anything could differ:
    /// [`Fabric::direct_executions`](crate::Fabric::direct_executions) counts them).
    pub fn instant() -> FabricConfig {
        FabricConfig {
            link: LinkModel::INSTANT,
            instant_timers: true,
            loc_access_err: false,
            ..FabricConfig::default()
        }
    }

    /// Stepped mode with `seed`, the default link model and auto-stepping polls.
    pub fn stepped(seed: u64) -> FabricConfig {
        FabricConfig {
            seed,
            mode: Mode::Stepped,
            ..FabricConfig::default()
        }
    }
}

/// The IB RNR NAK timer table, in nanoseconds, indexed by the 5-bit code.
const RNR_NS: [u64; 32] = [
    655_360_000,
    10_000,
    20_000,
    30_000,
    40_000,
    60_000,
    80_000,
    120_000,
    160_000,
    240_000,
    320_000,
    480_000,
    640_000,
    960_000,
    1_280_000,
    1_920_000,
    2_560_000,
    3_840_000,
    5_120_000,
    7_680_000,
    10_240_000,
    15_360_000,
    20_480_000,
    30_720_000,
    40_960_000,
    61_440_000,
    81_920_000,
    122_880_000,
    163_840_000,
    245_760_000,
    327_680_000,
    491_520_000,
];

/// The RNR NAK delay of timer code `code` (0..=31; 0 means 655.36 ms), in nanoseconds.
///
/// ```
/// assert_eq!(zverbs_sim::rnr_timer_ns(12), 640_000);
/// ```
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_NS[usize::from(code & 31)]
}

/// The local ACK timeout of code `code`: 4.096 µs × 2^code in nanoseconds, `None` (never)
/// for code 0.
///
/// ```
/// assert_eq!(zverbs_sim::ack_timeout_ns(1), Some(8_192));
/// assert_eq!(zverbs_sim::ack_timeout_ns(0), None);
/// ```
pub fn ack_timeout_ns(code: u8) -> Option<u64> {
    (code != 0).then(|| 4_096u64 << (code & 31))
}
