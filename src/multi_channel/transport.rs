//! What a [`MultiChannel`](super::MultiChannel)'s peers receive through: each its own
//! receive queue ([`Rc`]), or one shared receive queue for all of them ([`RcOnSrq`]), whose
//! receive slots the multi-channel owns.

use super::{MultiChannel, PreparedMultiChannel};
use crate::channel::{ChannelConfig, ChannelTransport};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::provider::Provider;
#[cfg(feature = "std")]
use crate::qp::RcOnSrq;
use crate::qp::{Connected, Rc};
use crate::srq::SlotsConfig;

/// The transport of a [`MultiChannel`](super::MultiChannel)'s peers. Sealed: [`Rc`] (each
/// peer's channel posts its own receives) and, with `std`, [`RcOnSrq`] (the peers share
/// one SRQ).
pub trait PeerTransport: ChannelTransport<Ops = Rc> + Connected {
    /// What the multi-channel keeps for its peers' receives besides their channels.
    type Receives<P: Provider>;

    /// [`MultiChannel::prepare`], or [`MultiChannel::prepare_on_srq`] with `slots`.
    #[doc(hidden)]
    fn prepare<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: impl IntoIterator<Item = usize>,
        config: &ChannelConfig,
        slots: &SlotsConfig,
    ) -> Result<PreparedMultiChannel<P, PEERS, DEPTH, SGES, Self>, Error<P::Error>>;
}

impl PeerTransport for Rc {
    type Receives<P: Provider> = ();

    fn prepare<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: impl IntoIterator<Item = usize>,
        config: &ChannelConfig,
        _slots: &SlotsConfig,
    ) -> Result<PreparedMultiChannel<P, PEERS, DEPTH, SGES, Self>, Error<P::Error>> {
        MultiChannel::prepare(ctx, pd, peers, config)
    }
}

#[cfg(feature = "std")]
impl PeerTransport for RcOnSrq {
    type Receives<P: Provider> = super::on_srq::SrqReceives<P>;

    fn prepare<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: impl IntoIterator<Item = usize>,
        config: &ChannelConfig,
        slots: &SlotsConfig,
    ) -> Result<PreparedMultiChannel<P, PEERS, DEPTH, SGES, Self>, Error<P::Error>> {
        MultiChannel::prepare_on_srq(ctx, pd, peers, config, slots)
    }
}
