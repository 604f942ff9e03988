//! Where a process stands in its world, from the environment its launcher gave it: rank,
//! world size, local rank and local size, and where the rendezvous root is, if the
//! launcher says.
//!
//! One small [`Launcher`] trait, a module per launcher (Sandia OpenSHMEM's pluggable
//! runtimes are the model), each reading the variables its launcher documents:
//!
//! | launcher | variables | its documentation |
//! |---|---|---|
//! | zverbs ([`zverbs`]) | `ZVERBS_RANK`, `ZVERBS_WORLD_SIZE`, `ZVERBS_ROOT` | here |
//! | torchrun ([`torchrun`]) | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` | <https://pytorch.org/docs/stable/elastic/run.html#environment-variables> |
//! | Open MPI ([`openmpi`]) | `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`, `_NODE_RANK` | <https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html> |
//! | MPICH / Hydra ([`mpich`]) | `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`; `PMI_ID` under `-pmi-port` | MPICH's Hydra process manager (`mpiexec.hydra`): <https://github.com/pmodels/mpich/blob/main/doc/wiki/how_to/Using_the_Hydra_Process_Manager.md> |
//! | PMIx ([`pmix`]) | `PMIX_RANK`, `PMIX_NAMESPACE` | <https://docs.openpmix.org> (the job size is held by the PMIx server, not in the environment) |
//! | Slurm ([`slurm`]) | `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`, `SLURM_NTASKS_PER_NODE` / `SLURM_TASKS_PER_NODE`, `SLURM_STEP_NODELIST`, `SLURM_JOB_ID`, `SLURM_STEP_ID` | `srun(1)`, OUTPUT ENVIRONMENT VARIABLES: <https://slurm.schedmd.com/srun.html> |
//!
//! **Which launcher speaks.** Launchers nest: torchrun runs inside an `srun` step, `mpirun`
//! inside a Slurm batch script (whose `SLURM_PROCID` every child inherits). The innermost
//! one knows the process's rank, so [`detect`] takes the first present in this order:
//! `ZVERBS_RANK`/`ZVERBS_WORLD_SIZE` (which override everything), torchrun, Open MPI and
//! MPICH (one level: both present and disagreeing is an error), PMIx, Slurm. Which one it
//! took is in [`Placement::launcher`]. `ZVERBS_ROOT=host:port` overrides the root of any.
//!
//! ```
//! use zverbs::bootstrap::launch::{detect, LauncherKind};
//!
//! // A recorded environment: rank 3 of 8 under `mpirun`, four ranks on this node.
//! let env = |name: &str| match name {
//!     "OMPI_COMM_WORLD_RANK" => Some("3".to_string()),
//!     "OMPI_COMM_WORLD_SIZE" => Some("8".to_string()),
//!     "OMPI_COMM_WORLD_LOCAL_RANK" => Some("3".to_string()),
//!     "OMPI_COMM_WORLD_LOCAL_SIZE" => Some("4".to_string()),
//!     _ => None,
//! };
//! let p = detect(&env)?;
//! assert_eq!((p.launcher, p.rank, p.world, p.local), (LauncherKind::OpenMpi, 3, 8, Some((3, 4))));
//! assert!(p.root.is_none()); // Open MPI names no root: ZVERBS_ROOT, or the config's rank 0
//! # Ok::<(), zverbs::bootstrap::launch::LaunchError>(())
//! ```

use std::fmt;

pub mod mpich;
pub mod openmpi;
pub mod pmix;
pub mod slurm;
pub mod torchrun;
pub mod zverbs;

/// Where variables are read from: the process's environment ([`process_env`]) or a
/// recorded one (any `Fn(&str) -> Option<String>`, as tests use).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment, as an [`Env`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Which launcher started the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LauncherKind {
    /// `ZVERBS_RANK` / `ZVERBS_WORLD_SIZE`, set by hand or by a script.
    Zverbs,
    /// torchrun (`torch.distributed.run`) and the tools that follow its convention.
    Torchrun,
    /// Open MPI's `mpirun` / `prterun`.
    OpenMpi,
    /// MPICH's Hydra (`mpiexec`), and the PMI-1/2 launchers that set `PMI_RANK`.
    Mpich,
    /// A PMIx launcher.
    Pmix,
    /// Slurm's `srun`.
    Slurm,
}

impl fmt::Display for LauncherKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LauncherKind::Zverbs => "zverbs (ZVERBS_RANK)",
            LauncherKind::Torchrun => "torchrun",
            LauncherKind::OpenMpi => "Open MPI",
            LauncherKind::Mpich => "MPICH/Hydra",
            LauncherKind::Pmix => "PMIx",
            LauncherKind::Slurm => "Slurm",
        })
    }
}

/// Where the rendezvous root listens: a host (name or address) and a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for Root {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A process's place in its world, as its launcher gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The launcher whose variables gave the rank.
    pub launcher: LauncherKind,
    /// This process's rank, below `world`.
    pub rank: u32,
    /// Ranks in the world.
    pub world: u32,
    /// Rank among the world's processes on this node, and how many there are, where the
    /// launcher says.
    pub local: Option<(u32, u32)>,
    /// Where the rendezvous root listens, where the launcher (or `ZVERBS_ROOT`) says.
    pub root: Option<Root>,
}

/// Why the environment gives no place.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaunchError {
    /// No launcher's variables are set.
    NoLauncher,
    /// A variable the launcher always sets is missing (`what` says which, or what is
    /// missing where no variable holds it).
    Missing {
        /// The launcher.
        launcher: LauncherKind,
        /// The variable, or the value with no variable.
        what: &'static str,
    },
    /// A variable does not hold what it should.
    Malformed {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A rank at or past the world size, or a local rank at or past the local size.
    OutOfRange {
        /// The launcher.
        launcher: LauncherKind,
        /// What is out of range (`"rank"`, `"local rank"`).
        what: &'static str,
        /// Its value.
        value: u32,
        /// The size it must be below.
        size: u32,
    },
    /// Two launchers of one level give different ranks or world sizes.
    Disagree {
        /// The one taken first.
        first: LauncherKind,
        /// The other.
        second: LauncherKind,
        /// What they disagree on (`"rank"`, `"world size"`).
        what: &'static str,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::NoLauncher => f.write_str(
                "no launcher found: none of ZVERBS_RANK, RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK, \
                 PMI_RANK, PMIX_RANK or SLURM_PROCID is set",
            ),
            LaunchError::Missing { launcher, what } => {
                write!(f, "{launcher}: {what} is missing")
            }
            LaunchError::Malformed {
                variable,
                value,
                expected,
            } => write!(f, "{variable}={value:?} is not {expected}"),
            LaunchError::OutOfRange {
                launcher,
                what,
                value,
                size,
            } => write!(f, "{launcher}: {what} {value} is not below {size}"),
            LaunchError::Disagree {
                first,
                second,
                what,
            } => write!(f, "{first} and {second} give different {what}s"),
        }
    }
}

impl std::error::Error for LaunchError {}

/// One launcher's convention.
pub trait Launcher {
    /// Which launcher.
    fn kind(&self) -> LauncherKind;
    /// Whether `env` holds the variable that marks this launcher.
    fn present(&self, env: Env<'_>) -> bool;
    /// The process's place, from `env` (which [`present`](Self::present) accepted).
    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError>;
}

/// The process's place, from the launcher that started it (see the module docs for which
/// speaks when several are present), with `ZVERBS_ROOT` over its root.
///
/// # Errors
/// [`LaunchError::NoLauncher`] when none is present; the launcher's own error otherwise
/// (a missing or malformed variable, a rank out of range); [`LaunchError::Disagree`] when
/// Open MPI and MPICH variables are both set and differ.
pub fn detect(env: Env<'_>) -> Result<Placement, LaunchError> {
    let order: [&dyn Launcher; 6] = [
        &zverbs::Zverbs,
        &torchrun::Torchrun,
        &openmpi::OpenMpi,
        &mpich::Mpich,
        &pmix::Pmix,
        &slurm::Slurm,
    ];
    let first = order
        .iter()
        .position(|l| l.present(env))
        .ok_or(LaunchError::NoLauncher)?;
    let mut p = order[first].placement(env)?;
    // Open MPI and MPICH are one level: neither runs inside the other.
    if p.launcher == LauncherKind::OpenMpi && mpich::Mpich.present(env) {
        let other = mpich::Mpich.placement(env)?;
        agree(&p, &other)?;
    }
    if let Some(root) = zverbs::root(env)? {
        p.root = Some(root);
    }
    Ok(p)
}

/// [`detect`] on the process's environment.
///
/// # Errors
/// As [`detect`].
pub fn from_process() -> Result<Placement, LaunchError> {
    detect(&process_env)
}

/// The id that keeps two runs meeting at one root apart ([`Rendezvous::id`]):
/// `ZVERBS_RUN_ID`, else Slurm's `SLURM_JOB_ID`, else 0 (then two runs at one port mix:
/// give them different ports).
///
/// [`Rendezvous::id`]: super::Rendezvous::id
///
/// # Errors
/// [`LaunchError::Malformed`] for a value that is no 64-bit number.
pub fn run_id(env: Env<'_>) -> Result<u64, LaunchError> {
    for variable in ["ZVERBS_RUN_ID", "SLURM_JOB_ID"] {
        if let Some(v) = env(variable) {
            return v.trim().parse().map_err(|_| LaunchError::Malformed {
                variable,
                value: v,
                expected: "a number below 2^64",
            });
        }
    }
    Ok(0)
}

fn agree(a: &Placement, b: &Placement) -> Result<(), LaunchError> {
    let what = if a.rank != b.rank {
        "rank"
    } else if a.world != b.world {
        "world size"
    } else {
        return Ok(());
    };
    Err(LaunchError::Disagree {
        first: a.launcher,
        second: b.launcher,
        what,
    })
}

/// `variable` as a number, if set.
pub(crate) fn number(env: Env<'_>, variable: &'static str) -> Result<Option<u32>, LaunchError> {
    match env(variable) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| LaunchError::Malformed {
                variable,
                value: v,
                expected: "a number below 2^32",
            }),
    }
}

/// `variable` as a number, which `launcher` always sets.
pub(crate) fn required(
    env: Env<'_>,
    launcher: LauncherKind,
    variable: &'static str,
) -> Result<u32, LaunchError> {
    number(env, variable)?.ok_or(LaunchError::Missing {
        launcher,
        what: variable,
    })
}

/// A placement of `rank` in `world`, with the local rank and size where both are known;
/// each checked against its size.
pub(crate) fn placed(
    launcher: LauncherKind,
    rank: u32,
    world: u32,
    local: (Option<u32>, Option<u32>),
    root: Option<Root>,
) -> Result<Placement, LaunchError> {
    let out_of_range = |what, value, size| LaunchError::OutOfRange {
        launcher,
        what,
        value,
        size,
    };
    if rank >= world {
        return Err(out_of_range("rank", rank, world));
    }
    let local = match local {
        (Some(r), Some(n)) if r >= n => return Err(out_of_range("local rank", r, n)),
        (Some(r), Some(n)) => Some((r, n)),
        _ => None,
    };
    Ok(Placement {
        launcher,
        rank,
        world,
        local,
        root,
    })
}

/// `host:port` (or `[v6]:port`) in `variable`.
pub(crate) fn host_port(variable: &'static str, value: String) -> Result<Root, LaunchError> {
    let malformed = |value| LaunchError::Malformed {
        variable,
        value,
        expected: "host:port",
    };
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(malformed(value));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match port.parse::<u16>() {
        Ok(port) if port != 0 && !host.is_empty() => Ok(Root {
            host: host.to_string(),
            port,
        }),
        _ => Err(malformed(value)),
    }
}
