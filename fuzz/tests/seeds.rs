//! Runs every committed seed (and any `crash-*` reproducer) of each target through its
//! function: the fuzz targets as plain tests, no cargo-fuzz needed.
//!
//! `FUZZ_SEEDS_EXTRA=dir` also runs every file of `dir/<target>/` (e.g. a fuzzing corpus).

use std::path::{Path, PathBuf};

fn files(target: &str) -> Vec<PathBuf> {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target)];
    if let Some(extra) = std::env::var_os("FUZZ_SEEDS_EXTRA") {
        dirs.push(Path::new(&extra).join(target));
    }
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        out.extend(
            entries
                .map(|e| e.expect("dir entry").path())
                .filter(|p| p.is_file()),
        );
    }
    out.sort();
    out
}

fn run_all(target: &str, f: fn(&[u8])) {
    let files = files(target);
    assert!(!files.is_empty(), "no seeds for {target}");
    for path in &files {
        let data = std::fs::read(path).expect("read seed");
        eprintln!("{target}: {}", path.display());
        f(&data);
    }
    eprintln!("{target}: {} inputs ok", files.len());
}

#[test]
fn endpoint_decode_seeds() {
    run_all("endpoint_decode", zverbs_fuzz::endpoint::check);
}

#[test]
fn sim_ops_seeds() {
    run_all("sim_ops", zverbs_fuzz::sim_ops::run_bytes);
}

#[test]
fn exchange_frame_seeds() {
    run_all("exchange_frame", zverbs_fuzz::exchange_frame::check);
}

#[test]
fn network_config_seeds() {
    run_all("network_config", zverbs_fuzz::network_config::check);
}

#[test]
fn rpc_header_seeds() {
    run_all("rpc_header", zverbs_fuzz::rpc_header::check);
}
