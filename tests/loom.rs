//! Model checks of the lock-free completion dispatch with loom:
//! `RUSTFLAGS="--cfg loom" cargo test --release --features sim --test loom` (without
//! `sim`, only the dispatcher-alone tests run). Each test states its bounds (see
//! `explore`); a soak of the barriers: `LOOM_MAX_PERMUTATIONS=200000` with the same
//! command.
//!
//! The dispatcher alone: threads attach inboxes, "post" (the fake device pushes their
//! completion into a shared completion queue), and poll and take until they have it; loom
//! explores every interleaving of attaches, polls, routings and takes. Asserted: each
//! thread receives exactly its own completion, none is lost, and a completion of a detached
//! attachment never reaches the inbox's next owner.
//!
//! The dispatcher as channels use it: a `MultiChannel` over the simulator (whose fabric
//! lock is loom's under `--cfg loom`) with its peers on shared completion queues, driven
//! from several threads; and barriers among three `Node`s.
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use zverbs::dispatch::{CompletionSource, Dispatcher, Inbox};
use zverbs::wr_id::WrId;
use zverbs::WorkCompletion;

mod loom_support;
use loom_support::explore;
#[cfg(feature = "sim")]
use loom_support::{leaves_receive, scoped, star};

/// The device's completion queue, handing out at most `per_poll` completions per poll. A
/// mutex is fine here: it stands for hardware.
struct FakeCq {
    queue: Mutex<Vec<WorkCompletion>>,
    per_poll: usize,
}

impl FakeCq {
    fn new(per_poll: usize) -> Self {
        FakeCq {
            queue: Mutex::new(Vec::new()),
            per_poll,
        }
    }
    fn complete(&self, wr_id: u64, byte_len: u32) {
        self.queue.lock().unwrap().push(WorkCompletion {
            wr_id,
            byte_len,
            ..WorkCompletion::EMPTY
        });
    }
    fn is_empty(&self) -> bool {
        self.queue.lock().unwrap().is_empty()
    }
}

impl CompletionSource for FakeCq {
    type Error = ();
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
        let mut q = self.queue.lock().unwrap();
        let n = q.len().min(out.len()).min(self.per_poll);
        out[..n].copy_from_slice(&q[..n]);
        q.drain(..n);
        Ok(n)
    }
}

/// What a channel on a shared queue does (`SharedCompletionQueue::poll` in a wait loop):
/// take from its inbox; if empty, route a batch (unless someone else is) and take again;
/// yield between rounds. Returns the one completion it got.
fn poll_until_own(d: &Dispatcher, cq: &FakeCq, inbox: &mut Inbox) -> WorkCompletion {
    let mut out = [WorkCompletion::EMPTY; 2];
    loop {
        let mut n = d.take(inbox, &mut out);
        if n == 0 {
            d.poll(cq).unwrap();
            n = d.take(inbox, &mut out);
        }
        match n {
            0 => thread::yield_now(),
            1 => return out[0],
            n => panic!("{n} completions for one request"),
        }
    }
}

/// Two threads, each attaching its own inbox (the attaches race too), posting, and polling
/// and taking until it has its completion; the queue hands out one completion per poll, so
/// either thread may route the other's. Preemption bound 8: the whole space at that bound,
/// ~20,000 executions, ~1 s.
#[test]
fn two_threads_each_get_their_own_completion() {
    explore(&[(8, None)], || {
        let d = Arc::new(Dispatcher::new(2, 2));
        let cq = Arc::new(FakeCq::new(1));
        let handles: Vec<_> = (0..2u32)
            .map(|t| {
                let (d, cq) = (d.clone(), cq.clone());
                thread::spawn(move || {
                    let mut inbox = d.attach(1).unwrap();
                    cq.complete(inbox.wr_id(0), 100 + t);
                    let wc = poll_until_own(&d, &cq, &mut inbox);
                    assert_eq!(WrId(wc.wr_id).inbox(), inbox.index());
                    assert_eq!(wc.byte_len, 100 + t);
                    inbox.index()
                })
            })
            .collect();
        let inboxes: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_ne!(inboxes[0], inboxes[1], "two owners of one inbox");
        assert_eq!(d.stale_completions(), 0);
        assert!(cq.is_empty(), "nothing left undelivered");
    });
}

/// Both requests completed, out of order, before anyone polls; the two owners poll and take
/// while a third thread only polls, for the others (one completion per poll, so each may be
/// routed by any of the three). Three threads with spin loops: the whole space at preemption
/// bound 1 (52 executions), then the first 20,000 executions at bound 2 (its whole space
/// does not finish; see `explore`); ~5 s.
#[test]
fn three_threads_one_polls_for_the_others() {
    explore(&[(1, None), (2, Some(20_000))], || {
        let d = Arc::new(Dispatcher::new(2, 2));
        let cq = Arc::new(FakeCq::new(1));
        let (a, b) = (d.attach(2).unwrap(), d.attach(2).unwrap());
        cq.complete(b.wr_id(0), 11);
        cq.complete(a.wr_id(0), 10);
        let owner = |mut inbox: Inbox, len| {
            let (d, cq) = (d.clone(), cq.clone());
            thread::spawn(move || {
                assert_eq!(poll_until_own(&d, &cq, &mut inbox).byte_len, len);
                d.detach(inbox);
            })
        };
        let ta = owner(a, 10);
        let tb = owner(b, 11);
        let _ = d.poll(&*cq);
        ta.join().unwrap();
        tb.join().unwrap();
        assert_eq!(
            d.stale_completions(),
            0,
            "both were taken before their detach"
        );
        assert!(cq.is_empty(), "nothing left undelivered");
    });
}

/// The poll right biased to one thread (under loom a right biases after one exclusive turn)
/// while another thread's first turn revokes it, maybe in the middle of a biased turn. Both
/// keep polling for two completions each, routed by either; the two are never inside turns
/// at once (loom's cell checks would catch two producers writing one inbox), and every
/// completion reaches its owner once, in order. Preemption bound 3: the whole space.
#[test]
fn a_biased_poller_and_a_revoking_thread_never_route_at_once() {
    explore(&[(3, None)], || {
        let d = Arc::new(Dispatcher::new(2, 2));
        let cq = Arc::new(FakeCq::new(1));
        let (mut a, b) = (d.attach(2).unwrap(), d.attach(2).unwrap());
        // The main thread's first turn biases the right to it.
        assert_eq!(d.poll(&*cq), Ok(0));
        assert!(d.is_biased());
        for (id, len) in [
            (a.wr_id(0), 1),
            (b.wr_id(0), 2),
            (a.wr_id(1), 3),
            (b.wr_id(1), 4),
        ] {
            cq.complete(id, len);
        }
        let other = {
            let (d, cq) = (d.clone(), cq.clone());
            thread::spawn(move || {
                let mut b = b;
                assert_eq!(poll_until(&d, &cq, &mut b, 2), [2, 4]);
            })
        };
        assert_eq!(poll_until(&d, &cq, &mut a, 2), [1, 3]);
        other.join().unwrap();
        assert_eq!(d.stale_completions(), 0);
        assert!(cq.is_empty(), "nothing left undelivered");
    });
}

/// Receive completions of a shared receive queue, routed by queue pair among three
/// threads: each thread binds its inbox to its queue pair (the binds race each other and
/// the routing), then its queue pair's two messages arrive — consuming buffers in the
/// shared queue's order, interleaved with the other queue pairs' — and it polls as a
/// channel does (`poll_for`: its own completions straight from the queue, the others'
/// routed to their inboxes) until it has both. Asserted: each thread gets exactly its own
/// queue pair's two receives, in arrival order, with the `wr_id` naming the buffer each
/// consumed; none is stale or left behind. Three threads in yield loops, each taking two
/// locks per message: the whole space at preemption bound 1 is about 1.4 million
/// executions (~140 s), so the first 100,000 at bound 1 and 20,000 at bound 2 (~12 s).
#[test]
fn shared_receives_routed_by_queue_pair_among_three_threads() {
    explore(&[(1, Some(100_000)), (2, Some(20_000))], || {
        let d = Arc::new(Dispatcher::new(3, 2).with_qp_routes());
        let cq = Arc::new(FakeCq::new(1));
        // Buffers are consumed in post order: the next free one goes to whichever
        // message arrives next.
        let next_buffer = Arc::new(Mutex::new(0u64));
        let handles: Vec<_> = (0..3u32)
            .map(|t| {
                let (d, cq, next_buffer) = (d.clone(), cq.clone(), next_buffer.clone());
                thread::spawn(move || {
                    let qp_num = 0x10 + t;
                    let mut inbox = d.attach(2).unwrap();
                    d.bind_qp(&mut inbox, qp_num).unwrap();
                    let mut consumed = Vec::new();
                    for k in 0..2 {
                        let mut q = cq.queue.lock().unwrap();
                        let mut b = next_buffer.lock().unwrap();
                        q.push(WorkCompletion {
                            wr_id: WrId::shared_recv(*b).0,
                            qp_num,
                            byte_len: 100 * t + k,
                            ..WorkCompletion::EMPTY
                        });
                        consumed.push(*b);
                        *b += 1;
                    }
                    let mut got = Vec::new();
                    let mut out = [WorkCompletion::EMPTY; 2];
                    while got.len() < 2 {
                        let n = d.poll_for(&*cq, &mut inbox, &mut out).unwrap();
                        got.extend(out[..n].iter().map(|wc| {
                            assert_eq!(wc.qp_num, qp_num, "another queue pair's receive");
                            (WrId(wc.wr_id).seq(), wc.byte_len)
                        }));
                        if n == 0 {
                            thread::yield_now();
                        }
                    }
                    let want: Vec<_> = consumed.iter().zip([100 * t, 100 * t + 1]).collect();
                    let got: Vec<_> = got.iter().map(|(b, l)| (b, *l)).collect();
                    assert_eq!(got, want, "thread {t}: its receives, in order");
                    d.detach(inbox);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(d.stale_completions(), 0);
        assert_eq!(d.overflowed_completions(), 0);
        assert!(cq.is_empty(), "nothing left undelivered");
    });
}

/// As [`poll_until_own`], until `n` completions came; their byte lengths, in order.
fn poll_until(d: &Dispatcher, cq: &FakeCq, inbox: &mut Inbox, n: usize) -> Vec<u32> {
    let mut got = Vec::new();
    let mut out = [WorkCompletion::EMPTY; 2];
    while got.len() < n {
        let mut k = d.take(inbox, &mut out);
        if k == 0 {
            d.poll(cq).unwrap();
            k = d.take(inbox, &mut out);
        }
        got.extend(out[..k].iter().map(|wc| wc.byte_len));
        if k == 0 {
            thread::yield_now();
        }
    }
    assert_eq!(got.len(), n, "more completions than requests");
    got
}

/// An inbox detached and attached again while another thread polls, with a completion of
/// the old attachment still in the queue (its queue pair died with it outstanding). The
/// poller routes it either after the detach (no attachment has its generation: counted
/// stale) or before (into the old attachment, which the detach empties). Asserted: the new
/// owner gets only its own completion, never the old one, in every interleaving; the stale
/// count is 1 when the old completion was still queued after the detach.
/// Preemption bound 8: the whole space (498 executions; more preemptions add none), <1 s.
#[test]
fn a_completion_of_the_old_attachment_never_reaches_the_new_one() {
    explore(&[(8, None)], || {
        let d = Arc::new(Dispatcher::new(1, 2));
        let cq = Arc::new(FakeCq::new(1));
        let old = d.attach(2).unwrap();
        let old_id = old.wr_id(0);
        cq.complete(old_id, 666);
        let poller = {
            let (d, cq) = (d.clone(), cq.clone());
            thread::spawn(move || {
                let _ = d.poll(&*cq);
            })
        };
        d.detach(old);
        let mut new = d.attach(2).unwrap();
        assert_eq!(new.index(), WrId(old_id).inbox());
        assert_ne!(new.wr_id(0), old_id, "a new generation");
        // Whether the old completion was still queued at the detach.
        let queued_at_detach = !cq.is_empty();
        cq.complete(new.wr_id(0), 2);
        let wc = poll_until_own(&d, &cq, &mut new);
        assert_eq!((wc.wr_id, wc.byte_len), (new.wr_id(0), 2));
        poller.join().unwrap();
        d.drain(&*cq).unwrap();
        let mut out = [WorkCompletion::EMPTY; 2];
        assert_eq!(
            d.take(&mut new, &mut out),
            0,
            "the old completion was delivered"
        );
        assert!(cq.is_empty());
        let stale = d.stale_completions();
        assert!(stale <= 1, "{stale} stale");
        if queued_at_detach {
            assert_eq!(stale, 1, "routed after the detach, not counted stale");
        }
    });
}

/// The dispatcher as the channels use it: two threads drive the root's two channels at
/// once over the shared queues — one a blocking send/receive exchange with leaf 1, the
/// other a blocking write to leaf 2 — while leaf 1's thread receives and answers. Either
/// root thread may route the other's send completion. Asserted: each gets its own data and
/// completion, the write lands, and no request of the root is left in flight. Every post
/// and poll takes the fabric's lock and every empty poll yields: the whole space at
/// preemption bound 1 (29 executions), then the first 20,000 executions at bound 2; ~7 s.
#[cfg(feature = "sim")]
#[test]
fn channels_of_a_multi_channel_on_shared_queues_in_two_threads() {
    use zverbs::AccessFlags;

    explore(&[(1, None), (2, Some(20_000))], || {
        let mut s = star();
        let (mut ping, mut pong) = (*b"ping", *b"pong");
        let (mut root_in, mut leaf_in) = ([0u8; 4], [0u8; 4]);
        let (mut data, mut target) = (*b"data", [0u8; 4]);
        let ping = s.pds[0].register(&mut ping).unwrap();
        let mut root_in = s.pds[0].register(&mut root_in).unwrap();
        let data = s.pds[0].register(&mut data).unwrap();
        let pong = s.pds[1].register(&mut pong).unwrap();
        let mut leaf_in = s.pds[1].register(&mut leaf_in).unwrap();
        // SAFETY: `target` is read only after every thread joined.
        let target_reg = unsafe {
            s.pds[2].register_with_access(
                &mut target,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
        }
        .unwrap();
        let remote = target_reg.remote();
        let leaf1 = &mut s.leaves[0];
        let (ping, pong, data) = (&ping, &pong, &data);
        let (root_in, leaf_in) = (&mut root_in, &mut leaf_in);
        scoped::scope(|t| {
            let mut chans = s.root.channels_mut();
            let ((p1, to_leaf1), (p2, to_leaf2)) = (chans.next().unwrap(), chans.next().unwrap());
            assert_eq!((p1, p2), (1, 2));
            t.spawn(move || {
                to_leaf1.send([ping.slice(..).unwrap()]).unwrap();
                let c = to_leaf1.receive([root_in.slice_mut(..).unwrap()]).unwrap();
                assert_eq!(c.byte_len, 4);
                assert_eq!(root_in.as_slice(), b"pong");
            });
            t.spawn(move || {
                let c = leaf1.receive([leaf_in.slice_mut(..).unwrap()]).unwrap();
                assert_eq!(c.byte_len, 4);
                assert_eq!(leaf_in.as_slice(), b"ping");
                leaf1.send([pong.slice(..).unwrap()]).unwrap();
            });
            to_leaf2.write([data.slice(..).unwrap()], &remote).unwrap();
        });
        assert!(s.root.channels_mut().all(|(_, c)| c.in_flight() == (0, 0)));
        drop(target_reg);
        assert_eq!(&target, b"data");
    });
}

/// A collective among three threads: the root's `scatter_send` to both leaves (posted to
/// both, then waited for on the shared send queue) while each leaf receives in its own
/// thread. Asserted: each leaf gets its own part, and the root's sends all completed. The
/// whole space at preemption bound 1 (37 executions), then the first 20,000 executions at
/// bound 2; ~4 s.
#[cfg(feature = "sim")]
#[test]
fn scatter_send_to_two_leaves_receiving_in_their_own_threads() {
    explore(&[(1, None), (2, Some(20_000))], || {
        let got = leaves_receive(&mut star(), |root, pd| {
            let mut parts = *b"to-1to-2";
            let parts = pd.register(&mut parts).unwrap();
            let (one, two) = parts.slice(..).unwrap().split_at(4).unwrap();
            root.scatter_send([(1, one), (2, two)]).unwrap();
        });
        assert_eq!(got, [*b"to-1", *b"to-2"]);
    });
}

/// A barrier among three threads over the simulator's provider: three `Node`s on one
/// simulated fabric (whose lock is loom's under `--cfg loom`), each thread runs two
/// consecutive barriers; loom explores the interleavings of their posts and polls.
/// Asserted: every node completes both, none before all three have entered (a shared
/// arrival counter), and a message that arrives early for the next barrier is kept.
///
/// The waits spin (a loom yield per empty poll) and every post and poll takes the
/// fabric's lock, so the full space at preemption bound 1 is large: more than 250,000
/// executions for the centralized barrier alone did not finish in 20 minutes. The test
/// explores the first `LOOM_MAX_PERMUTATIONS` (default 5,000) per algorithm, depth-first
/// from the non-preemptive schedule, ~1 s each; a soak sets it higher (see README).
#[cfg(feature = "sim")]
fn barrier_over_the_simulator(alg: zverbs::node::barrier::Algorithm) {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use zverbs::node::{Node, NodeConfig};
    use zverbs::provider::sim::Sim;
    use zverbs::{ChannelConfig, Context};

    explore(&[(1, Some(5_000))], move || {
        let sim = Sim::with_devices(3);
        let cfg = NodeConfig {
            algorithm: alg,
            barrier_timeout: None, // loom has no clock
            channel: ChannelConfig {
                timeout: None,
                ..ChannelConfig::default()
            },
            ..NodeConfig::default()
        };
        let prepared: Vec<_> = (0..3)
            .map(|r| {
                let ctx = Context::open(&sim, &format!("sim{r}")).unwrap();
                let pd = ctx.alloc_pd().unwrap();
                Node::<Sim, 3, 4, 1>::prepare(&ctx, &pd, r, 3, &cfg).unwrap()
            })
            .collect();
        let eps: Vec<Vec<_>> = prepared
            .iter()
            .map(|p| (0..3).map(|peer| p.endpoints(peer).ok()).collect())
            .collect();
        let arrived = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = prepared
            .into_iter()
            .enumerate()
            .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
            .map(|mut node| {
                let arrived = arrived.clone();
                thread::spawn(move || {
                    // Two consecutive barriers: a fast peer's message for the second may
                    // arrive while a slow one is still in the first.
                    for round in 1..=2 {
                        arrived.fetch_add(1, Ordering::SeqCst);
                        node.barrier_all().unwrap();
                        let n = arrived.load(Ordering::SeqCst);
                        assert!(
                            n >= 3 * round,
                            "barrier {round} released after {n} arrivals"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[cfg(feature = "sim")]
#[test]
fn centralized_barrier_among_three_threads_over_the_simulator() {
    barrier_over_the_simulator(zverbs::node::barrier::Algorithm::Centralized);
}

#[cfg(feature = "sim")]
#[test]
fn dissemination_barrier_among_three_threads_over_the_simulator() {
    barrier_over_the_simulator(zverbs::node::barrier::Algorithm::Dissemination);
}

#[cfg(feature = "sim")]
#[test]
fn tree_barrier_among_three_threads_over_the_simulator() {
    barrier_over_the_simulator(zverbs::node::barrier::Algorithm::BinaryTree);
}
