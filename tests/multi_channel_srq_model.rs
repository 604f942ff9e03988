//! A property of a `MultiChannel` on one SRQ, on the stepped simulator: random sends from
//! several peers, random takes and hand-backs of slots (so the SRQ is refilled by its
//! policy at random points, and runs dry at others), and the simulator's packet faults
//! (loss, duplication, delay). Every message is received exactly once, named by the peer
//! that sent it, in each sender's order, and every send completes successfully (a dry SRQ
//! makes senders wait on RNR, never lose).
#![cfg(feature = "sim")]

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use zverbs::multi_channel::Received;
use zverbs::provider::sim::{FabricConfig, Faults, Sim};
use zverbs::qp::RcOnSrq;
use zverbs::srq::SlotsConfig;
use zverbs::{Channel, ChannelConfig, Context, MemoryRegion, MultiChannel, Pending, SendFlags};
use zverbs::{SendOp, WcStatus};

/// Messages a peer sends at most, and their length: its index and sequence number.
const MAX_MSGS: usize = 40;
const LEN: usize = 2;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Peer `p` (1-based, as the root names it) sends its next message.
    Send(usize),
    /// The root takes what has arrived.
    Take,
    /// The root hands back up to `k` slots it holds, oldest first.
    Release(usize),
    /// Simulated time moves on 50 µs.
    Run,
}

fn case() -> impl Strategy<Value = (u64, usize, u32, u32, f64, Vec<Step>)> {
    let faults = prop_oneof![Just(0.0), 0.0..0.08f64];
    (any::<u64>(), 1..4usize, 2..7u32, faults).prop_flat_map(|(seed, peers, slots, p)| {
        let step = prop_oneof![
            4 => (1..=peers).prop_map(Step::Send),
            3 => Just(Step::Take),
            2 => (1..=slots as usize).prop_map(Step::Release),
            1 => Just(Step::Run),
        ];
        (
            Just(seed),
            Just(peers),
            Just(slots),
            0..slots,
            Just(p),
            prop::collection::vec(step, 1..80),
        )
    })
}

type Root = MultiChannel<Sim, 4, 4, 1, RcOnSrq>;
type Leaf = Channel<Sim, 4, 1>;

struct Rig {
    root: Root,
    /// Peer `i + 1`'s channel, its messages (registered), its sends in flight.
    leaves: Vec<(Leaf, MemoryRegion<'static, Sim>, VecDeque<Pending>)>,
    sent: Vec<usize>,
    sends_done: usize,
    /// Per peer: the next message due at the root.
    next: Vec<usize>,
    delivered: usize,
    held: VecDeque<Received>,
    _ctx: Vec<Context<Sim>>,
}

fn rig(sim: &Sim, peers: usize, slots: u32, refill_at: u32) -> Result<Rig, String> {
    let e = |what: &'static str| move |e: zverbs::Error<_>| format!("{what}: {e}");
    let ctx: Vec<_> = (0..=peers)
        .map(|i| Context::open(sim, &format!("sim{i}")))
        .collect::<Result<_, _>>()
        .map_err(e("open"))?;
    let pds: Vec<_> = ctx
        .iter()
        .map(|c| c.alloc_pd())
        .collect::<Result<_, _>>()
        .map_err(e("pd"))?;
    let cfg = ChannelConfig {
        timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    };
    let recv = SlotsConfig {
        slots,
        size: LEN,
        refill_at,
        limit: 0,
    };
    let root = Root::prepare_on_srq(&ctx[0], &pds[0], 1..=peers, &cfg, &recv).map_err(e("root"))?;
    let mut leaves = Vec::new();
    for i in 1..=peers {
        let leaf = Leaf::prepare(&ctx[i], &pds[i], &cfg).map_err(e("leaf"))?;
        let ours = root.endpoint(i).map_err(e("endpoint"))?;
        let theirs = leaf.endpoint();
        // Leaked: a send may outlive a failed case.
        let msgs: &'static mut [u8] = Box::leak(
            (0..MAX_MSGS)
                .flat_map(|k| [i as u8, k as u8])
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        let mr = pds[i].register(msgs).map_err(e("register"))?;
        leaves.push((leaf, theirs, ours, mr));
    }
    let eps: Vec<_> = leaves.iter().map(|l| l.1).collect();
    let root = root
        .connect(|p| eps.get(p.wrapping_sub(1)).copied())
        .map_err(e("connect"))?;
    let leaves = leaves
        .into_iter()
        .map(|(l, _, ours, mr)| Ok((l.connect(&ours)?, mr, VecDeque::new())))
        .collect::<Result<_, zverbs::Error<_>>>()
        .map_err(e("connect"))?;
    // The pds go with the contexts' lifetime: the regions hold theirs.
    drop(pds);
    Ok(Rig {
        root,
        leaves,
        sent: vec![0; peers + 1],
        sends_done: 0,
        next: vec![0; peers + 1],
        delivered: 0,
        held: VecDeque::new(),
        _ctx: ctx,
    })
}

impl Rig {
    fn send(&mut self, p: usize) -> Result<(), String> {
        let k = self.sent[p];
        let (leaf, mr, pending) = &mut self.leaves[p - 1];
        if k == MAX_MSGS || pending.len() == 4 {
            return Ok(());
        }
        let sge = mr
            .slice(k * LEN..(k + 1) * LEN)
            .map_err(|e| e.to_string())?
            .sge();
        // SAFETY: the message lives in leaked memory, never written after registration.
        let posted = unsafe { leaf.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty()) };
        pending.push_back(posted.map_err(|e| format!("post: {e}"))?);
        self.sent[p] += 1;
        Ok(())
    }

    /// Completes the leaves' sends that are done.
    fn reap(&mut self) -> Result<(), String> {
        for (leaf, _, pending) in &mut self.leaves {
            while let Some(p) = pending.pop_front() {
                match leaf.try_complete(p) {
                    Ok(Ok(c)) if c.status == WcStatus::Success => self.sends_done += 1,
                    Ok(Ok(c)) => return Err(format!("a send completed with {c:?}")),
                    Ok(Err(p)) => {
                        pending.push_front(p);
                        break;
                    }
                    Err(e) => return Err(format!("a send failed: {e}")),
                }
            }
        }
        Ok(())
    }

    fn take(&mut self) -> Result<(), String> {
        let mut got = [Received::NONE; 4];
        let n = self
            .root
            .poll_received(&mut got)
            .map_err(|e| format!("receive: {e}"))?;
        for r in &got[..n] {
            let m = self.root.received(r.slot).map_err(|e| e.to_string())?;
            let (from, k) = (m[0] as usize, m[1] as usize);
            if from != r.peer {
                return Err(format!("peer {from}'s message {k} named peer {}", r.peer));
            }
            if k != self.next[from] {
                return Err(format!(
                    "peer {from}: message {k} where {} was due",
                    self.next[from]
                ));
            }
            self.next[from] += 1;
            self.delivered += 1;
            self.held.push_back(*r);
        }
        Ok(())
    }

    fn release(&mut self, k: usize) -> Result<(), String> {
        for r in self.held.drain(..k.min(self.held.len())) {
            self.root
                .release(r.slot)
                .map_err(|e| format!("release: {e}"))?;
        }
        Ok(())
    }
}

fn run(
    seed: u64,
    peers: usize,
    slots: u32,
    refill_at: u32,
    p: f64,
    steps: &[Step],
) -> Result<(), String> {
    let cfg = FabricConfig {
        faults: Faults {
            drop: p,
            duplicate: p,
            delay: p,
            max_extra_delay_ns: 5_000,
        },
        // Time moves only when the test runs the fabric (see tests/srq_model.rs).
        auto_step: false,
        ..FabricConfig::stepped(seed)
    };
    let sim = Sim::with_config(cfg, peers + 1);
    let mut r = rig(&sim, peers, slots, refill_at)?;
    for &s in steps {
        match s {
            Step::Send(p) => r.send(p)?,
            Step::Take => r.take()?,
            Step::Release(k) => r.release(k)?,
            Step::Run => {
                sim.fabric().run_for(Duration::from_micros(50));
            }
        }
        r.reap()?;
    }
    // Drain: take and hand back everything until every message is in.
    let total: usize = r.sent.iter().sum();
    for _ in 0..5_000 {
        if r.delivered == total && r.sends_done == total {
            return Ok(());
        }
        r.take()?;
        r.release(usize::MAX)?;
        sim.fabric().run_for(Duration::from_millis(1));
        r.reap()?;
    }
    Err(format!(
        "stuck: {} of {total} delivered, {} sends completed",
        r.delivered, r.sends_done
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_message_once_named_by_its_peer_in_order(
        (seed, peers, slots, refill_at, p, steps) in case()
    ) {
        run(seed, peers, slots, refill_at, p, &steps).map_err(|e| {
            TestCaseError::fail(format!("{e} (stepped fabric, seed {seed})"))
        })?;
    }
}
