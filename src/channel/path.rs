//! The channel's path as the device applied it.

use super::Channel;
use crate::error::Error;
use crate::provider::{PathAttr, Provider};

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// The path and connection attributes the device applied to the channel's queue pair
    /// (`ibv_query_qp`): the effective path MTU (the smallest of
    /// [`ChannelConfig::rtr`](super::ChannelConfig::rtr)`.mtu`, the local port's and the
    /// peer's), the service level, the GRH fields, the current PSNs.
    ///
    /// ```
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::qp::RtrOptions;
    /// use zverbs::{Channel, ChannelConfig, Context, Mtu};
    /// let sim = Sim::with_devices(2);
    /// let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
    /// let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
    /// let rtr = RtrOptions { mtu: Some(Mtu::Mtu2048), sl: 2, traffic_class: 0x68, ..RtrOptions::default() };
    /// let config = ChannelConfig { rtr, ..ChannelConfig::default() };
    /// let a = Channel::<Sim>::prepare(&ca, &pa, &config)?;
    /// let b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default())?;
    /// let (ea, eb) = (a.endpoint(), b.endpoint());
    /// let (a, _b) = (a.connect(&eb)?, b.connect(&ea)?);
    /// let path = a.path()?;
    /// assert_eq!((path.path_mtu, path.sl, path.traffic_class), (Mtu::Mtu2048, 2, 0x68));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path(&self) -> Result<PathAttr, Error<P::Error>> {
        self.queue_pair().path()
    }
}
