//! MPICH's Hydra (`mpiexec`) and the PMI-1/2 launchers that follow it: `PMI_RANK`,
//! `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`; under `-pmi-port` Hydra sets
//! `PMI_ID` (the rank) and `PMI_PORT` instead, and the size travels over the PMI wire
//! protocol, not the environment. Hydra names no root.

use super::{number, placed, Env, LaunchError, Launcher, LauncherKind, Placement};

/// `PMI_RANK` / `PMI_ID`.
pub struct Mpich;

const KIND: LauncherKind = LauncherKind::Mpich;

impl Launcher for Mpich {
    fn kind(&self) -> LauncherKind {
        KIND
    }

    fn present(&self, env: Env<'_>) -> bool {
        env("PMI_RANK").is_some() || env("PMI_ID").is_some()
    }

    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError> {
        let rank = match number(env, "PMI_RANK")? {
            Some(rank) => rank,
            None => number(env, "PMI_ID")?.ok_or(LaunchError::Missing {
                launcher: KIND,
                what: "PMI_RANK",
            })?,
        };
        let world = number(env, "PMI_SIZE")?.ok_or(LaunchError::Missing {
            launcher: KIND,
            what: "PMI_SIZE (under -pmi-port the size is not in the environment: set ZVERBS_RANK and ZVERBS_WORLD_SIZE)",
        })?;
        let local = (
            number(env, "MPI_LOCALRANKID")?,
            number(env, "MPI_LOCALNRANKS")?,
        );
        placed(KIND, rank, world, local, None)
    }
}
