//! Open MPI's `mpirun` / `prterun`: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//! `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`
//! (<https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html>).
//! `OMPI_COMM_WORLD_NODE_RANK` counts across all jobs on the node, so it is not the
//! local rank and is not read. Open MPI names no root.

use super::{number, placed, required, Env, LaunchError, Launcher, LauncherKind, Placement};

/// `OMPI_COMM_WORLD_*`.
pub struct OpenMpi;

const KIND: LauncherKind = LauncherKind::OpenMpi;

impl Launcher for OpenMpi {
    fn kind(&self) -> LauncherKind {
        KIND
    }

    fn present(&self, env: Env<'_>) -> bool {
        env("OMPI_COMM_WORLD_RANK").is_some()
    }

    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError> {
        let rank = required(env, KIND, "OMPI_COMM_WORLD_RANK")?;
        let world = required(env, KIND, "OMPI_COMM_WORLD_SIZE")?;
        let local = (
            number(env, "OMPI_COMM_WORLD_LOCAL_RANK")?,
            number(env, "OMPI_COMM_WORLD_LOCAL_SIZE")?,
        );
        placed(KIND, rank, world, local, None)
    }
}
