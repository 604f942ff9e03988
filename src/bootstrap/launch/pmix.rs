//! A PMIx launcher: `PMIX_RANK` and `PMIX_NAMESPACE` (<https://docs.openpmix.org>). The
//! job size is held by the PMIx server and read through the client library
//! (`PMIx_Get(PMIX_JOB_SIZE)`), not the environment, so a PMIx environment alone names no
//! world: a typed error says so; `ZVERBS_WORLD_SIZE` (with `ZVERBS_RANK`) supplies it, as
//! does Open MPI's `OMPI_COMM_WORLD_SIZE`, which `prterun` sets beside these.

use super::{required, Env, LaunchError, Launcher, LauncherKind, Placement};

/// `PMIX_RANK` / `PMIX_NAMESPACE`.
pub struct Pmix;

const KIND: LauncherKind = LauncherKind::Pmix;

impl Launcher for Pmix {
    fn kind(&self) -> LauncherKind {
        KIND
    }

    fn present(&self, env: Env<'_>) -> bool {
        env("PMIX_RANK").is_some()
    }

    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError> {
        required(env, KIND, "PMIX_RANK")?;
        if env("PMIX_NAMESPACE").is_none() {
            return Err(LaunchError::Missing {
                launcher: KIND,
                what: "PMIX_NAMESPACE",
            });
        }
        Err(LaunchError::Missing {
            launcher: KIND,
            what: "the world size (PMIx keeps it in its server, not the environment: \
                   set ZVERBS_RANK and ZVERBS_WORLD_SIZE)",
        })
    }
}
