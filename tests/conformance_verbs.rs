//! The conformance suite (`tests/conformance/`) on a real verbs device.
//!
//! Runs when `ZVERBS_DEVICE` names a device (e.g. `ZVERBS_DEVICE=rxe0`, which
//! `scripts/rxe-test.sh` sets up inside a qemu guest); both queue pairs live on that device,
//! connected to each other in loopback. `ZVERBS_GID_INDEX` overrides the GID choice (default:
//! the RoCE v2 IPv4-mapped entry). Without a usable device every test prints
//! `SKIPPED: <test>: <reason>` and returns.
#![cfg(feature = "verbs")]

mod conformance;

use std::os::fd::AsFd;
use std::time::Duration;

use conformance::{Deviation, Env, RXE_DEVIATIONS};
use zverbs::provider::verbs::{GidSelect, Verbs};
use zverbs::qp::QpConfig;
use zverbs::Context;

struct VerbsEnv {
    device: String,
    gid_index: u8,
}

impl Env for VerbsEnv {
    type P = Verbs;
    fn backend(&self) -> &'static str {
        "rxe"
    }
    fn provider(&self) -> &Verbs {
        &Verbs
    }
    fn devices(&self) -> (&str, &str) {
        (&self.device, &self.device)
    }
    fn qp_config(&self, _ctx: &Context<Verbs>) -> QpConfig {
        QpConfig {
            gid_index: self.gid_index,
            ..QpConfig::default()
        }
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(20)
    }
    fn grace(&self) -> Duration {
        Duration::from_millis(50)
    }
    fn set_link(&self, up: bool) -> Result<(), String> {
        // The netdev under the device's GID (dummy0 in scripts/rxe-test.sh's guest).
        let path = format!(
            "/sys/class/infiniband/{}/ports/1/gid_attrs/ndevs/{}",
            self.device, self.gid_index
        );
        let netdev = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        let netdev = netdev.trim();
        let state = if up { "up" } else { "down" };
        let out = std::process::Command::new("ip")
            .args(["link", "set", netdev, state])
            .output()
            .map_err(|e| format!("ip link set {netdev} {state}: {e}"))?;
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            return Err(format!("ip link set {netdev} {state}: {why}"));
        }
        Ok(())
    }
    fn dmabuf(&self, _ctx: &Context<Verbs>, _len: usize) -> Result<Box<dyn AsFd>, String> {
        // No exporter is at hand without an accelerator: the guest's kernel (Debian's 6.1)
        // has neither udmabuf nor DMA heaps. A descriptor that is no dmabuf still shows
        // what the device does with a registration: rxe refuses it in its provider library
        // before the descriptor is looked at (EOPNOTSUPP), and a device that registers
        // dmabufs would refuse this one (EBADF or EINVAL), which fails the scenario.
        let file = std::fs::File::open("/dev/zero").map_err(|e| format!("/dev/zero: {e}"))?;
        Ok(Box::new(file))
    }
    fn deviations(&self) -> &[Deviation] {
        if self.device.starts_with("rxe") {
            RXE_DEVIATIONS
        } else {
            &[]
        }
    }
}

fn env() -> Result<VerbsEnv, String> {
    let device = std::env::var("ZVERBS_DEVICE").map_err(|_| {
        "ZVERBS_DEVICE is not set (e.g. ZVERBS_DEVICE=rxe0; scripts/rxe-test.sh runs this \
         suite on soft-RoCE in a qemu guest)"
            .to_string()
    })?;
    let ctx = Context::open(&Verbs, &device).map_err(|e| e.to_string())?;
    let how = match std::env::var("ZVERBS_GID_INDEX") {
        Ok(i) => GidSelect::Index(
            i.parse()
                .map_err(|_| format!("bad ZVERBS_GID_INDEX {i:?}"))?,
        ),
        Err(_) => GidSelect::default(),
    };
    let gid = Verbs::select_gid(ctx.raw(), 1, how).map_err(|e| format!("{device}: {e}"))?;
    Ok(VerbsEnv {
        device,
        gid_index: gid.index,
    })
}

conformance_tests!(env());
#[cfg(feature = "tokio")]
conformance_tests!(@each env(); async_operations);
