//! The conformance suite (`tests/conformance/`) on the simulator.
//!
//! `ZVERBS_CONFORMANCE_OUT=<file>` records each outcome for the differential report of
//! `scripts/rxe-test.sh`.
#![cfg(feature = "sim")]

mod conformance;

use std::time::Duration;

use conformance::Env;
use zverbs::provider::sim::{Fabric, Sim};
use zverbs::qp::QpConfig;
use zverbs::Context;
use zverbs_sim::FabricConfig;

/// Two simulated devices, untimed (work completes inside the call that makes it possible),
/// with the IB spec's responder behaviour for a failed WRITE_WITH_IMM.
struct SimEnv(Sim);

impl Env for SimEnv {
    type P = Sim;
    fn backend(&self) -> &'static str {
        "sim"
    }
    fn provider(&self) -> &Sim {
        &self.0
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
}

fn env() -> Result<SimEnv, String> {
    let cfg = FabricConfig {
        loc_access_err: true,
        ..FabricConfig::instant()
    };
    Ok(SimEnv(Sim::new(Fabric::with_config(cfg, 2))))
}

conformance_tests!(env());
