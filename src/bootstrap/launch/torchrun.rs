//! torchrun's convention (`torch.distributed.run`, and the tools that follow it): `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, and the root at
//! `MASTER_ADDR:MASTER_PORT`
//! (<https://pytorch.org/docs/stable/elastic/run.html#environment-variables>).

use super::{number, placed, required, Env, LaunchError, Launcher, LauncherKind, Placement, Root};

/// `RANK` / `WORLD_SIZE`.
pub struct Torchrun;

const KIND: LauncherKind = LauncherKind::Torchrun;

impl Launcher for Torchrun {
    fn kind(&self) -> LauncherKind {
        KIND
    }

    fn present(&self, env: Env<'_>) -> bool {
        env("RANK").is_some() && env("WORLD_SIZE").is_some()
    }

    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError> {
        let rank = required(env, KIND, "RANK")?;
        let world = required(env, KIND, "WORLD_SIZE")?;
        let local = (number(env, "LOCAL_RANK")?, number(env, "LOCAL_WORLD_SIZE")?);
        let root = match (env("MASTER_ADDR"), number(env, "MASTER_PORT")?) {
            (Some(host), Some(port)) => Some(root_at(host, port)?),
            _ => None,
        };
        placed(KIND, rank, world, local, root)
    }
}

fn root_at(host: String, port: u32) -> Result<Root, LaunchError> {
    match u16::try_from(port) {
        Ok(port) if port != 0 && !host.is_empty() => Ok(Root { host, port }),
        _ => Err(LaunchError::Malformed {
            variable: "MASTER_PORT",
            value: port.to_string(),
            expected: "a TCP port (1..=65535)",
        }),
    }
}
