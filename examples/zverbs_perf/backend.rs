//! Backends: a backend supplies two opened device contexts (client, server) and the
//! channel settings that suit them; every test is generic over the provider.

use zverbs::provider::Provider;
use zverbs::{ChannelConfig, Context};

use crate::Res;

/// The client's and the server's device contexts.
pub type Contexts<P> = (Context<P>, Context<P>);

/// What a provider must offer the tests. The hook for new backends.
pub trait Backend {
    /// The provider.
    type P: Provider;
    /// A name for the report header.
    fn describe(&self) -> String;
    /// The client's and the server's device contexts.
    fn open(&self) -> Res<Contexts<Self::P>>;
    /// Channel settings for a context of this backend (e.g. the GID index on RoCE).
    fn channel_config(&self, _ctx: &Context<Self::P>) -> Res<ChannelConfig> {
        Ok(ChannelConfig::default())
    }
}

/// The untimed in-process simulator: two devices, `sim0` (client) and `sim1` (server).
#[cfg(feature = "sim")]
pub struct SimBackend(pub zverbs::provider::sim::Sim);

#[cfg(feature = "sim")]
impl Backend for SimBackend {
    type P = zverbs::provider::sim::Sim;
    fn describe(&self) -> String {
        "sim (in-process simulator, untimed; both ends in this process)".into()
    }
    fn open(&self) -> Res<Contexts<Self::P>> {
        Ok((
            Context::open(&self.0, "sim0")?,
            Context::open(&self.0, "sim1")?,
        ))
    }
}

/// libibverbs: both ends on one device, in loopback (as perftest's server and client run
/// on one host), each end with its own device context, one thread each.
#[cfg(feature = "verbs")]
pub struct VerbsBackend {
    pub device: String,
}

#[cfg(feature = "verbs")]
impl VerbsBackend {
    /// The device: `--device`, else `ZVERBS_DEVICE`, else the first device present.
    pub fn new(flag: Option<&str>) -> Res<VerbsBackend> {
        use zverbs::provider::verbs::Verbs;
        let device = match flag {
            Some(d) => d.to_owned(),
            None => match std::env::var("ZVERBS_DEVICE")
                .ok()
                .filter(|d| !d.is_empty())
            {
                Some(d) => d,
                None => Verbs::devices()
                    .into_iter()
                    .next()
                    .ok_or("no verbs device found (pass --device or set ZVERBS_DEVICE)")?,
            },
        };
        Ok(VerbsBackend { device })
    }

    /// The GID index: `ZVERBS_GID_INDEX`, else the RoCE v2 IPv4-mapped entry.
    pub fn gid_index(ctx: &Context<zverbs::provider::verbs::Verbs>) -> Res<u8> {
        use zverbs::provider::verbs::{GidSelect, Verbs};
        let how = match std::env::var("ZVERBS_GID_INDEX") {
            Ok(i) => GidSelect::Index(
                i.parse()
                    .map_err(|_| format!("bad ZVERBS_GID_INDEX {i:?}"))?,
            ),
            Err(_) => GidSelect::default(),
        };
        let port = zverbs::qp::QpConfig::default().port;
        Ok(Verbs::select_gid(ctx.raw(), port, how)?.index)
    }
}

#[cfg(feature = "verbs")]
impl Backend for VerbsBackend {
    type P = zverbs::provider::verbs::Verbs;
    fn describe(&self) -> String {
        format!(
            "verbs on {} (client and server in this process, loopback on one device)",
            self.device
        )
    }
    fn open(&self) -> Res<Contexts<Self::P>> {
        use zverbs::provider::verbs::Verbs;
        Ok((
            Context::open(&Verbs, &self.device)?,
            Context::open(&Verbs, &self.device)?,
        ))
    }
    fn channel_config(&self, ctx: &Context<Self::P>) -> Res<ChannelConfig> {
        let mut cfg = ChannelConfig::default();
        cfg.qp.gid_index = Self::gid_index(ctx)?;
        // Emulated devices (rxe under qemu) can be slow: wait longer than the default.
        cfg.timeout = Some(std::time::Duration::from_secs(60));
        Ok(cfg)
    }
}
