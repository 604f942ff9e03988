//! Run under a launcher (`srun`, `mpirun`, `mpiexec`, torchrun, or `ZVERBS_*` by hand):
//! finds this process's rank, world and root in the environment, gathers one payload per
//! rank through the root rendezvous, and prints one line:
//!
//! ```text
//! bootstrap_check rank=R world=W launcher=NAME digest=HEX
//! ```
//!
//! Every rank prints the same digest (of the whole gathered table) when the bootstrap
//! worked; `scripts/launcher-test.sh` runs it under Open MPI, MPICH and Slurm and checks
//! that. The run id that keeps two runs apart is `ZVERBS_RUN_ID`, else `SLURM_JOB_ID`,
//! else 0.
//!
//! ```text
//! mpirun -n 4 -x ZVERBS_ROOT=127.0.0.1:29600 target/release/examples/bootstrap_check
//! ```

use std::process::ExitCode;
use std::time::Duration;

use zverbs::bootstrap::launch;
use zverbs::bootstrap::Rendezvous;

const TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bootstrap_check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let place = launch::from_process()?;
    let id = ["ZVERBS_RUN_ID", "SLURM_JOB_ID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(0u64);
    let rv = Rendezvous::for_placement(&place, id)?;
    let mine = format!(
        "rank {} of {} (pid {})",
        place.rank,
        place.world,
        std::process::id()
    );
    let table = rv.all_gather(place.rank, mine.as_bytes(), TIMEOUT)?;
    // Each rank's entry names its rank: the table is in rank order.
    for (r, entry) in table.iter().enumerate() {
        let text = String::from_utf8_lossy(entry);
        if !text.starts_with(&format!("rank {r} of {} ", place.world)) {
            return Err(format!("entry {r} is {text:?}").into());
        }
    }
    Ok(format!(
        "bootstrap_check rank={} world={} launcher={:?} digest={:016x}",
        place.rank,
        place.world,
        place.launcher,
        fnv1a(&table)
    ))
}

/// FNV-1a over the entries, each preceded by its length.
fn fnv1a(table: &[Vec<u8>]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for entry in table {
        for b in (entry.len() as u64).to_le_bytes().iter().chain(entry) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
