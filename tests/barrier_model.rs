//! Model test of the barrier state machines over a deterministic, adversarial network.
//!
//! Each case picks an algorithm, `P` in 1..=64 participants out of ranks 0..128 (so ranks
//! are not contiguous), and a seed that drives per-participant start delays and the
//! delivery order: at every step one in-flight message, chosen at random, is delivered
//! (through its 8-byte wire form). Participants run three consecutive barriers; fast ones
//! start epoch `e+1` the moment they complete `e`, while slow ones are still finishing `e`.
//!
//! Checked: no participant completes epoch `e` before every participant has started `e`;
//! everyone completes every epoch exactly once (a completed epoch never reverts); every
//! message is accepted; per epoch, the message count equals the algorithm's formula. With
//! one participant that never starts, the network quiesces with nobody complete. With unit
//! latency and simultaneous starts, the last completion happens at exactly
//! [`rounds`](zverbs::node::barrier::rounds).
//!
//! Cases: 5,000 per property by default (under 10 s in a debug build); soak with
//! `PROPTEST_CASES=100000 cargo test --release --test barrier_model`.

use proptest::prelude::*;
use zverbs::node::barrier::{rounds, Algorithm, BarrierMachine, Msg};

const CAP: usize = 64;
const EPOCHS: u32 = 3;
const ALGS: [Algorithm; 3] = [
    Algorithm::Centralized,
    Algorithm::Dissemination,
    Algorithm::BinaryTree,
];

/// SplitMix64: the simulator's only source of randomness, seeded by proptest.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Messages per epoch, from the algorithm's definition.
fn expected_messages(alg: Algorithm, p: usize) -> usize {
    let log = if p <= 1 {
        0
    } else {
        (usize::BITS - (p - 1).leading_zeros()) as usize
    };
    match alg {
        Algorithm::Dissemination => p * log,
        Algorithm::Centralized | Algorithm::BinaryTree => 2 * (p - 1),
    }
}

/// The simulated world: one machine per participant and the messages in flight.
struct World {
    ranks: Vec<u32>,
    machines: Vec<BarrierMachine<CAP>>,
    /// (from rank, to rank, message).
    in_flight: Vec<(u32, u32, Msg)>,
    /// Participants that have started epoch `e`, by `e`.
    started: Vec<usize>,
    /// Messages sent for epoch `e`, by `e`.
    sent: Vec<usize>,
    /// Completions of epoch `e` by participant `i`: `completions[i][e]`.
    completions: Vec<Vec<u32>>,
    /// What each participant looked like after its last call: (epoch, complete).
    seen: Vec<(u32, bool)>,
}

impl World {
    fn new(alg: Algorithm, ranks: &[u32]) -> Self {
        let n = EPOCHS as usize + 2;
        World {
            ranks: ranks.to_vec(),
            machines: ranks
                .iter()
                .map(|&r| BarrierMachine::new(alg, r, ranks).unwrap())
                .collect(),
            in_flight: Vec::new(),
            started: vec![0; n],
            sent: vec![0; n],
            completions: vec![vec![0; n]; ranks.len()],
            seen: vec![(0, true); ranks.len()],
        }
    }

    fn index(&self, rank: u32) -> usize {
        self.ranks
            .binary_search(&rank)
            .expect("sent to a non-participant")
    }

    /// Runs `f` on participant `i`, queues what it sends, and checks its state change.
    /// Returns the epoch it completed, if it completed one.
    fn call(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut BarrierMachine<CAP>, &mut dyn FnMut(u32, Msg)),
    ) -> Result<Option<u32>, TestCaseError> {
        let me = self.ranks[i];
        let mut out = Vec::new();
        f(&mut self.machines[i], &mut |to, msg| out.push((to, msg)));
        let (epoch, complete) = (self.machines[i].epoch(), self.machines[i].is_complete());
        for (to, msg) in out {
            prop_assert!(to != me, "rank {} sent to itself", me);
            self.index(to);
            prop_assert_eq!(msg.epoch, epoch, "sent for an epoch it is not in");
            self.sent[msg.epoch as usize] += 1;
            self.in_flight.push((me, to, msg));
        }
        let (was_epoch, was_complete) = self.seen[i];
        self.seen[i] = (epoch, complete);
        prop_assert!(epoch == was_epoch || epoch == was_epoch + 1, "epoch jumped");
        if epoch == was_epoch {
            prop_assert!(
                !was_complete || complete,
                "rank {} un-completed epoch {}",
                me,
                epoch
            );
            if was_complete || !complete {
                return Ok(None);
            }
        } else {
            prop_assert!(was_complete, "started before completing");
            self.started[epoch as usize] += 1;
            if !complete {
                return Ok(None);
            }
        }
        // Completed `epoch` in this call.
        prop_assert_eq!(
            self.started[epoch as usize],
            self.ranks.len(),
            "rank {} completed epoch {} before everyone started it",
            me,
            epoch
        );
        self.completions[i][epoch as usize] += 1;
        Ok(Some(epoch))
    }

    fn start(&mut self, i: usize) -> Result<Option<u32>, TestCaseError> {
        let mut r = Ok(());
        let done = self.call(i, |m, out| r = m.start(&mut |to, msg| out(to, msg)))?;
        prop_assert_eq!(r, Ok(()));
        Ok(done)
    }

    /// Delivers in-flight message `k`.
    fn deliver(&mut self, k: usize) -> Result<(usize, Option<u32>), TestCaseError> {
        let (from, to, msg) = self.in_flight.swap_remove(k);
        let i = self.index(to);
        let mut r = Ok(());
        let done = self.call(i, |m, out| {
            r = m.on_message(from, msg, &mut |to, msg| out(to, msg))
        })?;
        prop_assert_eq!(r, Ok(()), "rank {} refused {:?} from {}", to, msg, from);
        Ok((i, done))
    }
}

/// Runs `EPOCHS` barriers (or, with `dead`, until the network quiesces) and checks them.
fn run(alg: Algorithm, ranks: &[u32], seed: u64, dead: Option<usize>) -> Result<(), TestCaseError> {
    let p = ranks.len();
    let mut rng = Rng(seed);
    let mut w = World::new(alg, ranks);
    // Fast participants start each epoch at once; slow ones wait a random number of steps.
    let slow: Vec<u64> = (0..p)
        .map(|_| match rng.below(3) {
            0 => 0,
            _ => 1 + rng.below(4 * p) as u64,
        })
        .collect();
    let delay = |rng: &mut Rng, i: usize| -> u64 {
        match slow[i] {
            0 => 0,
            s => rng.next() % (s + 1),
        }
    };
    // When participant i starts its next epoch; None: not scheduled (running, or done).
    let mut wake: Vec<Option<u64>> = (0..p).map(|i| Some(delay(&mut rng, i))).collect();
    if let Some(d) = dead {
        wake[d] = None;
    }
    let mut now = 0u64;
    loop {
        for (i, slot) in wake.iter_mut().enumerate() {
            if slot.is_some_and(|t| t <= now) {
                *slot = None;
                if let Some(e) = w.start(i)? {
                    if e < EPOCHS {
                        *slot = Some(now + delay(&mut rng, i));
                    }
                }
            }
        }
        if !w.in_flight.is_empty() {
            let k = rng.below(w.in_flight.len());
            if let (i, Some(e)) = w.deliver(k)? {
                if e < EPOCHS {
                    wake[i] = Some(now + delay(&mut rng, i));
                }
            }
        } else if wake.iter().all(Option::is_none) {
            break;
        }
        now += 1;
    }
    let formula = expected_messages(alg, p);
    match dead {
        None => {
            for e in 1..=EPOCHS as usize {
                prop_assert_eq!(w.sent[e], formula, "messages in epoch {}", e);
                for (c, r) in w.completions.iter().zip(ranks) {
                    prop_assert_eq!(c[e], 1, "rank {} epoch {}", r, e);
                }
            }
            prop_assert_eq!(w.sent[EPOCHS as usize + 1], 0);
        }
        Some(d) => {
            prop_assert!(
                w.sent[1] < formula.max(1),
                "all messages sent with rank dead"
            );
            prop_assert_eq!(w.started[1], p - 1);
            for i in 0..p {
                prop_assert!(w.completions[i].iter().all(|&c| c == 0));
                prop_assert_eq!(w.machines[i].epoch(), u32::from(i != d));
            }
        }
    }
    Ok(())
}

/// 5,000 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    ProptestConfig::with_cases(cases)
}

/// An algorithm and a sorted subset of 0..128 with a size in `sizes`.
fn scenario(
    sizes: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = (Algorithm, Vec<u32>)> {
    let all: Vec<u32> = (0..128).collect();
    (sizes, proptest::sample::select(ALGS.to_vec()))
        .prop_flat_map(move |(p, alg)| (Just(alg), proptest::sample::subsequence(all.clone(), p)))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn barriers_complete_in_order_exactly_once((alg, ranks) in scenario(1..=64), seed in any::<u64>()) {
        run(alg, &ranks, seed, None)?;
    }

    #[test]
    fn a_dead_participant_blocks_everyone(
        (alg, ranks) in scenario(2..=64),
        dead in any::<prop::sample::Index>(),
        seed in any::<u64>(),
    ) {
        let d = dead.index(ranks.len());
        run(alg, &ranks, seed, Some(d))?;
    }
}

/// Unit latency, simultaneous starts: the last participant completes at `rounds(alg, P)`.
#[test]
fn critical_path_matches_rounds() {
    for alg in ALGS {
        for p in 1..=CAP {
            let ranks: Vec<u32> = (0..p as u32).map(|i| 3 * i + 1).collect();
            let mut machines: Vec<BarrierMachine<CAP>> = ranks
                .iter()
                .map(|&r| BarrierMachine::new(alg, r, &ranks).unwrap())
                .collect();
            let mut next = Vec::new();
            let mut last = 0;
            for m in &mut machines {
                let from = ranks[m.index()];
                m.start(&mut |to, msg| next.push((from, to, msg))).unwrap();
            }
            let mut t = 0;
            while machines.iter().any(|m| !m.is_complete()) {
                assert!(!next.is_empty(), "{alg:?} P={p}: stuck at t={t}");
                t += 1;
                for (from, to, msg) in std::mem::take(&mut next) {
                    let m = &mut machines[ranks.binary_search(&to).unwrap()];
                    let was = m.is_complete();
                    m.on_message(from, msg, &mut |to2, msg| next.push((to, to2, msg)))
                        .unwrap();
                    if !was && m.is_complete() {
                        last = t;
                    }
                }
            }
            assert!(next.is_empty());
            assert_eq!(last, rounds(alg, p), "{alg:?} with P={p}");
        }
    }
}
