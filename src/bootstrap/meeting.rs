//! How a process meets its world, in one value: its rank, the world size, and where the
//! ranks meet — a root rendezvous (from a launcher's environment, or set up by hand) or a
//! configuration naming every rank's address (the all-to-all exchange). A
//! [`Node`](crate::node::Node) takes it in [`Node::bootstrap`](crate::node::Node::bootstrap),
//! a `tokio::Connection` mesh in `Connection::bootstrap`.
//!
//! ```no_run
//! use zverbs::bootstrap::Bootstrap;
//!
//! // Under `srun`, `mpirun`, `mpiexec`, torchrun or `ZVERBS_*`:
//! let world = Bootstrap::from_env()?;
//! println!("rank {} of {}", world.rank, world.world);
//! # Ok::<(), zverbs::bootstrap::ExchangeError>(())
//! ```

use super::error::ExchangeError;
use super::launch::{self, Env, Placement};
use super::{NetworkConfig, Rendezvous};

/// A process's rank, its world's size and where the ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// This process's rank, below `world`.
    pub rank: u32,
    /// Ranks in the world.
    pub world: u32,
    /// Where they meet.
    pub meeting: Meeting,
}

/// Where the ranks of a world meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meeting {
    /// Every rank connects once to the root ([`Rendezvous`]).
    Rendezvous(Rendezvous),
    /// Every rank connects to every other at the address the configuration gives it
    /// ([`exchange`](super::exchange)).
    Config(NetworkConfig),
}

impl Bootstrap {
    /// [`from_env_of`](Self::from_env_of) the process's environment.
    ///
    /// # Errors
    /// As [`from_env_of`](Self::from_env_of).
    pub fn from_env() -> Result<Bootstrap, ExchangeError> {
        Self::from_env_of(&launch::process_env)
    }

    /// The launcher's placement in `env` ([`launch::detect`]) and the rendezvous at the
    /// root it names, under the run id of [`launch::run_id`].
    ///
    /// ```
    /// use zverbs::bootstrap::{Bootstrap, Meeting};
    ///
    /// let env = |v: &str| match v {
    ///     "OMPI_COMM_WORLD_RANK" => Some("2".into()),
    ///     "OMPI_COMM_WORLD_SIZE" => Some("4".into()),
    ///     "ZVERBS_ROOT" => Some("127.0.0.1:29600".into()),
    ///     _ => None,
    /// };
    /// let b = Bootstrap::from_env_of(&env)?;
    /// assert_eq!((b.rank, b.world), (2, 4));
    /// let Meeting::Rendezvous(rv) = b.meeting else { unreachable!() };
    /// assert_eq!(rv.root.to_string(), "127.0.0.1:29600");
    /// # Ok::<(), zverbs::bootstrap::ExchangeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExchangeError::Launch`] for an environment that gives no placement or a malformed
    /// run id; [`ExchangeError::NoRoot`] when nothing names a root;
    /// [`ExchangeError::Unresolved`] when its host does not resolve.
    pub fn from_env_of(env: Env<'_>) -> Result<Bootstrap, ExchangeError> {
        let placement = launch::detect(env).map_err(ExchangeError::Launch)?;
        let id = launch::run_id(env).map_err(ExchangeError::Launch)?;
        Self::from_placement(&placement, id)
    }

    /// The rendezvous `placement` names, under `id` (see
    /// [`Rendezvous::for_placement`]).
    ///
    /// # Errors
    /// As [`Rendezvous::for_placement`].
    pub fn from_placement(placement: &Placement, id: u64) -> Result<Bootstrap, ExchangeError> {
        Ok(Bootstrap {
            rank: placement.rank,
            world: placement.world,
            meeting: Meeting::Rendezvous(Rendezvous::for_placement(placement, id)?),
        })
    }

    /// Rank `rank` of the world `config` lists, meeting all-to-all.
    ///
    /// # Errors
    /// [`ExchangeError::NoSuchRank`] when `config` has no rank `rank`.
    pub fn from_config(config: NetworkConfig, rank: u32) -> Result<Bootstrap, ExchangeError> {
        let len = config.len();
        if rank as usize >= len {
            return Err(ExchangeError::NoSuchRank { rank, len });
        }
        Ok(Bootstrap {
            rank,
            // Ranks are u32 (the configuration's keys): so is their count.
            world: u32::try_from(len).unwrap_or(u32::MAX),
            meeting: Meeting::Config(config),
        })
    }
}
