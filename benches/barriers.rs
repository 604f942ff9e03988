//! The three barrier algorithms of `Node` at N = 2, 4, 8, 16, 32, 64 ranks, one thread per
//! rank, over the (untimed) simulator.
//!
//! ```text
//! cargo bench --features sim --bench barriers              # add `-- --quick` for a rougher, faster run
//! ```
//!
//! `barrier_64_ranks_cq_layout/*` runs a 64-rank dissemination barrier with the node's data
//! channels on shared completion queues (4 per node with the barrier queue pairs' two)
//! and on two queues per channel (128 per node), in the same run. The layout is the data
//! channels' only: barrier queue pairs always complete on the node's own two queues.
//!
//! One iteration is one `barrier_all` on every rank; the figure is the slowest rank's time
//! per barrier. **This machine has 2 cores**: from N = 4 on, the ranks' threads outnumber
//! the cores and the figures measure the OS scheduler (every barrier needs every rank to
//! run) as much as the algorithms. For the algorithms' own scaling see
//! `examples/barrier_scale.rs` (simulated time, stepped mode). Every rank's measured loop
//! runs with its allocations counted and panics if a barrier allocated.

mod common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};
use zverbs::node::{barrier::Algorithm, Node, NodeConfig};
use zverbs::provider::sim::Sim;
use zverbs::{ChannelConfig, Context, CqLayout};

use common::{assert_no_allocs, count_allocs, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Capacity of the nodes (the largest world benchmarked).
const CAP: usize = 64;
/// Small rings: barrier traffic uses the node's own control queue pairs; the data
/// channels only need to exist.
type BNode = Node<Sim, CAP, 8, 1>;

const SIZES: [usize; 6] = [2, 4, 8, 16, 32, 64];
const ALGORITHMS: [(Algorithm, &str); 3] = [
    (Algorithm::Centralized, "centralized"),
    (Algorithm::Dissemination, "dissemination"),
    (Algorithm::BinaryTree, "binary_tree"),
];

/// `n` connected nodes on one untimed simulator, rank `i` on device `sim{i}`, their
/// channels on completion queues laid out by `layout`.
fn world(n: usize, algorithm: Algorithm, layout: CqLayout) -> Vec<BNode> {
    let cfg = NodeConfig {
        algorithm,
        barrier_timeout: Some(Duration::from_secs(120)),
        channel: ChannelConfig {
            completion_queues: layout,
            ..ChannelConfig::default()
        },
        ..NodeConfig::default()
    };
    let sim = Sim::with_devices(n);
    let prepared: Vec<_> = (0..n)
        .map(|r| {
            let ctx = Context::open(&sim, &format!("sim{r}")).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            BNode::prepare(&ctx, &pd, r, n, &cfg).unwrap()
        })
        .collect();
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|p| (0..n).map(|peer| p.endpoints(peer).ok()).collect())
        .collect();
    prepared
        .into_iter()
        .enumerate()
        .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
        .collect()
}

/// Every node runs `iters` barriers on its own thread; returns the slowest rank's time.
fn run(nodes: &mut [BNode], iters: u64) -> Duration {
    let start = Barrier::new(nodes.len());
    std::thread::scope(|t| {
        let hs: Vec<_> = nodes
            .iter_mut()
            .map(|node| {
                let start = &start;
                t.spawn(move || {
                    start.wait();
                    let (elapsed, allocs) = count_allocs(|| {
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            node.barrier_all().unwrap();
                        }
                        t0.elapsed()
                    });
                    assert_no_allocs("barrier_all", allocs);
                    elapsed
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .max()
            .unwrap_or_default()
    })
}

fn barriers(c: &mut Criterion) {
    for (algorithm, name) in ALGORITHMS {
        let mut g = c.benchmark_group(format!("barrier/{name}"));
        g.sample_size(10);
        g.sampling_mode(SamplingMode::Flat);
        for n in SIZES {
            let mut nodes = world(n, algorithm, CqLayout::Shared);
            g.bench_with_input(BenchmarkId::new("ranks", n), &n, |b, _| {
                b.iter_custom(|iters| run(&mut nodes, iters))
            });
        }
        g.finish();
    }
    // The same 64-rank barrier with two completion queues per data channel (2 × 63 + 2
    // per node) against the shared layout (4 per node), in one run.
    let mut g = c.benchmark_group("barrier_64_ranks_cq_layout");
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    for (layout, name) in [
        (CqLayout::Shared, "shared_4_cqs_per_node"),
        (CqLayout::PerChannel, "per_channel_128_cqs_per_node"),
    ] {
        let mut nodes = world(64, Algorithm::Dissemination, layout);
        g.bench_function(name, |b| b.iter_custom(|iters| run(&mut nodes, iters)));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = barriers
}
criterion_main!(benches);
