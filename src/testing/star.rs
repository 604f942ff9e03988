//! A root with a multi-channel to leaves, each with a channel back: the shape of
//! scatter, gather and shared-queue tests.

use std::format;
use std::vec::Vec;

use crate::channel::{Channel, ChannelConfig};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::multi_channel::MultiChannel;
use crate::provider::sim::{Sim, SimError};

/// A root (rank 0, device `sim0`) with a [`MultiChannel`] to leaves `1..=n` (devices
/// `sim1..=sim{n}`), each leaf a [`Channel`] back to the root. Rank `i`'s protection
/// domain is `pd[i]`; leaf `i`'s channel is `leaves[i - 1]`. Fields drop in order:
/// channels before domains and devices.
pub struct Star<const PEERS: usize, const DEPTH: usize = 16, const SGES: usize = 1> {
    /// The root's channels to every leaf.
    pub root: MultiChannel<Sim, PEERS, DEPTH, SGES>,
    /// Each leaf's channel to the root, leaf 1 first.
    pub leaves: Vec<Channel<Sim, DEPTH, SGES>>,
    /// Every rank's protection domain, by rank.
    pub pd: Vec<ProtectionDomain<Sim>>,
    /// Every rank's device, by rank.
    pub ctx: Vec<Context<Sim>>,
}

impl<const PEERS: usize, const DEPTH: usize, const SGES: usize> Star<PEERS, DEPTH, SGES> {
    /// `n` leaves (at most `PEERS`) and the root, every channel configured by `cfg`, on
    /// devices `sim0..=sim{n}` of `sim`.
    pub fn connected_on(sim: &Sim, n: usize, cfg: &ChannelConfig) -> Result<Self, Error<SimError>> {
        let ctx = (0..=n)
            .map(|i| Context::open(sim, &format!("sim{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let pd = ctx
            .iter()
            .map(Context::alloc_pd)
            .collect::<Result<Vec<_>, _>>()?;
        let root = MultiChannel::prepare(&ctx[0], &pd[0], 1..=n, cfg)?;
        let leaves = (1..=n)
            .map(|i| Channel::prepare(&ctx[i], &pd[i], cfg))
            .collect::<Result<Vec<_>, _>>()?;
        let theirs: Vec<_> = leaves.iter().map(|l| l.endpoint()).collect();
        let mine = (1..=n)
            .map(|p| root.endpoint(p))
            .collect::<Result<Vec<_>, _>>()?;
        let root = root.connect(|p| theirs.get(p.wrapping_sub(1)).copied())?;
        let leaves = leaves
            .into_iter()
            .zip(&mine)
            .map(|(l, ep)| l.connect(ep))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Star {
            root,
            leaves,
            pd,
            ctx,
        })
    }
}
