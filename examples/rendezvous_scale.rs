//! Times the bootstrap's two ways to gather one payload per rank, in one process on
//! 127.0.0.1, rank `r` a thread: the root rendezvous (`Rendezvous::all_gather`, `N - 1`
//! connections, all at rank 0) against the all-to-all exchanger (`exchange`, one
//! connection per pair of ranks), for worlds of 2 to 1,024 ranks (the exchanger up to
//! 64: its `N(N - 1) / 2` connections take a thread at each end).
//!
//! ```text
//! cargo run --release --example rendezvous_scale [ROUNDS]
//! ```
//!
//! Prints one line per world and method: the median wall time of `ROUNDS` (default 5)
//! gathers, from the first call to the last return, and the connections opened.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use zverbs::bootstrap::{exchange_with_listener, NetworkConfig, Rendezvous};

const TIMEOUT: Duration = Duration::from_secs(60);
/// A payload the size of a node's encoded endpoints at a few peers.
const PAYLOAD: usize = 64;

/// The bootstrap's rendezvous against a full TCP exchange, by world size: median time and
/// connections.
#[derive(clap::Parser)]
#[command(name = "rendezvous_scale")]
struct Cli {
    /// Rounds per point (the median is printed)
    #[arg(default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    rounds: usize,
}

fn main() {
    let rounds = <Cli as clap::Parser>::parse().rounds;
    println!(
        "{:>6}  {:<10}  {:>12}  {:>11}",
        "ranks", "method", "median", "connections"
    );
    for world in [2u32, 8, 32, 64, 128, 512, 1024] {
        let t = median(rounds, || rendezvous(world));
        println!(
            "{world:>6}  {:<10}  {:>12?}  {:>11}",
            "rendezvous",
            t,
            world - 1
        );
        if world <= 64 {
            let t = median(rounds, || all_to_all(world));
            let pairs = u64::from(world) * u64::from(world - 1) / 2;
            println!("{world:>6}  {:<10}  {:>12?}  {:>11}", "exchange", t, pairs);
        }
    }
}

fn median(rounds: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..rounds).map(|_| f()).collect();
    times.sort();
    times[times.len() / 2]
}

fn payload(rank: u32) -> Vec<u8> {
    vec![rank as u8; PAYLOAD]
}

/// One rendezvous of `world` ranks; its wall time.
fn rendezvous(world: u32) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let rv = Rendezvous {
        root: listener.local_addr().expect("addr"),
        id: 1,
        world,
    };
    let start = Instant::now();
    thread::scope(|s| {
        // The root first, as a launcher's rank 0 would be up before most ranks dial.
        let listener = &listener;
        s.spawn(move || {
            rv.all_gather_on(listener, &payload(0), TIMEOUT)
                .expect("root")
        });
        for r in 1..world {
            thread::Builder::new()
                .stack_size(256 << 10)
                .spawn_scoped(s, move || {
                    rv.all_gather(r, &payload(r), TIMEOUT).expect("rank");
                })
                .expect("thread");
        }
    });
    start.elapsed()
}

/// One all-to-all exchange of `world` ranks; its wall time.
fn all_to_all(world: u32) -> Duration {
    let listeners: Vec<TcpListener> = (0..world)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let addrs = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr"))
        .collect();
    let config = NetworkConfig::from_addrs(addrs).expect("config");
    let start = Instant::now();
    thread::scope(|s| {
        for (r, l) in (0u32..).zip(&listeners) {
            let config = &config;
            thread::Builder::new()
                .stack_size(256 << 10)
                .spawn_scoped(s, move || {
                    exchange_with_listener(config, r, l, &payload(r), TIMEOUT).expect("rank");
                })
                .expect("thread");
        }
    });
    start.elapsed()
}
