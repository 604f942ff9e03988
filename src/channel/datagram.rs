//! Datagram channels: a [`Channel`] over an unreliable-datagram queue pair, with the
//! levels an RC channel has — blocking ([`execute`](Channel::execute),
//! [`receive`](Channel::receive)), scoped ([`scope`](Channel::scope)), unpolled — and one
//! operation, the datagram ([`Op::datagram`]), each naming its [`Destination`].
//!
//! A datagram queue pair has no peer: it is ready to send and receive once made, and its
//! endpoint ([`QueuePair::endpoint`]) is what peers make their address handles from. Every
//! receive buffer starts with 40 bytes of global route header, which the completion's
//! `byte_len` counts; `src_qp` (with `slid` and `sl` on InfiniBand) names the sender. A datagram that meets no receive, or more
//! than the path MTU, is lost (a send completes once the datagram left).
//!
//! ```
//! use zverbs::provider::sim::Sim;
//! use zverbs::qp::{AddressHandle, Ud, UdOptions};
//! use zverbs::{AhAttr, Channel, ChannelConfig, Context, Destination, Op};
//!
//! let sim = Sim::with_devices(2);
//! let opts = UdOptions { qkey: 0x1111, pkey_index: 0 };
//! let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
//! let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
//! let cfg = ChannelConfig::default();
//! let mut a = Channel::<Sim, 16, 1, Ud>::datagram(&ca, &pa, &cfg, &opts)?;
//! let mut b = Channel::<Sim, 16, 1, Ud>::datagram(&cb, &pb, &cfg, &opts)?;
//! // A's route to B's queue pair.
//! let to = b.queue_pair().endpoint();
//! let ah = AddressHandle::create(&pa, &AhAttr::new(1, to.gid, 0, to.lid))?;
//! let (mut msg, mut inbox) = (*b"datagram", [0u8; 40 + 8]);
//! let msg = pa.register(&mut msg)?;
//! let mut inbox = pb.register(&mut inbox)?;
//! b.scope(|s| {
//!     let got = s.post_receive([inbox.slice_mut(..)?])?;
//!     s.ring_doorbell()?; // posted now: a datagram that finds no receive is lost
//!     a.execute(Op::datagram([msg.slice(..)?], &Destination::new(&ah, to.qp_num, 0x1111)))?;
//!     let c = s.wait_receive(got)?;
//!     assert_eq!((c.byte_len, c.src_qp), (48, a.queue_pair().qp_num()));
//!     Ok(())
//! })?;
//! assert_eq!(&inbox.as_slice()[40..], b"datagram"); // after the 40-byte header
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::source::Completions;
use super::*;
use crate::qp::{Ud, UdOptions};

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES, Ud> {
    /// Creates a datagram channel: an unreliable-datagram queue pair accepting the Q_Key
    /// and partition of `options`, on two completion queues of its own (on completion
    /// channels with [`WaitPolicy::SpinSleep`]), moved to RTS. From `config` it takes the
    /// queue pair settings (the depths and SGE counts are `DEPTH` and `SGES`), the port,
    /// the timeout, the flush grace and the wait policy; the RC transition options do not
    /// apply.
    pub fn datagram(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
        options: &UdOptions,
    ) -> Result<Self, Error<P::Error>> {
        let depth = Channel::<P, DEPTH, SGES>::depth()?;
        let events = config.wait == WaitPolicy::SpinSleep;
        let send_cq = Completions::own(ctx, depth, events)?;
        let recv_cq = Completions::own(ctx, depth, events)?;
        let qp_cfg = Channel::<P, DEPTH, SGES>::qp_config(config);
        let qp = QueuePair::create_ud(ctx, pd, send_cq.queue(), recv_cq.queue(), &qp_cfg)?;
        let qp = qp.into_init(options).map_err(|e| e.error)?;
        let qp = qp.into_rtr().map_err(|e| e.error)?;
        let qp = qp.into_rts().map_err(|e| e.error)?;
        Ok(Channel {
            owner: Owner::next(),
            qp,
            send_cq,
            sq: Ring::new(),
            rx: super::OwnRx {
                cq: recv_cq,
                ring: Ring::new(),
            },
            config: config_of(config),
            wc: WorkCompletion::EMPTY,
        })
    }
}
