//! Our own variables, for runs without a launcher or to override one: `ZVERBS_RANK` and
//! `ZVERBS_WORLD_SIZE` (both, or neither) give the rank; `ZVERBS_ROOT=host:port` the
//! rendezvous root, over any launcher's.

use super::{host_port, number, placed, Env, LaunchError, Launcher, LauncherKind, Placement, Root};

/// `ZVERBS_RANK` / `ZVERBS_WORLD_SIZE`.
pub struct Zverbs;

const RANK: &str = "ZVERBS_RANK";
const WORLD: &str = "ZVERBS_WORLD_SIZE";
const ROOT: &str = "ZVERBS_ROOT";

impl Launcher for Zverbs {
    fn kind(&self) -> LauncherKind {
        LauncherKind::Zverbs
    }

    fn present(&self, env: Env<'_>) -> bool {
        env(RANK).is_some() || env(WORLD).is_some()
    }

    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError> {
        let missing = |what| LaunchError::Missing {
            launcher: LauncherKind::Zverbs,
            what,
        };
        let rank = number(env, RANK)?.ok_or(missing(RANK))?;
        let world = number(env, WORLD)?.ok_or(missing(WORLD))?;
        placed(LauncherKind::Zverbs, rank, world, (None, None), root(env)?)
    }
}

/// `ZVERBS_ROOT`, if set.
pub(crate) fn root(env: Env<'_>) -> Result<Option<Root>, LaunchError> {
    env(ROOT).map(|v| host_port(ROOT, v)).transpose()
}
