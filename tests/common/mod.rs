//! Shared set-up for integration tests: two devices, two connected channels.
#![allow(dead_code)]

#[cfg(feature = "tokio")]
pub mod rt;

use std::time::Duration;

use zverbs::provider::sim::Sim;
use zverbs::{AccessFlags, ChannelConfig};

pub const ALL: AccessFlags = AccessFlags::all();

pub use zverbs::testing::{Pair, Side};

/// Two channels on devices sim0 and sim1, connected to each other.
pub fn pair<const N: usize>(timeout: Duration) -> (Side<N>, Side<N>) {
    let cfg = ChannelConfig {
        timeout: Some(timeout),
        ..ChannelConfig::default()
    };
    pair_on(&Sim::with_devices(2), &cfg, &cfg)
}

/// Two channels on devices sim0 (a, configured by `a_cfg`) and sim1 (b, `b_cfg`) of
/// `sim`, connected to each other.
pub fn pair_on<const N: usize>(
    sim: &Sim,
    a_cfg: &ChannelConfig,
    b_cfg: &ChannelConfig,
) -> (Side<N>, Side<N>) {
    let p = Pair::connected_on(sim, a_cfg, b_cfg).unwrap();
    (p.a, p.b)
}

pub fn default_pair() -> (Side<16>, Side<16>) {
    pair(Duration::from_secs(10))
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
