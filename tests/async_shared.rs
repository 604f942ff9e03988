//! Async channels on shared completion queues (`zverbs::tokio::AsyncQueue`): one queue and
//! one reactor for many channels, completions routed to each channel's inbox and the
//! sleeping tasks woken through it; every operation, many peers at once, bounds, dropped
//! futures, the queue's reactor ending, and blocking threads sleeping on the same queue.
#![cfg(all(feature = "sim", feature = "tokio"))]

mod common;

use common::rt::{current_thread, filled, multi_thread, target, within};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

use zverbs::dispatch::SharedCompletionQueue;
use zverbs::provider::sim::Sim;
use zverbs::tokio::{AsyncChannel, AsyncGroup, AsyncQueue};
use zverbs::{Channel, ChannelConfig, Context, Error, MrPool, ProtectionDomain, WaitPolicy};

type Ch = AsyncChannel<Sim>;

const PEERS: usize = 3;

/// The timeout of channels whose operations must end by a wake-up, not by it.
const TIMEOUT: Duration = Duration::from_secs(5);

fn leak<T>(t: T) -> &'static T {
    Box::leak(Box::new(t))
}

/// A hub on sim0 with one async channel to each of `PEERS` leaves (sim1..), the hub's on
/// one shared queue (both directions); the leaves' on queues of their own.
struct Star {
    sim: Sim,
    hub_ctx: &'static Context<Sim>,
    hub_pd: &'static ProtectionDomain<Sim>,
    queue: AsyncQueue<Sim>,
    hub: Vec<Ch>,
    hub_pool: MrPool<Sim>,
    leaves: Vec<(Ch, MrPool<Sim>, &'static ProtectionDomain<Sim>)>,
}

fn star(cfg: &ChannelConfig) -> Star {
    // One device more, for a blocking channel's peer (`blocking_pair`).
    let sim = Sim::with_devices(PEERS + 2);
    let hub_ctx = leak(Context::open(&sim, "sim0").unwrap());
    let hub_pd = leak(hub_ctx.alloc_pd().unwrap());
    // Two queues (send and receive) per channel, one per extra channel made later.
    let queue = AsyncQueue::create(hub_ctx, 2 * (PEERS + 1), 64).unwrap();
    let (mut hub, mut leaves) = (Vec::new(), Vec::new());
    for i in 1..=PEERS {
        let ctx = leak(Context::open(&sim, &format!("sim{i}")).unwrap());
        let pd = leak(ctx.alloc_pd().unwrap());
        let a = Ch::prepare_shared(hub_ctx, hub_pd, cfg, &queue, &queue).unwrap();
        let b = Ch::prepare(ctx, pd, cfg).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        hub.push(AsyncChannel::new(a.connect(&eb).unwrap()).unwrap());
        let leaf = AsyncChannel::new(b.connect(&ea).unwrap()).unwrap();
        leaves.push((leaf, MrPool::new(pd, 1 << 20).unwrap(), pd));
    }
    Star {
        sim,
        hub_ctx,
        hub_pd,
        hub_pool: MrPool::new(hub_pd, 1 << 20).unwrap(),
        queue,
        hub,
        leaves,
    }
}

fn cfg(wait: WaitPolicy, timeout: Duration) -> ChannelConfig {
    ChannelConfig {
        wait,
        timeout: Some(timeout),
        flush_grace: Duration::from_millis(50),
        ..ChannelConfig::default()
    }
}

/// Every operation from the hub (on the shared queue) to every leaf, all peers at once,
/// with tasks that sleep at once. The hub's receives wait in tasks of their own for a
/// message sent later, so only the wake-up through the channel's inbox ends them.
#[test]
fn every_operation_to_every_peer_at_once_with_sleeping_tasks() {
    multi_thread().block_on(async {
        let s = star(&cfg(WaitPolicy::SpinSleep, TIMEOUT));
        let mut tasks = Vec::new();
        for (i, (leaf, leaf_pool, leaf_pd)) in s.leaves.iter().enumerate() {
            let (hub, pool) = (s.hub[i].clone(), s.hub_pool.clone());
            let (leaf, leaf_pool) = (leaf.clone(), leaf_pool.clone());
            let (mr, remote) = target(leaf_pd, 64);
            tasks.push(tokio::spawn(async move {
                let tag = [i as u8 + 1; 8];
                // Two-sided, with and without immediate data, both ways.
                let (got, sent) = tokio::join!(
                    leaf.receive(leaf_pool.alloc(16).unwrap()),
                    hub.send_with_imm(filled(&pool, &tag), i as u32)
                );
                sent.0.unwrap();
                let c = got.0.unwrap();
                assert_eq!((c.byte_len, c.imm), (8, Some(i as u32)));
                assert_eq!(&got.1[..8], &tag);
                let got = tokio::spawn({
                    let (hub, pool) = (hub.clone(), pool.clone());
                    async move {
                        let t0 = Instant::now();
                        let r = hub.receive(pool.alloc(16).unwrap()).await;
                        (r, t0.elapsed())
                    }
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                leaf.send(filled(&leaf_pool, &tag[..3])).await.0.unwrap();
                let ((c, buf), took) = got.await.unwrap();
                // Woken by the message (20 ms in), not by its deadline: a lost wake-up
                // meets the deadline, then finds the message all the same.
                assert!(took < TIMEOUT / 2, "woken only at the deadline, {took:?}");
                assert_eq!(c.unwrap().byte_len, 3);
                assert_eq!(&buf[..3], &tag[..3]);
                // One-sided and atomics into the leaf's memory.
                hub.write(filled(&pool, &tag), &remote).await.0.unwrap();
                let (r, back) = hub.read(pool.alloc(8).unwrap(), &remote).await;
                r.unwrap();
                assert_eq!(&back[..], &tag);
                let at = remote.slice(8..16).unwrap();
                let (old, _) = hub.fetch_add(pool.alloc(8).unwrap(), &at, 5).await;
                assert_eq!(old.unwrap(), 0);
                let (old, _) = hub.compare_swap(pool.alloc(8).unwrap(), &at, 5, 9).await;
                assert_eq!(old.unwrap(), 5);
                assert_eq!(&mr.as_slice()[..8], &tag);
                assert_eq!(
                    u64::from_ne_bytes(mr.as_slice()[8..16].try_into().unwrap()),
                    9
                );
            }));
        }
        for t in tasks {
            within(Duration::from_secs(30), t).await.unwrap();
        }
        assert_eq!(s.hub_pool.stats().allocations, 0);
        let d = s.queue.queue().dispatcher();
        assert_eq!((d.stale_completions(), d.overflowed_completions()), (0, 0));
    });
}

/// Every leaf ping-pongs with the hub at once, many rounds, under each wait policy: every
/// message reaches exactly its own task (a completion found by another peer's poll is
/// routed to its inbox), and sleeping tasks are woken each round.
#[test]
fn all_peers_ping_pong_at_once_under_every_wait_policy() {
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        multi_thread().block_on(async {
            let s = star(&cfg(wait, Duration::from_secs(5)));
            const ROUNDS: u32 = 200;
            let mut tasks = Vec::new();
            for (i, (leaf, leaf_pool, _)) in s.leaves.iter().enumerate() {
                let (hub, pool) = (s.hub[i].clone(), s.hub_pool.clone());
                let (leaf, leaf_pool) = (leaf.clone(), leaf_pool.clone());
                tasks.push(tokio::spawn(async move {
                    let echo = async {
                        for _ in 0..ROUNDS {
                            let (c, buf) = leaf.receive(leaf_pool.alloc(8).unwrap()).await;
                            let imm = c.unwrap().imm.unwrap();
                            assert_eq!(&buf[..4], &imm.to_ne_bytes());
                            let (s, _) = leaf.send_with_imm(buf, imm).await;
                            s.unwrap();
                        }
                    };
                    let ping = async {
                        for r in 0..ROUNDS {
                            let imm = (i as u32) << 16 | r;
                            let reply = hub.receive(pool.alloc(8).unwrap());
                            let (s, _) = hub
                                .send_with_imm(filled(&pool, &imm.to_ne_bytes()), imm)
                                .await;
                            s.unwrap();
                            let (c, _) = reply.await;
                            assert_eq!(c.unwrap().imm, Some(imm), "{wait:?}: peer {i} round {r}");
                        }
                    };
                    tokio::join!(echo, ping);
                }));
            }
            for t in tasks {
                within(Duration::from_secs(60), t).await.unwrap();
            }
            let d = s.queue.queue().dispatcher();
            assert_eq!((d.stale_completions(), d.overflowed_completions()), (0, 0));
        });
    }
}

/// A sleeping receive on a shared queue that nobody answers ends with `Timeout` within the
/// channel's bound, under every policy, with its buffer; the other peers' channels work on.
#[test]
fn an_operation_on_a_shared_queue_times_out_within_its_bound() {
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        current_thread().block_on(async {
            let timeout = Duration::from_millis(100);
            let bound = 10 * (timeout + Duration::from_millis(50));
            let s = star(&cfg(wait, timeout));
            let t0 = Instant::now();
            let (r, buf) = within(bound, s.hub[0].receive(s.hub_pool.alloc(16).unwrap())).await;
            let took = t0.elapsed();
            assert!(matches!(r, Err(Error::Timeout)), "{wait:?}: {r:?}");
            assert_eq!(buf.len(), 16);
            assert!(took >= timeout, "{wait:?}: ended early, after {took:?}");
            assert!(took < bound, "{wait:?}: took {took:?}");
            // Peer 1 is unaffected.
            let (leaf, leaf_pool, _) = &s.leaves[1];
            let (got, sent) = tokio::join!(
                leaf.receive(leaf_pool.alloc(8).unwrap()),
                s.hub[1].send(filled(&s.hub_pool, b"on"))
            );
            sent.0.unwrap();
            assert_eq!(got.0.unwrap().byte_len, 2);
        });
    }
}

/// A receive whose future was dropped keeps its buffer with the channel until a message
/// lands in it, then the channel's reactor (woken through its inbox) gives it back.
#[test]
fn a_dropped_receive_on_a_shared_queue_keeps_its_buffer_until_the_message_lands() {
    current_thread().block_on(async {
        let s = star(&cfg(WaitPolicy::SpinYield, Duration::from_secs(5)));
        drop(s.hub[2].receive(s.hub_pool.alloc(32).unwrap()));
        assert_eq!(
            s.hub_pool.stats().allocations,
            1,
            "the device may still write it"
        );
        // The channel's reactor goes to sleep on its inboxes meanwhile.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (leaf, leaf_pool, _) = &s.leaves[2];
        leaf.send(filled(leaf_pool, b"late")).await.0.unwrap();
        within(Duration::from_secs(5), async {
            while s.hub_pool.stats().allocations != 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    });
}

/// A group of channels on one shared queue: the async collectives of a `MultiChannel`.
#[test]
fn a_group_on_one_shared_queue_scatters_and_gathers() {
    current_thread().block_on(async {
        let s = star(&cfg(WaitPolicy::SpinSleep, Duration::from_secs(5)));
        let hub: [Ch; PEERS] = core::array::from_fn(|i| s.hub[i].clone());
        let group = AsyncGroup::new(hub);
        let parts = core::array::from_fn(|i| filled(&s.hub_pool, &[i as u8; 4]));
        // The group's own polls allocate nothing (the leaves' receives, awaited beside it
        // with a helper that boxes them, are not counted).
        let mut allocs = 0;
        let mut scatter = core::pin::pin!(group.scatter(parts));
        let counted = std::future::poll_fn(|cx| {
            let (r, n) =
                zverbs_testkit::measure(|| std::future::Future::poll(scatter.as_mut(), cx));
            allocs += n.count;
            r
        });
        let (sent, got) = tokio::join!(
            counted,
            futures_join(
                s.leaves
                    .iter()
                    .map(|(l, p, _)| l.receive(p.alloc(8).unwrap()))
            )
        );
        assert!(sent.iter().all(|(r, _)| r.is_ok()));
        assert_eq!(allocs, 0, "the group's scatter allocated");
        for (i, (c, buf)) in got.into_iter().enumerate() {
            assert_eq!(c.unwrap().byte_len, 4);
            assert_eq!(&buf[..4], &[i as u8; 4]);
        }
        let bufs = core::array::from_fn(|_| s.hub_pool.alloc(8).unwrap());
        let (got, sent) = tokio::join!(
            group.gather(bufs),
            futures_join(
                s.leaves
                    .iter()
                    .enumerate()
                    .map(|(i, (l, p, _))| l.send(filled(p, &[10 + i as u8; 2])))
            )
        );
        assert!(sent.iter().all(|(r, _)| r.is_ok()));
        for (i, (c, buf)) in got.into_iter().enumerate() {
            assert_eq!(c.unwrap().byte_len, 2);
            assert_eq!(&buf[..2], &[10 + i as u8; 2]);
        }
    });
}

/// Awaits the futures together (each spawned would need `'static`).
async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let std::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                    *o = Some(v);
                }
            }
        }
        if out.iter().all(Option::is_some) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// A blocking thread that sleeps on a queue the reactor leads parks as a follower and is
/// woken by the reactor's routing: its receive ends with the message, not a timeout.
#[test]
fn a_blocking_thread_sleeping_on_a_led_queue_is_woken_by_the_reactor() {
    multi_thread().block_on(async {
        let c = cfg(WaitPolicy::SpinSleep, Duration::from_secs(5));
        let s = star(&c);
        let (hub, leaf) = blocking_pair((&s.sim, s.hub_ctx, s.hub_pd), s.queue.queue(), &c);
        let t0 = Instant::now();
        let got = receive_while_sent_later(hub, leaf);
        assert_eq!(got, Ok(5));
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "woken by the message"
        );
    });
}

/// A blocking channel on `queue` at the hub and its peer (own queues) on a new device,
/// each with its PD.
type End = (Channel<Sim>, &'static ProtectionDomain<Sim>);

fn blocking_pair(
    (sim, hub_ctx, hub_pd): (&Sim, &'static Context<Sim>, &'static ProtectionDomain<Sim>),
    queue: &Arc<SharedCompletionQueue<Sim>>,
    c: &ChannelConfig,
) -> (End, End) {
    let ctx = leak(Context::open(sim, &format!("sim{}", PEERS + 1)).unwrap());
    let pd = leak(ctx.alloc_pd().unwrap());
    let a = Channel::<Sim>::prepare_shared(hub_ctx, hub_pd, c, queue, queue).unwrap();
    let b = Channel::<Sim>::prepare(ctx, pd, c).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    (
        (a.connect(&eb).unwrap(), hub_pd),
        (b.connect(&ea).unwrap(), pd),
    )
}

/// The hub's blocking receive on its own thread while the leaf sends 50 ms later: the
/// receive's outcome (the byte count).
fn receive_while_sent_later(hub: End, leaf: End) -> Result<u32, String> {
    let ((mut hub, hub_pd), (mut leaf, leaf_pd)) = (hub, leaf);
    std::thread::scope(|t| {
        let rx = t.spawn(move || {
            let mut buf = [0u8; 16];
            let mut mr = hub_pd.register(&mut buf).unwrap();
            hub.receive([mr.slice_mut(..).unwrap()])
                .map(|c| c.byte_len)
                .map_err(|e| format!("{e:?}"))
        });
        std::thread::sleep(Duration::from_millis(50));
        let mut msg = *b"hello";
        let mr = leaf_pd.register(&mut msg).unwrap();
        leaf.send([mr.slice(..).unwrap()]).unwrap();
        rx.join().unwrap()
    })
}

/// The queue's reactor ends once its handles and the channels on it are gone (it holds
/// the queue no longer), and gives the lead back: a blocking thread sleeping on the queue
/// then leads, and is woken by the event itself.
#[test]
fn the_queue_reactor_ends_with_its_last_user_and_threads_lead_again() {
    multi_thread().block_on(async {
        let c = cfg(WaitPolicy::SpinSleep, Duration::from_secs(5));
        let s = star(&c);
        let queue = s.queue.queue().clone();
        let Star {
            sim,
            hub_ctx,
            hub_pd,
            queue: handle,
            hub: hub_channels,
            leaves,
            ..
        } = s;
        drop((handle, hub_channels, leaves));
        within(Duration::from_secs(5), async {
            while Arc::strong_count(&queue) > 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let (hub, leaf) = blocking_pair((&sim, hub_ctx, hub_pd), &queue, &c);
        let t0 = Instant::now();
        let got = receive_while_sent_later(hub, leaf);
        assert_eq!(got, Ok(5));
        assert!(t0.elapsed() < Duration::from_secs(5), "woken by the event");
    });
}

/// The queue's handle may go before the channels prepared on it are driven: they keep its
/// reactor running (a sleeping task is woken by the message, not by its deadline).
#[test]
fn channels_prepared_on_a_queue_keep_its_reactor_after_the_handle_goes() {
    current_thread().block_on(async {
        let sim = Sim::with_devices(2);
        let (ca, cb) = (
            leak(Context::open(&sim, "sim0").unwrap()),
            leak(Context::open(&sim, "sim1").unwrap()),
        );
        let (pa, pb) = (leak(ca.alloc_pd().unwrap()), leak(cb.alloc_pd().unwrap()));
        let c = cfg(WaitPolicy::SpinSleep, TIMEOUT);
        let q = AsyncQueue::create(ca, 2, 64).unwrap();
        let a = Ch::prepare_shared(ca, pa, &c, &q, &q).unwrap();
        drop(q);
        let b = Ch::prepare(cb, pb, &c).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let a = Ch::new(a.connect(&eb).unwrap()).unwrap();
        let b = Ch::new(b.connect(&ea).unwrap()).unwrap();
        let (pool_a, pool_b) = (
            MrPool::new(pa, 1 << 16).unwrap(),
            MrPool::new(pb, 1 << 16).unwrap(),
        );
        let t0 = Instant::now();
        let got = tokio::spawn({
            let a = a.clone();
            async move { a.receive(pool_a.alloc(8).unwrap()).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.send(filled(&pool_b, b"kept")).await.0.unwrap();
        let (r, buf) = within(TIMEOUT * 2, got).await.unwrap();
        assert_eq!(r.unwrap().byte_len, 4);
        assert_eq!(&buf[..4], b"kept");
        assert!(t0.elapsed() < TIMEOUT / 2, "woken by the message");
    });
}

/// A channel on a shared queue no reactor leads cannot be driven asynchronously: nothing
/// would wake its sleeping tasks.
#[test]
fn a_channel_on_a_queue_without_a_reactor_is_refused() {
    current_thread().block_on(async {
        let sim = Sim::with_devices(2);
        let (ca, cb) = (
            Context::open(&sim, "sim0").unwrap(),
            Context::open(&sim, "sim1").unwrap(),
        );
        let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
        let q = Arc::new(SharedCompletionQueue::create_with_events(&ca, 2, 64).unwrap());
        let c = ChannelConfig::default();
        let a = Channel::<Sim>::prepare_shared(&ca, &pa, &c, &q, &q).unwrap();
        let b = Channel::<Sim>::prepare(&cb, &pb, &c).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        assert!(matches!(Ch::new(a), Err(Error::InvalidAttribute(_))));
    });
}
