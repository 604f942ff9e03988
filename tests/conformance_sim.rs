//! The conformance suite (`tests/conformance/`) on the simulator.
//!
//! `ZVERBS_CONFORMANCE_OUT=<file>` records each outcome for the differential report of
//! `scripts/rxe-test.sh`.
#![cfg(feature = "sim")]

mod conformance;

use std::time::Duration;

use conformance::{Deviation, Env, RXE_DEVIATIONS};
use std::os::fd::AsFd;
use zverbs::provider::sim::{Fabric, Sim};
use zverbs::qp::QpConfig;
use zverbs::Context;

use zverbs_sim::{FabricConfig, Personality};

/// Two simulated devices, untimed (work completes inside the call that makes it possible),
/// with the IB spec's responder behaviour for a failed WRITE_WITH_IMM; `rxe`: imitating
/// soft-RoCE where it deviates ([`Personality::Rxe`]), which must give exactly the
/// documented rxe outcomes.
struct SimEnv {
    sim: Sim,
    rxe: bool,
}

impl Env for SimEnv {
    type P = Sim;
    fn backend(&self) -> &'static str {
        if self.rxe {
            "sim-rxe"
        } else {
            "sim"
        }
    }
    fn provider(&self) -> &Sim {
        &self.sim
    }
    fn devices(&self) -> (&str, &str) {
        ("sim0", "sim1")
    }
    fn qp_config(&self, _ctx: &Context<Sim>) -> QpConfig {
        QpConfig::default()
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
    fn deviations(&self) -> &[Deviation] {
        if self.rxe {
            RXE_DEVIATIONS
        } else {
            &[]
        }
    }
    fn imitates_deviations(&self) -> bool {
        self.rxe
    }
    fn dmabuf(&self, ctx: &Context<Sim>, len: usize) -> Result<Box<dyn AsFd>, String> {
        let mem = ctx.raw().alloc_device_memory(len);
        Ok(Box::new(mem.map_err(|e| format!("device memory: {e}"))?))
    }
    fn set_link(&self, up: bool) -> Result<(), String> {
        // Side B's device: the pair's link.
        let f = self.sim.fabric();
        let r = if up { f.link_up(1) } else { f.link_down(1) };
        r.map_err(|e| format!("link: {e}"))
    }
}

fn env(personality: Personality) -> Result<SimEnv, String> {
    let cfg = FabricConfig {
        loc_access_err: true,
        personality,
        ..FabricConfig::instant()
    };
    Ok(SimEnv {
        sim: Sim::new(Fabric::with_config(cfg, 2)),
        rxe: personality == Personality::Rxe,
    })
}

/// The simulator as a hardware HCA: the verbs specification's outcomes.
mod hca {
    use super::*;
    conformance_tests!(env(Personality::Hca));
    #[cfg(feature = "tokio")]
    conformance_tests!(@each env(Personality::Hca); async_operations);
}

/// The simulator imitating soft-RoCE: rxe's outcomes, deviations included.
mod rxe {
    use super::*;
    conformance_tests!(env(Personality::Rxe));
    #[cfg(feature = "tokio")]
    conformance_tests!(@each env(Personality::Rxe); async_operations);
}
