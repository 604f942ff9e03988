//! Launcher detection (`zverbs::bootstrap::launch`) from recorded environments, one per
//! launcher (`tests/launch/*.env`, with each launcher's documented variable names), and
//! every way an environment can be wrong: each a typed error naming the variable.
#![cfg(feature = "std")]

use std::collections::HashMap;

use zverbs::bootstrap::launch::slurm::root_port;
use zverbs::bootstrap::launch::{detect, LaunchError, LauncherKind, Placement, Root};

/// The variables of `tests/launch/<name>.env` (`KEY=VALUE` lines, `#` comments).
fn recorded(name: &str) -> HashMap<String, String> {
    let path = format!("{}/tests/launch/{name}.env", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn detect_in(vars: &HashMap<String, String>) -> Result<Placement, LaunchError> {
    detect(&|name: &str| vars.get(name).cloned())
}

fn detect_file(name: &str) -> Result<Placement, LaunchError> {
    detect_in(&recorded(name))
}

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn root(host: &str, port: u16) -> Option<Root> {
    Some(Root {
        host: host.to_string(),
        port,
    })
}

#[test]
fn slurm_srun() {
    let p = detect_file("slurm_srun").unwrap();
    assert_eq!(
        p,
        Placement {
            launcher: LauncherKind::Slurm,
            rank: 5,
            world: 8,
            local: Some((1, 4)),
            root: root("gnode10", root_port(200505, 0)),
        }
    );
}

#[test]
fn open_mpi() {
    let p = detect_file("openmpi").unwrap();
    assert_eq!(
        (p.launcher, p.rank, p.world, p.local, p.root),
        (LauncherKind::OpenMpi, 3, 8, Some((3, 4)), None)
    );
}

#[test]
fn open_mpi_inside_a_slurm_batch_script_speaks_over_the_inherited_slurm_rank() {
    let p = detect_file("openmpi_in_sbatch").unwrap();
    assert_eq!(
        (p.launcher, p.rank, p.world, p.local),
        (LauncherKind::OpenMpi, 6, 8, Some((2, 4)))
    );
}

#[test]
fn open_mpi_5_over_pmix_gives_the_size_pmix_does_not() {
    let p = detect_file("prterun").unwrap();
    assert_eq!((p.launcher, p.rank, p.world), (LauncherKind::OpenMpi, 1, 4));
}

#[test]
fn pmix_alone_names_what_is_missing() {
    match detect_file("pmix") {
        Err(LaunchError::Missing {
            launcher: LauncherKind::Pmix,
            what,
        }) => assert!(what.contains("world size"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn mpich_hydra() {
    let p = detect_file("mpich_hydra").unwrap();
    assert_eq!(
        (p.launcher, p.rank, p.world, p.local, p.root),
        (LauncherKind::Mpich, 2, 4, Some((2, 4)), None)
    );
}

#[test]
fn mpich_over_a_pmi_port_has_no_size_but_ours_supply_it() {
    let mut env = recorded("mpich_pmi_port");
    match detect_in(&env) {
        Err(LaunchError::Missing {
            launcher: LauncherKind::Mpich,
            what,
        }) => assert!(what.starts_with("PMI_SIZE"), "{what}"),
        other => panic!("{other:?}"),
    }
    env.extend(vars(&[("ZVERBS_RANK", "1"), ("ZVERBS_WORLD_SIZE", "4")]));
    let p = detect_in(&env).unwrap();
    assert_eq!((p.launcher, p.rank, p.world), (LauncherKind::Zverbs, 1, 4));
}

#[test]
fn torchrun_inside_an_srun_step_speaks_over_the_step() {
    let p = detect_file("torchrun_in_srun").unwrap();
    assert_eq!(
        p,
        Placement {
            launcher: LauncherKind::Torchrun,
            rank: 5,
            world: 8,
            local: Some((1, 4)),
            root: root("n0", 29500),
        }
    );
}

#[test]
fn ours_override_any_launcher() {
    let p = detect_file("zverbs_override").unwrap();
    assert_eq!(
        (p.launcher, p.rank, p.world, p.root),
        (LauncherKind::Zverbs, 2, 3, root("10.0.0.1", 7000))
    );
    // ZVERBS_ROOT alone moves another launcher's root.
    let mut env = recorded("torchrun_in_srun");
    env.insert("ZVERBS_ROOT".into(), "[fd00::1]:7100".into());
    let p = detect_in(&env).unwrap();
    assert_eq!(
        (p.launcher, p.root),
        (LauncherKind::Torchrun, root("fd00::1", 7100))
    );
}

#[test]
fn bad_environments_are_typed_errors_naming_the_variable() {
    let malformed = |e: Result<Placement, LaunchError>, var: &str| match e {
        Err(LaunchError::Malformed { variable, .. }) => assert_eq!(variable, var),
        other => panic!("{var}: {other:?}"),
    };
    assert_eq!(
        detect_in(&vars(&[("PATH", "/bin")])),
        Err(LaunchError::NoLauncher)
    );
    malformed(
        detect_in(&vars(&[
            ("OMPI_COMM_WORLD_RANK", "three"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
        ])),
        "OMPI_COMM_WORLD_RANK",
    );
    malformed(
        detect_in(&vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "-4")])),
        "PMI_SIZE",
    );
    malformed(
        detect_in(&vars(&[
            ("ZVERBS_RANK", "0"),
            ("ZVERBS_WORLD_SIZE", "2"),
            ("ZVERBS_ROOT", "nohost"),
        ])),
        "ZVERBS_ROOT",
    );
    malformed(
        detect_in(&vars(&[
            ("ZVERBS_RANK", "0"),
            ("ZVERBS_WORLD_SIZE", "2"),
            ("ZVERBS_ROOT", "h:0"),
        ])),
        "ZVERBS_ROOT",
    );
    malformed(
        detect_in(&vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "70000"),
        ])),
        "MASTER_PORT",
    );
    malformed(
        detect_in(&vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_TASKS_PER_NODE", "2(x"),
        ])),
        "SLURM_TASKS_PER_NODE",
    );
    assert_eq!(
        detect_in(&vars(&[("SLURM_PROCID", "8"), ("SLURM_NTASKS", "8")])),
        Err(LaunchError::OutOfRange {
            launcher: LauncherKind::Slurm,
            what: "rank",
            value: 8,
            size: 8
        })
    );
    assert_eq!(
        detect_in(&vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "4"),
            ("LOCAL_WORLD_SIZE", "4")
        ])),
        Err(LaunchError::OutOfRange {
            launcher: LauncherKind::Torchrun,
            what: "local rank",
            value: 4,
            size: 4
        })
    );
    assert_eq!(
        detect_in(&vars(&[("ZVERBS_RANK", "1")])),
        Err(LaunchError::Missing {
            launcher: LauncherKind::Zverbs,
            what: "ZVERBS_WORLD_SIZE"
        })
    );
    assert_eq!(
        detect_in(&vars(&[("SLURM_PROCID", "1")])),
        Err(LaunchError::Missing {
            launcher: LauncherKind::Slurm,
            what: "SLURM_NTASKS"
        })
    );
}

#[test]
fn two_mpi_launchers_that_disagree_are_an_error() {
    let both = |pmi_rank| {
        detect_in(&vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMI_RANK", pmi_rank),
            ("PMI_SIZE", "4"),
        ]))
    };
    assert_eq!(both("1").map(|p| p.rank), Ok(1));
    assert_eq!(
        both("2"),
        Err(LaunchError::Disagree {
            first: LauncherKind::OpenMpi,
            second: LauncherKind::Mpich,
            what: "rank"
        })
    );
    // The error reads as a sentence naming both.
    let e = both("2").unwrap_err().to_string();
    assert!(e.contains("Open MPI") && e.contains("MPICH"), "{e}");
}

/// The run id: `ZVERBS_RUN_ID`, else Slurm's job id, else 0; a malformed one named.
#[test]
fn the_run_id_comes_from_zverbs_or_slurm() {
    use zverbs::bootstrap::launch::run_id;
    let id = |pairs: &[(&str, &str)]| {
        let v = vars(pairs);
        run_id(&|name: &str| v.get(name).cloned())
    };
    assert_eq!(id(&[]), Ok(0));
    assert_eq!(id(&[("SLURM_JOB_ID", "4242")]), Ok(4242));
    assert_eq!(
        id(&[("SLURM_JOB_ID", "4242"), ("ZVERBS_RUN_ID", "7")]),
        Ok(7)
    );
    assert_eq!(
        id(&[("ZVERBS_RUN_ID", "seven")]),
        Err(LaunchError::Malformed {
            variable: "ZVERBS_RUN_ID",
            value: "seven".into(),
            expected: "a number below 2^64",
        })
    );
}

/// A `Bootstrap` from each recorded environment that names a root; the typed errors of
/// one that names none, or gives no place.
#[test]
fn a_bootstrap_comes_from_the_environment_in_one_call() {
    use zverbs::bootstrap::{Bootstrap, ExchangeError, Meeting};
    let from = |v: &HashMap<String, String>| Bootstrap::from_env_of(&|n: &str| v.get(n).cloned());
    let mut torchrun = recorded("torchrun_in_srun");
    assert!(matches!(
        from(&torchrun),
        Err(ExchangeError::Unresolved { root, .. }) if root == "n0:29500"
    ));
    torchrun.insert("MASTER_ADDR".into(), "127.0.0.1".into());
    let b = from(&torchrun).unwrap();
    let p = detect_in(&torchrun).unwrap();
    assert_eq!((b.rank, b.world), (p.rank, p.world));
    let Meeting::Rendezvous(rv) = b.meeting else {
        panic!("a launcher's bootstrap meets at a rendezvous")
    };
    assert_eq!((rv.root.port(), rv.world), (p.root.unwrap().port, p.world));

    let mut mpi = recorded("openmpi");
    assert!(matches!(from(&mpi), Err(ExchangeError::NoRoot)));
    mpi.insert("ZVERBS_ROOT".into(), "127.0.0.1:29600".into());
    mpi.insert("ZVERBS_RUN_ID".into(), "99".into());
    let Meeting::Rendezvous(rv) = from(&mpi).unwrap().meeting else {
        panic!("a rendezvous")
    };
    assert_eq!(
        (rv.root.to_string().as_str(), rv.id),
        ("127.0.0.1:29600", 99)
    );
    assert!(matches!(
        from(&HashMap::new()),
        Err(ExchangeError::Launch(LaunchError::NoLauncher))
    ));
}
