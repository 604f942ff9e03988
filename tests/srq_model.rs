//! A property of shared receive queues on the stepped simulator: random sends from many
//! peers into one SRQ, random refills, and the simulator's packet faults (loss,
//! duplication, delay). Every message is delivered exactly once, on the completion of the
//! queue pair its sender is connected to, in each sender's order, and every send
//! completes successfully (an SRQ that runs dry makes senders wait on RNR, never lose).
#![cfg(feature = "sim")]

use std::time::Duration;

use proptest::prelude::*;
use zverbs::provider::sim::{FabricConfig, Faults, Sim};
use zverbs::qp::{InitOptions, QpConfig, QueuePair, RcOnSrq, ReadyToSend, RtrOptions, RtsOptions};
use zverbs::{
    CompletionQueue, Context, RecvWr, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqAttr,
    WcOpcode, WcStatus, WorkCompletion,
};

/// Receives the SRQ holds, and receive buffers.
const SLOTS: usize = 8;
/// A message: its sender's index and its sequence number, little-endian u32s.
const LEN: usize = 8;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Peer `p` sends its next message.
    Send(usize),
    /// Up to `k` free buffers are posted to the SRQ, oldest freed first.
    Refill(usize),
    /// Simulated time moves on 50 µs.
    Run,
}

fn case() -> impl Strategy<Value = (u64, usize, f64, Vec<Step>)> {
    let faults = prop_oneof![Just(0.0), 0.0..0.1f64];
    (any::<u64>(), 2..6usize, faults).prop_flat_map(|(seed, peers, p)| {
        let step = prop_oneof![
            4 => (0..peers).prop_map(Step::Send),
            2 => (1..=SLOTS).prop_map(Step::Refill),
            1 => Just(Step::Run),
        ];
        (
            Just(seed),
            Just(peers),
            Just(p),
            prop::collection::vec(step, 1..60),
        )
    })
}

/// Side B: one SRQ, one receive CQ, a queue pair per peer.
struct Rig {
    a: Vec<QueuePair<Sim, ReadyToSend>>,
    b: Vec<QueuePair<Sim, ReadyToSend, RcOnSrq>>,
    acq: CompletionQueue<Sim>,
    bcq: CompletionQueue<Sim>,
    srq: SharedReceiveQueue<Sim>,
    /// Receive buffers (leaked: the rig's receives may outlive a failed case).
    bufs: &'static [u8],
    lkey: u32,
    free: std::collections::VecDeque<usize>,
    /// Per peer: messages sent, and the next expected at B.
    sent: Vec<u32>,
    next: Vec<u32>,
    delivered: usize,
    sends_done: usize,
    _keep: (zverbs::ProtectionDomain<Sim>, Context<Sim>, Context<Sim>),
}

fn rig(sim: &Sim, peers: usize) -> Result<Rig, String> {
    let e = |what: &'static str| move |e: zverbs::Error<_>| format!("{what}: {e}");
    let ca = Context::open(sim, "sim0").map_err(e("open"))?;
    let cb = Context::open(sim, "sim1").map_err(e("open"))?;
    let (pa, pb) = (
        ca.alloc_pd().map_err(e("pd"))?,
        cb.alloc_pd().map_err(e("pd"))?,
    );
    let acq = CompletionQueue::create(&ca, 1024).map_err(e("cq"))?;
    let bcq = CompletionQueue::create(&cb, 1024).map_err(e("cq"))?;
    let attr = SrqAttr {
        max_wr: SLOTS as u32,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = SharedReceiveQueue::create(&cb, &pb, &attr).map_err(e("srq"))?;
    let bufs: &'static mut [u8] = Box::leak(vec![0u8; SLOTS * LEN].into_boxed_slice());
    let mr = pb.register(bufs).map_err(e("register"))?;
    let lkey = mr.lkey();
    let bufs: &'static [u8] = {
        let s = mr.as_slice();
        // SAFETY: the buffer is leaked; the registration is kept for the whole process
        // below, and the rig reads a slot only after its receive completed (stepped mode:
        // the simulated HCA runs only inside this thread's calls).
        unsafe { core::slice::from_raw_parts(s.as_ptr(), s.len()) }
    };
    std::mem::forget(mr);
    let cfg = QpConfig::default();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..peers {
        let qa = QueuePair::create(&ca, &pa, &acq, &acq, &cfg).map_err(e("qp"))?;
        let qb = QueuePair::create_on_srq(&cb, &pb, &bcq, &bcq, &srq, &cfg).map_err(e("qp"))?;
        let init = InitOptions::default();
        let qa = qa.into_init(&init).map_err(|x| x.to_string())?;
        let qb = qb.into_init(&init).map_err(|x| x.to_string())?;
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        let rtr = RtrOptions {
            min_rnr_timer: 1,
            ..RtrOptions::default()
        };
        let qa = qa.into_rtr(&eb, &rtr).map_err(|x| x.to_string())?;
        let qb = qb.into_rtr(&ea, &rtr).map_err(|x| x.to_string())?;
        let rts = RtsOptions::default(); // rnr_retry 7: wait for a receive forever
        a.push(qa.into_rts(&rts).map_err(|x| x.to_string())?);
        b.push(qb.into_rts(&rts).map_err(|x| x.to_string())?);
    }
    Ok(Rig {
        a,
        b,
        acq,
        bcq,
        srq,
        bufs,
        lkey,
        free: (0..SLOTS).collect(),
        sent: vec![0; peers],
        next: vec![0; peers],
        delivered: 0,
        sends_done: 0,
        _keep: (pa, ca, cb),
    })
}

impl Rig {
    fn send(&mut self, p: usize) -> Result<(), String> {
        let mut msg = [0u8; LEN];
        msg[..4].copy_from_slice(&(p as u32).to_le_bytes());
        msg[4..].copy_from_slice(&self.sent[p].to_le_bytes());
        let sge = Sge {
            addr: msg.as_ptr() as u64,
            length: LEN as u32,
            lkey: 0,
        };
        let flags = SendFlags::SIGNALED | SendFlags::INLINE;
        let mut wr = SendWr::<1>::new(u64::from(self.sent[p]), SendOp::Send, flags);
        wr.sg_list[0] = sge;
        wr.num_sge = 1;
        // SAFETY: an inline send: its bytes are copied during the call.
        unsafe { self.a[p].post_send(&[wr]) }.map_err(|e| format!("post_send: {e}"))?;
        self.sent[p] += 1;
        Ok(())
    }

    fn refill(&mut self, k: usize) -> Result<(), String> {
        let n = k.min(self.free.len());
        let wrs: Vec<RecvWr<1>> = self
            .free
            .drain(..n)
            .map(|slot| {
                let mut wr = RecvWr::<1>::new(slot as u64);
                wr.sg_list[0] = Sge {
                    addr: self.bufs.as_ptr() as u64 + (slot * LEN) as u64,
                    length: LEN as u32,
                    lkey: self.lkey,
                };
                wr.num_sge = 1;
                wr
            })
            .collect();
        // SAFETY: each slot is posted once until its receive completes; the buffer is
        // leaked and registered for good.
        unsafe { self.srq.post_recv(&wrs) }.map_err(|e| format!("post_srq_recv: {e}"))
    }

    /// Takes what both CQs hold, checking each completion.
    fn poll(&mut self) -> Result<(), String> {
        let mut wcs = [WorkCompletion::EMPTY; 16];
        loop {
            let n = self.bcq.poll(&mut wcs).map_err(|e| e.to_string())?;
            for wc in &wcs[..n] {
                self.received(wc)?;
            }
            let m = self.acq.poll(&mut wcs).map_err(|e| e.to_string())?;
            for wc in &wcs[..m] {
                if wc.status != WcStatus::Success {
                    return Err(format!("send {} failed: {:?}", wc.wr_id, wc.status));
                }
                self.sends_done += 1;
            }
            if n + m == 0 {
                return Ok(());
            }
        }
    }

    fn received(&mut self, wc: &WorkCompletion) -> Result<(), String> {
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
            return Err(format!("receive {wc:?}"));
        }
        let slot = wc.wr_id as usize;
        if slot >= SLOTS || self.free.contains(&slot) || wc.byte_len as usize != LEN {
            return Err(format!("receive of a buffer not posted, or short: {wc:?}"));
        }
        let m = &self.bufs[slot * LEN..][..LEN];
        let p = u32::from_le_bytes(m[..4].try_into().unwrap()) as usize;
        let seq = u32::from_le_bytes(m[4..].try_into().unwrap());
        let Some(qp) = self.b.get(p) else {
            return Err(format!("a message from no peer: {m:?}"));
        };
        if wc.qp_num != qp.qp_num() {
            return Err(format!(
                "peer {p}'s message {seq} completed on qp {:#x}",
                wc.qp_num
            ));
        }
        if seq != self.next[p] {
            return Err(format!(
                "peer {p}: message {seq} where {} was due",
                self.next[p]
            ));
        }
        self.next[p] += 1;
        self.delivered += 1;
        self.free.push_back(slot);
        Ok(())
    }
}

fn run(seed: u64, peers: usize, p: f64, steps: &[Step]) -> Result<(), String> {
    let cfg = FabricConfig {
        faults: Faults {
            drop: p,
            duplicate: p,
            delay: p,
            max_extra_delay_ns: 5_000,
        },
        // Time moves only when the rig runs the fabric: a poll that finds nothing does
        // not run it (senders retrying RNR keep it busy, and a long-empty SRQ on a lossy
        // fabric ends in RETRY_EXC_ERR, as on hardware, whose timeouts count across RNR
        // waits).
        auto_step: false,
        trace: std::env::var_os("SRQ_TRACE").is_some(),
        ..FabricConfig::stepped(seed)
    };
    let sim = Sim::with_config(cfg, 2);
    let _t = Tr(sim.clone());
    let mut r = rig(&sim, peers)?;
    for &s in steps {
        match s {
            Step::Send(p) => r.send(p)?,
            Step::Refill(k) => r.refill(k)?,
            Step::Run => {
                sim.fabric().run_for(Duration::from_micros(50));
            }
        }
        r.poll()?;
    }
    // Drain: keep the SRQ full until every message is in.
    let total: usize = r.sent.iter().map(|&n| n as usize).sum();
    for _ in 0..5_000 {
        if r.delivered == total && r.sends_done == total {
            return Ok(());
        }
        r.refill(SLOTS)?;
        sim.fabric().run_for(Duration::from_millis(1));
        r.poll()?;
    }
    Err(format!(
        "stuck: {} of {total} delivered, {} sends completed",
        r.delivered, r.sends_done
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_message_once_to_its_queue_pair_in_order((seed, peers, p, steps) in case()) {
        run(seed, peers, p, &steps)
            .map_err(|e| TestCaseError::fail(format!("{e} (stepped fabric, seed {seed})")))?;
    }
}

/// With `SRQ_TRACE` set, prints the fabric's trace when a case ends.
struct Tr(Sim);

impl Drop for Tr {
    fn drop(&mut self) {
        if std::env::var_os("SRQ_TRACE").is_some() {
            for e in self.0.fabric().trace_events() {
                eprintln!("{e:?}");
            }
        }
    }
}
