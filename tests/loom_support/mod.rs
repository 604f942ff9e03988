//! What the loom tests over the simulator share: `explore` (bounded runs of a model),
//! `scoped` (`std::thread::scope` for loom) and `star` (a root's `MultiChannel` connected to
//! two leaves on one simulated fabric).
#![allow(dead_code)]

/// Runs `f` under loom once per pass `(preemption bound, executions)`: `None` explores the
/// bound's whole space, `Some(n)` the first `n` executions, depth-first from the
/// non-preemptive schedule. `LOOM_MAX_PERMUTATIONS` replaces the caps of the bound-1 passes
/// (a soak); `LOOM_MAX_PREEMPTIONS` replaces all passes by one at that bound, with
/// `LOOM_MAX_PERMUTATIONS` or the largest cap (none if no pass has one).
///
/// The caps of bound-2 passes stay: with three threads, two of which wait in yield loops
/// for the third, loom charges no preemption for a switch after a yield, so past 100,000
/// executions or so its depth-first order reaches schedules where the two waiters
/// alternate forever while the thread they wait for (runnable, preempted once) never runs
/// again, and the run fails on `max_branches`. Those schedules are unfair, not a livelock:
/// every waiter's loop ends once the third thread runs.
pub fn explore(passes: &[(usize, Option<usize>)], f: impl Fn() + Sync + Send + 'static) {
    let f = std::sync::Arc::new(f);
    let env = loom::model::Builder::new();
    let passes: Vec<(usize, Option<usize>)> = match env.preemption_bound {
        Some(p) => {
            let largest = passes.iter().filter_map(|&(_, c)| c).max();
            vec![(p, env.max_permutations.or(largest))]
        }
        None => passes
            .iter()
            .map(|&(p, c)| match (p, c) {
                (1, Some(c)) => (p, Some(env.max_permutations.unwrap_or(c))),
                _ => (p, c),
            })
            .collect(),
    };
    for (preemptions, cap) in passes {
        let mut b = loom::model::Builder::new();
        // Threads loop (with a loom yield per round) until their completion is routed to
        // them: room for those loops.
        b.max_branches = 100_000;
        b.preemption_bound = Some(preemptions);
        b.max_permutations = cap;
        // loom compares the count with the cap only every `checkpoint_interval` executions
        // (default 20,000): check it every 1,000, so a cap of thousands is the count run.
        b.checkpoint_interval = b.checkpoint_interval.min(1_000);
        let f = f.clone();
        b.check(move || f());
    }
}

/// `std::thread::scope` for loom, which has none: threads spawned on the scope may borrow
/// what lives outside it, and are joined before `scope` returns.
#[cfg(feature = "sim")]
pub mod scoped {
    use core::marker::PhantomData;
    use std::cell::RefCell;

    pub struct Scope<'env> {
        handles: RefCell<Vec<loom::thread::JoinHandle<()>>>,
        _env: PhantomData<&'env mut &'env ()>,
    }

    impl<'env> Scope<'env> {
        pub fn spawn(&self, f: impl FnOnce() + Send + 'env) {
            let f: Box<dyn FnOnce() + Send + 'env> = Box::new(f);
            // SAFETY: `scope` joins this thread before it returns, so before 'env ends, and
            // aborts rather than unwind past borrows a running thread may still use.
            let f: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(f) };
            self.handles.borrow_mut().push(loom::thread::spawn(f));
        }
    }

    /// Runs `f`, then joins every thread it spawned on the scope. A panic inside (an
    /// assertion; its message is printed first) aborts the process.
    pub fn scope<'env, R>(f: impl FnOnce(&Scope<'env>) -> R) -> R {
        struct AbortOnUnwind;
        impl Drop for AbortOnUnwind {
            fn drop(&mut self) {
                eprintln!("panic inside a loom scope: aborting (its threads borrow the stack)");
                std::process::abort();
            }
        }
        let guard = AbortOnUnwind;
        let s = Scope {
            handles: RefCell::new(Vec::new()),
            _env: PhantomData,
        };
        let r = f(&s);
        for h in s.handles.take() {
            h.join().unwrap();
        }
        std::mem::forget(guard);
        r
    }
}

/// Rank 0's multi-channel to ranks 1 and 2 (on shared completion queues: the default)
/// and a plain channel on each leaf, all connected; `timeout: None` (loom has no clock).
#[cfg(feature = "sim")]
pub struct Star {
    pub sim: zverbs::provider::sim::Sim,
    pub pds: Vec<zverbs::ProtectionDomain<zverbs::provider::sim::Sim>>,
    pub root: Root,
    pub leaves: Vec<zverbs::Channel<zverbs::provider::sim::Sim, 4, 1>>,
}

#[cfg(feature = "sim")]
pub fn star() -> Star {
    use zverbs::provider::sim::Sim;
    use zverbs::{Channel, ChannelConfig, Context, MultiChannel};

    let sim = Sim::with_devices(3);
    let cfg = ChannelConfig {
        timeout: None,
        ..ChannelConfig::default()
    };
    let ctxs: Vec<_> = (0..3)
        .map(|i| Context::open(&sim, &format!("sim{i}")).unwrap())
        .collect();
    let pds: Vec<_> = ctxs.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let root = MultiChannel::<Sim, 3, 4, 1>::prepare(&ctxs[0], &pds[0], [1, 2], &cfg).unwrap();
    let leaves: Vec<_> = (1..3)
        .map(|i| Channel::<Sim, 4, 1>::prepare(&ctxs[i], &pds[i], &cfg).unwrap())
        .collect();
    let leaf_eps: Vec<_> = leaves.iter().map(|l| l.endpoint()).collect();
    let root_eps: Vec<_> = (1..3).map(|p| root.endpoint(p).unwrap()).collect();
    let root = root
        .connect(|p| leaf_eps.get(p.wrapping_sub(1)).copied())
        .unwrap();
    let leaves = leaves
        .into_iter()
        .zip(&root_eps)
        .map(|(l, e)| l.connect(e).unwrap())
        .collect();
    Star {
        sim,
        pds,
        root,
        leaves,
    }
}

/// The root's multi-channel in a [`Star`].
#[cfg(feature = "sim")]
pub type Root = zverbs::MultiChannel<zverbs::provider::sim::Sim, 3, 4, 1>;

/// Each leaf receives up to 4 bytes in a thread of its own while `send` runs the root's
/// part on this one (given the root and its protection domain); asserts that every one of
/// the root's requests completed, and returns what each leaf received.
#[cfg(feature = "sim")]
pub fn leaves_receive(
    s: &mut Star,
    send: impl FnOnce(&mut Root, &zverbs::ProtectionDomain<zverbs::provider::sim::Sim>),
) -> [[u8; 4]; 2] {
    let (mut in1, mut in2) = ([0u8; 4], [0u8; 4]);
    {
        let mut r1 = s.pds[1].register(&mut in1).unwrap();
        let mut r2 = s.pds[2].register(&mut in2).unwrap();
        let (leaf1, leaf2) = s.leaves.split_at_mut(1);
        let (leaf1, leaf2) = (&mut leaf1[0], &mut leaf2[0]);
        let (r1, r2) = (&mut r1, &mut r2);
        let (root, pd) = (&mut s.root, &s.pds[0]);
        scoped::scope(|t| {
            t.spawn(move || {
                let c = leaf1.receive([r1.slice_mut(..).unwrap()]).unwrap();
                assert_eq!(c.byte_len, 4);
            });
            t.spawn(move || {
                let c = leaf2.receive([r2.slice_mut(..).unwrap()]).unwrap();
                assert_eq!(c.byte_len, 4);
            });
            send(root, pd);
        });
    }
    assert!(s.root.channels_mut().all(|(_, c)| c.in_flight() == (0, 0)));
    [in1, in2]
}
