//! The async channel (`zverbs::tokio`) on the simulator: every operation, many tasks on one
//! channel, both runtimes, and what happens to buffers when futures are dropped, time out
//! or the channel closes.
#![cfg(all(feature = "sim", feature = "tokio"))]

mod common;

use common::rt::{current_thread, filled, multi_thread, target, within};
use std::time::{Duration, Instant};

use zverbs::provider::sim::Sim;
use zverbs::tokio::AsyncChannel;
use zverbs::{ChannelConfig, Context, Error, ErrorKind, MrPool, ProtectionDomain, WaitPolicy};

type Ch = AsyncChannel<Sim>;

struct Side {
    ch: Ch,
    pool: MrPool<Sim>,
    pd: &'static ProtectionDomain<Sim>,
}

/// Two connected async channels on sim0 and sim1, each with a 1 MiB pool.
fn pair(cfg: &ChannelConfig) -> (Side, Side) {
    pair_on(&Sim::with_devices(2), cfg)
}

/// As [`pair`], on `sim`'s devices 0 and 1.
fn pair_on(sim: &Sim, cfg: &ChannelConfig) -> (Side, Side) {
    let open = |dev: &str| {
        let ctx: &'static Context<Sim> = Box::leak(Box::new(Context::open(sim, dev).unwrap()));
        let pd: &'static ProtectionDomain<Sim> = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        (ctx, pd, Ch::prepare(ctx, pd, cfg).unwrap())
    };
    let ((_, pa, a), (_, pb, b)) = (open("sim0"), open("sim1"));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let side = |ch, pd: &'static ProtectionDomain<Sim>| Side {
        ch: AsyncChannel::new(ch).unwrap(),
        pool: MrPool::new(pd, 1 << 20).unwrap(),
        pd,
    };
    (side(a, pa), side(b, pb))
}

fn cfg(timeout: Duration) -> ChannelConfig {
    ChannelConfig {
        timeout: Some(timeout),
        flush_grace: Duration::from_millis(50),
        ..ChannelConfig::default()
    }
}

/// As [`cfg`], with operations that sleep at once (the reactor wakes them).
fn sleeping(timeout: Duration) -> ChannelConfig {
    ChannelConfig {
        wait: WaitPolicy::SpinSleep,
        ..cfg(timeout)
    }
}

#[test]
fn send_and_receive_with_and_without_immediate() {
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(5)));
        let inbox = b.pool.alloc(64).unwrap();
        let (got, sent) = tokio::join!(b.ch.receive(inbox), a.ch.send(filled(&a.pool, b"hello")));
        sent.0.unwrap();
        let (done, inbox) = got;
        assert_eq!(done.unwrap().byte_len, 5);
        assert_eq!(&inbox[..5], b"hello");

        let (got, sent) = tokio::join!(
            b.ch.receive(inbox),
            a.ch.send_with_imm(filled(&a.pool, b"imm!"), 0xfeed)
        );
        sent.0.unwrap();
        let done = got.0.unwrap();
        assert_eq!((done.byte_len, done.imm), (4, Some(0xfeed)));
    });
}

#[test]
fn write_read_and_atomics_on_a_remote_region() {
    multi_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(5)));
        let (mr, remote) = target(b.pd, 64);
        let (r, _) = a.ch.write(filled(&a.pool, b"written"), &remote).await;
        r.unwrap();
        assert_eq!(&mr.as_slice()[..7], b"written");

        let (r, back) = a.ch.read(a.pool.alloc(7).unwrap(), &remote).await;
        r.unwrap();
        assert_eq!(&back[..], b"written");

        let counter = remote.slice(8..16).unwrap();
        let (old, word) = a.ch.fetch_add(a.pool.alloc(8).unwrap(), &counter, 5).await;
        assert_eq!(old.unwrap(), 0);
        let (old, word) = a.ch.fetch_add(word, &counter, 2).await;
        assert_eq!(old.unwrap(), 5);
        let (old, word) = a.ch.compare_swap(word, &counter, 7, 100).await;
        assert_eq!(old.unwrap(), 7);
        let (old, _) = a.ch.compare_swap(word, &counter, 7, 1).await;
        assert_eq!(old.unwrap(), 100, "no swap: the value was not 7");

        // Write with immediate consumes a receive at the peer.
        let tail = remote.slice(32..).unwrap();
        let (got, wrote) = tokio::join!(
            b.ch.receive(b.pool.alloc(8).unwrap()),
            a.ch.write_with_imm(filled(&a.pool, b"imm"), &tail, 9)
        );
        wrote.0.unwrap();
        assert_eq!(got.0.unwrap().imm, Some(9));
        assert_eq!(&mr.as_slice()[32..35], b"imm");
    });
}

#[test]
fn bad_input_is_a_typed_error_and_the_buffer_comes_back() {
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(5)));
        let (_mr, remote) = target(b.pd, 16);
        // Longer than the remote region.
        let (r, buf) = a.ch.write(a.pool.alloc(17).unwrap(), &remote).await;
        assert!(matches!(r, Err(Error::OutOfBounds(_))), "{r:?}");
        assert_eq!(buf.len(), 17);
        drop(buf);
        // An atomic's local buffer is 8 bytes.
        let (r, buf) = a.ch.fetch_add(a.pool.alloc(4).unwrap(), &remote, 1).await;
        assert!(matches!(r, Err(Error::InvalidAttribute(_))), "{r:?}");
        drop(buf);
        assert_eq!(a.pool.stats().allocations, 0);
    });
}

#[test]
fn many_tasks_share_one_channel_on_a_multi_thread_runtime() {
    const MESSAGES: u32 = 200;
    multi_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(10)));
        // 200 receives and 200 sends from 16 tasks each side, more than the 64 slots.
        let receivers: Vec<_> = (0..16)
            .map(|t| {
                let (ch, pool) = (b.ch.clone(), b.pool.clone());
                tokio::spawn(async move {
                    let mut sum = 0u64;
                    for _ in (t..MESSAGES).step_by(16) {
                        let (r, buf) = ch.receive(pool.alloc(8).unwrap()).await;
                        assert_eq!(r.unwrap().byte_len, 8);
                        sum += u64::from_le_bytes(buf[..8].try_into().unwrap());
                    }
                    sum
                })
            })
            .collect();
        let senders: Vec<_> = (0..16u32)
            .map(|t| {
                let (ch, pool) = (a.ch.clone(), a.pool.clone());
                tokio::spawn(async move {
                    for i in (t..MESSAGES).step_by(16) {
                        let buf = filled(&pool, &u64::from(i).to_le_bytes());
                        ch.send(buf).await.0.unwrap();
                    }
                })
            })
            .collect();
        for s in senders {
            s.await.unwrap();
        }
        let mut total = 0;
        for r in receivers {
            total += r.await.unwrap();
        }
        assert_eq!(total, (0..u64::from(MESSAGES)).sum::<u64>());
        assert_eq!(a.pool.stats().allocations, 0);
        assert_eq!(b.pool.stats().allocations, 0);
    });
}

/// More operations wait for room than the channel keeps wakers for (64): those past the
/// list poll again at every turn, and every one of them posts once room comes free.
#[test]
fn more_operations_wait_for_room_than_the_channel_keeps_wakers_for() {
    const WAITING: usize = 100;
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(10)));
        // The 64 receive slots taken by receives whose futures were dropped.
        for _ in 0..64 {
            drop(b.ch.receive(b.pool.alloc(8).unwrap()));
        }
        let waiting: Vec<_> = (0..WAITING)
            .map(|_| {
                let (ch, pool) = (b.ch.clone(), b.pool.clone());
                tokio::spawn(async move {
                    let (r, buf) = ch.receive(pool.alloc(8).unwrap()).await;
                    assert_eq!(r.unwrap().byte_len, 8);
                    u64::from_le_bytes(buf[..8].try_into().unwrap())
                })
            })
            .collect();
        // Let every task find the queue full before the first message frees a slot.
        tokio::task::yield_now().await;
        for i in 0..(64 + WAITING) as u64 {
            a.ch.send(filled(&a.pool, &i.to_le_bytes()))
                .await
                .0
                .unwrap();
        }
        let mut got = Vec::new();
        for w in waiting {
            got.push(within(Duration::from_secs(10), w).await.unwrap());
        }
        // The dropped receives took the first 64 messages; the tasks the rest.
        got.sort_unstable();
        assert_eq!(got, (64..(64 + WAITING) as u64).collect::<Vec<_>>());
        assert_eq!(b.pool.stats().allocations, 0);
    });
}

/// A write that finds the send queue full keeps its request (the remote address and key
/// included) and posts it once room comes: its bytes land where it was aimed, after the
/// sends that filled the queue.
#[test]
fn a_write_waiting_for_room_lands_where_it_was_aimed() {
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(10)));
        let (mr, remote) = target(b.pd, 8);
        // The 64 send slots taken by sends B has no receive for (RNR keeps them in
        // flight), their futures dropped.
        for i in 0..64u64 {
            drop(a.ch.send(filled(&a.pool, &i.to_le_bytes())));
        }
        let mut write = std::pin::pin!(a.ch.write(filled(&a.pool, b"landed!!"), &remote));
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut write)
            .await
            .is_err());
        assert_eq!(mr.as_slice(), [0; 8], "written before the queue had room");
        let receives = async {
            for i in 0..64u64 {
                let (r, buf) = b.ch.receive(b.pool.alloc(8).unwrap()).await;
                assert_eq!(r.unwrap().byte_len, 8);
                assert_eq!(buf[..8], i.to_le_bytes());
            }
        };
        let ((done, _), ()) = tokio::join!(write, receives);
        done.unwrap();
        assert_eq!(mr.as_slice(), b"landed!!");
    });
}

#[test]
fn a_dropped_receive_keeps_its_buffer_until_the_message_lands() {
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(5)));
        {
            let fut = b.ch.receive(b.pool.alloc(32).unwrap());
            // Posted when called; polled for 5 ms, then dropped.
            assert!(tokio::time::timeout(Duration::from_millis(5), fut)
                .await
                .is_err());
        }
        orphan_lands(&a, &b, b"late").await;
    });
}

/// B's one buffer is with the channel (a receive whose future was dropped): it stays
/// there until a message from A lands in it, then goes back to B's pool (the reactor sees
/// the receive finish and drops the buffer).
async fn orphan_lands(a: &Side, b: &Side, msg: &[u8]) {
    assert_eq!(
        b.pool.stats().allocations,
        1,
        "the device may still write the buffer: the channel keeps it"
    );
    a.ch.send(filled(&a.pool, msg)).await.0.unwrap();
    let t0 = Instant::now();
    while b.pool.stats().allocations != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "orphan never released"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn an_operation_posts_when_called_and_a_dropped_unpolled_one_keeps_its_buffer() {
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(5)));
        // B's receive is posted by the call: A's send, awaited before the receive is ever
        // polled, finds it (a lazy post would leave the send waiting for a receive).
        let received = b.ch.receive(b.pool.alloc(32).unwrap());
        a.ch.send(filled(&a.pool, b"first")).await.0.unwrap();
        let (done, inbox) = received.await;
        assert_eq!(done.unwrap().byte_len, 5);
        assert_eq!(&inbox[..5], b"first");
        drop(inbox);
        // Called and dropped without a poll: posted all the same, so its buffer stays
        // with the channel until the message lands in it.
        drop(b.ch.receive(b.pool.alloc(32).unwrap()));
        orphan_lands(&a, &b, b"second").await;
    });
}

#[test]
fn a_receive_that_times_out_returns_its_buffer_with_timeout() {
    current_thread().block_on(async {
        let timeout = Duration::from_millis(100);
        let (_a, b) = pair(&cfg(timeout));
        let t0 = Instant::now();
        let (r, buf) = b.ch.receive(b.pool.alloc(16).unwrap()).await;
        assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
        assert_eq!(buf.len(), 16);
        assert!(
            t0.elapsed() < 10 * (timeout + Duration::from_millis(50)),
            "bounded by the timeout and the grace"
        );
    });
}

/// A dead device ends a receive at once, not at its 10 s timeout, whatever the wait
/// policy: the reactor's pass (sleeping operations) or the operation's own polls (busy
/// ones) meet the dead queues, mark the channel dead, and the operation ends with the
/// device's fatal error and its buffer back.
#[test]
fn a_dead_device_ends_a_receive_at_once() {
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        dead_device_ends_a_receive(wait);
    }
}

fn dead_device_ends_a_receive(wait: WaitPolicy) {
    multi_thread().block_on(async {
        let sim = Sim::with_devices(2);
        let long = ChannelConfig {
            wait,
            ..cfg(Duration::from_secs(10))
        };
        let (_a, b) = pair_on(&sim, &long);
        let fabric = sim.fabric().clone();
        let killer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            fabric.crash(1).unwrap();
            Instant::now()
        });
        let (r, buf) = b.ch.receive(b.pool.alloc(16).unwrap()).await;
        let died = killer.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), ErrorKind::DeviceFatal, "{wait:?}");
        assert_eq!(buf.len(), 16);
        let after = died.elapsed();
        assert!(
            after < Duration::from_secs(2),
            "{wait:?}: {after:?} after the death"
        );
    });
}

/// Every wait policy keeps the bound: spinning reads the clock, sleeping leaves the
/// deadline with the reactor, which wakes the operation when it passes.
#[test]
fn every_wait_policy_times_out_within_its_bound() {
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        current_thread().block_on(async {
            let timeout = Duration::from_millis(100);
            let (_a, b) = pair(&ChannelConfig {
                wait,
                ..cfg(timeout)
            });
            let t0 = Instant::now();
            let op = b.ch.receive(b.pool.alloc(16).unwrap());
            let (r, buf) = within(10 * (timeout + Duration::from_millis(50)), op).await;
            assert!(matches!(r, Err(Error::Timeout)), "{wait:?}: {r:?}");
            assert_eq!(buf.len(), 16);
            let took = t0.elapsed();
            assert!(took >= timeout, "{wait:?}: ended early, after {took:?}");
            assert!(
                took < 10 * (timeout + Duration::from_millis(50)),
                "{wait:?}: bounded by the timeout and the grace, took {took:?}"
            );
        });
    }
}

/// Many operations asleep at once on a multi-thread runtime, with deadlines: the reactor's
/// one timer wakes each in time. The first to time out breaks the channel, so the others
/// end with a flush or a timeout; every one ends within the bound, with its buffer.
#[test]
fn many_sleeping_operations_end_within_their_bound_on_a_multi_thread_runtime() {
    multi_thread().block_on(async {
        let timeout = Duration::from_millis(100);
        let c = sleeping(timeout);
        let (_a, b) = pair(&c);
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (ch, pool) = (b.ch.clone(), b.pool.clone());
                tokio::spawn(async move { ch.receive(pool.alloc(16).unwrap()).await })
            })
            .collect();
        let mut timeouts = 0;
        for t in tasks {
            let (r, buf) = within(10 * (timeout + Duration::from_millis(50)), t)
                .await
                .unwrap();
            assert!(r.is_err(), "nobody sent: {r:?}");
            timeouts += usize::from(matches!(r, Err(Error::Timeout)));
            assert_eq!(buf.len(), 16);
        }
        assert!(timeouts >= 1, "one of them timed out first");
        assert!(
            t0.elapsed() >= timeout,
            "ended early, after {:?}",
            t0.elapsed()
        );
        assert_eq!(b.pool.stats().allocations, 0);
    });
}

/// An operation that finds the queue full waits for room within the channel's timeout:
/// nothing was posted, so it ends with `Timeout` and its buffer, and the channel still
/// works.
#[test]
fn an_operation_waiting_for_room_times_out_with_its_buffer() {
    current_thread().block_on(async {
        let timeout = Duration::from_millis(100);
        let c = sleeping(timeout);
        let (a, b) = pair(&c);
        // 64 receives posted (futures dropped unpolled: the channel keeps their buffers).
        for _ in 0..64 {
            drop(b.ch.receive(b.pool.alloc(8).unwrap()));
        }
        let t0 = Instant::now();
        let op = b.ch.receive(b.pool.alloc(16).unwrap());
        let (r, buf) = within(10 * timeout, op).await;
        let took = t0.elapsed();
        assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
        assert_eq!(buf.len(), 16);
        assert!(took >= timeout, "ended early, after {took:?}");
        assert!(took < 10 * timeout, "bounded by the timeout, took {took:?}");
        // Not posted, so nothing broke: a message lands in the oldest receive.
        let (s, _) = a.ch.send(filled(&a.pool, b"still up")).await;
        s.unwrap();
    });
}

#[test]
fn dropping_the_channel_flushes_and_releases_the_buffers_of_dropped_futures() {
    current_thread().block_on(async {
        let (a, b) = pair(&cfg(Duration::from_secs(5)));
        for _ in 0..4 {
            let fut = b.ch.receive(b.pool.alloc(64).unwrap());
            let _ = tokio::time::timeout(Duration::from_millis(1), fut).await;
        }
        assert_eq!(b.pool.stats().allocations, 4);
        let pool = b.pool.clone();
        drop(b);
        let t0 = Instant::now();
        while pool.stats().allocations != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "buffers never released"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(a);
    });
}

#[test]
fn spinning_policy_ping_pong() {
    let cfg = ChannelConfig {
        wait: WaitPolicy::Spin,
        ..cfg(Duration::from_secs(5))
    };
    multi_thread().block_on(async move {
        let (a, b) = pair(&cfg);
        // The echo posts its next receive before it echoes, so no message meets a missing
        // receive (`join!` polls, and so posts, in order).
        let echo = tokio::spawn(async move {
            let (r, mut got) = b.ch.receive(b.pool.alloc(8).unwrap()).await;
            r.unwrap();
            let mut spare = b.pool.alloc(8).unwrap();
            for i in 0..100 {
                if i == 99 {
                    b.ch.send(got).await.0.unwrap();
                    break;
                }
                let ((r, next), (s, sent)) = tokio::join!(b.ch.receive(spare), b.ch.send(got));
                s.unwrap();
                r.unwrap();
                (got, spare) = (next, sent);
            }
        });
        let mut buf = filled(&a.pool, &7u64.to_le_bytes());
        for _ in 0..100 {
            let inbox = a.pool.alloc(8).unwrap();
            let recv = a.ch.receive(inbox);
            let send = a.ch.send(buf);
            let ((r, inbox), (s, sent)) = tokio::join!(recv, send);
            s.unwrap();
            assert_eq!(r.unwrap().byte_len, 8);
            assert_eq!(&inbox[..], &7u64.to_le_bytes());
            buf = sent;
        }
        echo.await.unwrap();
    });
}

/// Two current-thread runtimes on two threads (thread-per-core), each with its channel's
/// reactor: a thousand round trips.
#[test]
fn ping_pong_between_two_current_thread_runtimes() {
    let (rt_a, rt_b) = (current_thread(), current_thread());
    let sim = Sim::with_devices(2);
    let cfg = cfg(Duration::from_secs(5));
    let prep = |dev: &str| {
        let ctx: &'static Context<Sim> = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
        let pd: &'static ProtectionDomain<Sim> = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        (
            Ch::prepare(ctx, pd, &cfg).unwrap(),
            MrPool::new(pd, 1 << 16).unwrap(),
        )
    };
    let ((a, pa), (b, pb)) = (prep("sim0"), prep("sim1"));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let a = {
        let _in = rt_a.enter();
        Ch::new(a).unwrap()
    };
    let b = {
        let _in = rt_b.enter();
        Ch::new(b).unwrap()
    };
    let echo = std::thread::spawn(move || {
        rt_b.block_on(async {
            for i in 0..1000 {
                let (r, got) = b.receive(pb.alloc(8).unwrap()).await;
                r.unwrap_or_else(|e| panic!("echo receive {i}: {e:?}"));
                b.send(got).await.0.unwrap();
            }
        })
    });
    rt_a.block_on(async {
        for i in 0..1000u64 {
            let msg = filled(&pa, &i.to_le_bytes());
            let ((r, back), (s, _)) = tokio::join!(a.receive(pa.alloc(8).unwrap()), a.send(msg));
            s.unwrap_or_else(|e| panic!("send {i}: {e:?}"));
            r.unwrap_or_else(|e| panic!("receive {i}: {e:?}"));
            assert_eq!(&back[..], &i.to_le_bytes());
        }
    });
    echo.join().unwrap();
}

/// A root and three leaves: the root scatters one part to each leaf, then gathers one
/// answer from each; a gather dropped midway leaves its posted buffers with the channels
/// until messages land in them.
#[test]
fn a_group_scatters_gathers_and_keeps_the_buffers_of_a_dropped_gather() {
    use zverbs::tokio::AsyncGroup;
    multi_thread().block_on(async {
        let sim = Sim::with_devices(4);
        let cfg = cfg(Duration::from_secs(5));
        let ctx: Vec<&'static Context<Sim>> = (0..4)
            .map(|i| &*Box::leak(Box::new(Context::open(&sim, &format!("sim{i}")).unwrap())))
            .collect();
        let pd: Vec<&'static ProtectionDomain<Sim>> = ctx
            .iter()
            .map(|c| &*Box::leak(Box::new(c.alloc_pd().unwrap())))
            .collect();
        let pools: Vec<MrPool<Sim>> = pd
            .iter()
            .map(|p| MrPool::new(p, 1 << 16).unwrap())
            .collect();
        let pair = |i: usize| {
            let a = Ch::prepare(ctx[0], pd[0], &cfg).unwrap();
            let b = Ch::prepare(ctx[i], pd[i], &cfg).unwrap();
            let (ea, eb) = (a.endpoint(), b.endpoint());
            let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
            (Ch::new(a).unwrap(), Ch::new(b).unwrap())
        };
        let ((r1, l1), (r2, l2), (r3, l3)) = (pair(1), pair(2), pair(3));
        let root = AsyncGroup::new([r1, r2, r3]);
        let leaves = [l1, l2, l3];
        let parts = [b"p1", b"p2", b"p3"].map(|p| filled(&pools[0], p));
        let inboxes: [_; 3] = core::array::from_fn(|i| pools[i + 1].alloc(8).unwrap());
        let mut inboxes = inboxes.map(Some);
        let (sent, got) = tokio::join!(root.scatter(parts), async {
            let mut out = Vec::new();
            for (i, leaf) in leaves.iter().enumerate() {
                let (r, buf) = leaf.receive(inboxes[i].take().unwrap()).await;
                out.push((r.unwrap().byte_len, buf[..2].to_vec()));
            }
            out
        });
        assert!(sent.iter().all(|(r, _)| r.is_ok()));
        assert_eq!(
            got,
            [
                (2, b"p1".to_vec()),
                (2, b"p2".to_vec()),
                (2, b"p3".to_vec())
            ]
        );

        // A gather dropped before any leaf answered: its three buffers stay lent.
        let before = pools[0].stats().allocations;
        {
            let bufs: [_; 3] = core::array::from_fn(|_| pools[0].alloc(8).unwrap());
            let _ = tokio::time::timeout(Duration::from_millis(5), root.gather(bufs)).await;
        }
        assert_eq!(pools[0].stats().allocations, before + 3);
        // The leaves answer; a second gather gets the next answers.
        for (i, leaf) in leaves.iter().enumerate() {
            let (r, _) = leaf.send(filled(&pools[i + 1], b"late")).await;
            r.unwrap();
        }
        let t0 = Instant::now();
        while pools[0].stats().allocations != before {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "gather buffers never released"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let bufs: [_; 3] = core::array::from_fn(|_| pools[0].alloc(8).unwrap());
        let (got, ()) = tokio::join!(root.gather(bufs), async {
            for (i, leaf) in leaves.iter().enumerate() {
                leaf.send(filled(&pools[i + 1], b"ok")).await.0.unwrap();
            }
        });
        for (r, buf) in &got {
            assert_eq!(r.as_ref().unwrap().byte_len, 2);
            assert_eq!(&buf[..2], b"ok");
        }
    });
}

/// Timeouts and graces past what `Instant` holds mean no bound, not a panic: operations
/// work, and closing with a receive still posted does not spin or panic.
#[test]
fn huge_timeouts_and_graces_are_no_bound_not_a_panic() {
    current_thread().block_on(async {
        let cfg = ChannelConfig {
            timeout: Some(Duration::MAX),
            flush_grace: Duration::MAX,
            ..ChannelConfig::default()
        };
        let (a, b) = pair(&cfg);
        let (got, sent) = tokio::join!(
            b.ch.receive(b.pool.alloc(8).unwrap()),
            a.ch.send(filled(&a.pool, b"x"))
        );
        sent.0.unwrap();
        let (got, inbox) = got;
        assert_eq!(got.unwrap().byte_len, 1);
        drop(inbox);
        // A receive left posted, then the channel closed: the flush releases it.
        let _ = tokio::time::timeout(
            Duration::from_millis(5),
            b.ch.receive(b.pool.alloc(8).unwrap()),
        )
        .await;
        let pool = b.pool.clone();
        drop(b);
        let t0 = Instant::now();
        while pool.stats().allocations != 0 {
            assert!(t0.elapsed() < Duration::from_secs(5), "never released");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}
