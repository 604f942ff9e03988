//! What a [`MultiChannel`](super::MultiChannel)'s peers receive through: each its own
//! receive queue ([`Rc`]), or one shared receive queue for all of them ([`RcOnSrq`]), whose
//! receive slots the multi-channel owns.

use crate::channel::ChannelTransport;
use crate::provider::Provider;
#[cfg(feature = "std")]
use crate::qp::RcOnSrq;
use crate::qp::{Connected, Rc};

/// The transport of a [`MultiChannel`](super::MultiChannel)'s peers. Sealed: [`Rc`] (each
/// peer's channel posts its own receives) and, with `std`, [`RcOnSrq`] (the peers share
/// one SRQ).
pub trait PeerTransport: ChannelTransport<Ops = Rc> + Connected {
    /// What the multi-channel keeps for its peers' receives besides their channels.
    type Receives<P: Provider>;
}

impl PeerTransport for Rc {
    type Receives<P: Provider> = ();
}

#[cfg(feature = "std")]
impl PeerTransport for RcOnSrq {
    type Receives<P: Provider> = super::on_srq::SrqReceives<P>;
}
