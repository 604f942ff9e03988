//! Slurm's `srun` (`srun(1)`, OUTPUT ENVIRONMENT VARIABLES,
//! <https://slurm.schedmd.com/srun.html>): the rank is `SLURM_PROCID`, the world
//! `SLURM_NTASKS` (`SLURM_NPROCS` on older releases), the local rank `SLURM_LOCALID`; the
//! local size is `SLURM_NTASKS_PER_NODE` where set, else this node's entry
//! (`SLURM_NODEID`) of `SLURM_TASKS_PER_NODE` (`2(x3),1`: two tasks on each of three
//! nodes, then one).
//!
//! The root is the first host of the step's node list (`SLURM_STEP_NODELIST`, else the
//! job's) on a port every task of the step derives alike from `SLURM_JOB_ID` and
//! `SLURM_STEP_ID` ([`root_port`]): in `20000..32000`, below Linux's ephemeral ports, so
//! two steps of one job, or two jobs, meet at different ports.

use super::{number, placed, required, Env, LaunchError, Launcher, LauncherKind, Placement, Root};

/// `SLURM_PROCID`.
pub struct Slurm;

const KIND: LauncherKind = LauncherKind::Slurm;

/// The first port [`root_port`] gives.
pub const ROOT_PORT_BASE: u16 = 20_000;
/// How many ports [`root_port`] spreads over.
pub const ROOT_PORT_SPAN: u16 = 12_000;

impl Launcher for Slurm {
    fn kind(&self) -> LauncherKind {
        KIND
    }

    fn present(&self, env: Env<'_>) -> bool {
        env("SLURM_PROCID").is_some()
    }

    fn placement(&self, env: Env<'_>) -> Result<Placement, LaunchError> {
        let rank = required(env, KIND, "SLURM_PROCID")?;
        let world = match (number(env, "SLURM_NTASKS")?, number(env, "SLURM_NPROCS")?) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => {
                return Err(LaunchError::Missing {
                    launcher: KIND,
                    what: "SLURM_NTASKS",
                })
            }
        };
        let local_size = match number(env, "SLURM_NTASKS_PER_NODE")? {
            Some(n) => Some(n),
            None => match (env("SLURM_TASKS_PER_NODE"), number(env, "SLURM_NODEID")?) {
                (Some(list), Some(node)) => Some(tasks_on_node(&list, node)?),
                _ => None,
            },
        };
        let local = (number(env, "SLURM_LOCALID")?, local_size);
        placed(KIND, rank, world, local, root(env)?)
    }
}

/// The root: the first host of the step's node list, at [`root_port`].
fn root(env: Env<'_>) -> Result<Option<Root>, LaunchError> {
    let list = [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]
    .into_iter()
    .find_map(|v| env(v).map(|l| (v, l)));
    let (Some((variable, list)), Some(job)) = (list, number(env, "SLURM_JOB_ID")?) else {
        return Ok(None);
    };
    let step = number(env, "SLURM_STEP_ID")?.unwrap_or(0);
    let host = first_host(&list).ok_or(LaunchError::Malformed {
        variable,
        value: list.clone(),
        expected: "a Slurm host list",
    })?;
    Ok(Some(Root {
        host,
        port: root_port(job, step),
    }))
}

/// The rendezvous port of step `step` of job `job`: the same on every task of the step.
pub fn root_port(job: u32, step: u32) -> u16 {
    let mix = (u64::from(job) * 31 + u64::from(step)) % u64::from(ROOT_PORT_SPAN);
    ROOT_PORT_BASE + mix as u16
}

/// The first host of a Slurm host list (`node[01-04,07],gpu[1-2]` → `node01`): each
/// bracket group gives its first number, padding kept; `None` for an empty list.
pub fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let mut first = true;
                for d in chars.by_ref() {
                    match d {
                        ']' => break,
                        '-' | ',' => first = false,
                        d if first => host.push(d),
                        _ => {}
                    }
                }
            }
            c => host.push(c),
        }
    }
    (!host.is_empty()).then_some(host)
}

/// Node `node`'s entry of `SLURM_TASKS_PER_NODE` (`2(x3),1`), read without expanding the
/// repetitions (a count is never allocated).
fn tasks_on_node(list: &str, node: u32) -> Result<u32, LaunchError> {
    let malformed = || LaunchError::Malformed {
        variable: "SLURM_TASKS_PER_NODE",
        value: list.to_string(),
        expected: "counts like 2(x3),1",
    };
    let mut before = 0u64;
    for item in list.split(',') {
        let (tasks, times) = match item.split_once("(x") {
            Some((t, r)) => (t, r.strip_suffix(')').ok_or_else(malformed)?),
            None => (item, "1"),
        };
        let tasks: u32 = tasks.trim().parse().map_err(|_| malformed())?;
        let times: u64 = times.trim().parse().map_err(|_| malformed())?;
        // Saturating: counts are the environment's, and a sum past 2^64 is past any node.
        before = before.saturating_add(times);
        if u64::from(node) < before {
            return Ok(tasks);
        }
    }
    Err(LaunchError::OutOfRange {
        launcher: KIND,
        what: "SLURM_NODEID",
        value: node,
        size: u32::try_from(before).unwrap_or(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_hosts_of_host_lists() {
        for (list, host) in [
            ("gnode[10,20,25,37]", "gnode10"),
            ("node[001-004]", "node001"),
            ("node[01-04,07],gpu[1-2]", "node01"),
            ("rack[1-2]-node[08-09]", "rack1-node08"),
            ("single", "single"),
            ("a,b", "a"),
        ] {
            assert_eq!(first_host(list).as_deref(), Some(host), "{list}");
        }
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("[]"), None);
    }

    #[test]
    fn tasks_per_node_is_read_at_the_node() {
        let list = "2(x3),1";
        let got: Vec<_> = (0..4).map(|n| tasks_on_node(list, n).unwrap()).collect();
        assert_eq!(got, [2, 2, 2, 1]);
        assert!(tasks_on_node(list, 4).is_err());
        // A repetition count too large to expand is read, not expanded.
        assert_eq!(tasks_on_node("8(x4000000000)", 3_999_999_999), Ok(8));
        // Counts whose sum passes 2^64 saturate rather than wrap (or panic).
        let huge = "1(x5),2(x18446744073709551615)";
        assert_eq!(tasks_on_node(huge, 10), Ok(2));
        assert_eq!(tasks_on_node(huge, u32::MAX), Ok(2));
        assert!(tasks_on_node("2(x3", 0).is_err());
        assert!(tasks_on_node("two", 0).is_err());
    }

    #[test]
    fn steps_and_jobs_meet_at_different_ports_in_range() {
        let ports = [root_port(1, 0), root_port(1, 1), root_port(2, 0)];
        assert!(ports[0] != ports[1] && ports[0] != ports[2]);
        let top = ROOT_PORT_BASE + ROOT_PORT_SPAN;
        assert!((0..1000).all(|j| (ROOT_PORT_BASE..top).contains(&root_port(j * 7919, j))));
    }
}
