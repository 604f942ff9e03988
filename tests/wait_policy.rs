//! Wait policies: spin, spin then yield, spin then sleep on the completion channel. A
//! sleeping waiter uses almost no CPU while it waits for a slow peer (measured with
//! `getrusage(RUSAGE_THREAD)`; on the timed fabric the simulator's clock thread too, from
//! `/proc`), wakes when the completion comes, and every policy is bounded by the timeout.
#![cfg(all(feature = "sim", target_os = "linux"))]

mod common;

use std::time::{Duration, Instant};

use common::pair_on;
use zverbs::provider::sim::Sim;
use zverbs::{ChannelConfig, Context, CqLayout, ErrorKind, MultiChannel, WaitPolicy};

/// CPU time (user + system) this thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut ru), 0);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn cfg(wait: WaitPolicy) -> ChannelConfig {
    ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        wait,
        ..ChannelConfig::default()
    }
}

const SLOW_PEER: Duration = Duration::from_secs(1);

/// CPU time used so far by the simulator's clock threads of this process (`/proc`, in
/// clock ticks of 10 ms).
fn clock_threads_cpu() -> Duration {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        // The kernel keeps 15 bytes of a thread name: "zverbs-sim-cloc".
        let name = comm.trim();
        if name.len() < 15 || !"zverbs-sim-clock".starts_with(name) {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        // Fields after the command name's closing parenthesis: state is field 3, utime
        // and stime are fields 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = |i: usize| {
            f.get(i - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        ticks += t(14) + t(15);
    }
    Duration::from_millis(10 * ticks)
}

#[test]
fn a_sleeping_receive_waits_a_second_on_almost_no_cpu() {
    sleeping_receive(Sim::with_devices(2), false);
}

/// The timed fabric: simulated time follows the wall clock, and a clock thread runs the
/// events that fall due while a queue is armed. With nothing scheduled it sleeps too.
#[test]
fn a_sleeping_receive_on_the_timed_fabric_waits_on_almost_no_cpu() {
    let timed = zverbs::provider::sim::FabricConfig::default();
    sleeping_receive(Sim::with_config(timed, 2), true);
}

fn sleeping_receive(sim: Sim, timed: bool) {
    let c = cfg(WaitPolicy::SpinSleep);
    let (a, mut b) = pair_on::<16>(&sim, &c, &c);
    let (mut a_ch, a_pd) = (a.ch, a.pd);
    let mut inbox = [0u8; 8];
    let mut inbox = b.pd.register(&mut inbox).unwrap();
    std::thread::scope(|t| {
        t.spawn(move || {
            std::thread::sleep(SLOW_PEER);
            let mut msg = *b"slow";
            a_ch.send([a_pd.register(&mut msg).unwrap().slice(..).unwrap()])
                .unwrap();
        });
        let (cpu0, clock0, wall0) = (thread_cpu(), clock_threads_cpu(), Instant::now());
        let got = b.ch.receive([inbox.slice_mut(..).unwrap()]).unwrap();
        let (cpu, wall) = (thread_cpu() - cpu0, wall0.elapsed());
        let clock = clock_threads_cpu() - clock0;
        assert_eq!(got.byte_len, 4);
        assert!(wall >= SLOW_PEER - Duration::from_millis(50), "{wall:?}");
        assert!(
            cpu < wall / 5,
            "a sleeping wait used {cpu:?} of CPU in {wall:?}"
        );
        // Under 5 % of a core for the sleeper and the fabric's clock together.
        assert!(
            cpu + clock < wall / 20,
            "timed={timed}: the wait used {cpu:?} and the clock thread {clock:?} in {wall:?}"
        );
    });
    assert_eq!(&inbox.as_slice()[..4], b"slow");
}

#[test]
fn a_sleeping_receive_over_shared_queues_waits_on_almost_no_cpu() {
    let sim = Sim::with_devices(2);
    let c = ChannelConfig {
        completion_queues: CqLayout::Shared,
        ..cfg(WaitPolicy::SpinSleep)
    };
    let (c0, c1) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (p0, p1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let a = MultiChannel::<Sim, 2, 16, 1>::prepare(&c0, &p0, [1], &c).unwrap();
    let b = MultiChannel::<Sim, 2, 16, 1>::prepare(&c1, &p1, [0], &c).unwrap();
    let (ea, eb) = (a.endpoint(1).unwrap(), b.endpoint(0).unwrap());
    let mut a = a.connect(|_| Some(eb)).unwrap();
    let mut b = b.connect(|_| Some(ea)).unwrap();
    let mut inbox = [0u8; 8];
    let mut inbox = p1.register(&mut inbox).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| {
            std::thread::sleep(SLOW_PEER);
            let mut msg = *b"late";
            let msg = p0.register(&mut msg).unwrap();
            a.peer(1).unwrap().send([msg.slice(..).unwrap()]).unwrap();
        });
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        let ch = b.peer(0).unwrap();
        assert!(ch.shares_completion_queues());
        let got = ch.receive([inbox.slice_mut(..).unwrap()]).unwrap();
        let (cpu, wall) = (thread_cpu() - cpu0, wall0.elapsed());
        assert_eq!(got.byte_len, 4);
        assert!(cpu < wall / 5, "used {cpu:?} of CPU in {wall:?}");
    });
}

#[test]
fn every_policy_is_bounded_by_the_timeout() {
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        let c = ChannelConfig {
            timeout: Some(Duration::from_millis(100)),
            ..cfg(wait)
        };
        let (_a, mut b) = pair_on::<16>(&Sim::with_devices(2), &c, &c);
        let mut inbox = [0u8; 8];
        let mut inbox = b.pd.register(&mut inbox).unwrap();
        let start = Instant::now();
        // Nobody sends: the receive times out.
        let e = b.ch.receive([inbox.slice_mut(..).unwrap()]).unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{wait:?}: {e}");
        assert!(took >= Duration::from_millis(100), "{wait:?}: {took:?}");
        assert!(took < Duration::from_secs(2), "{wait:?}: {took:?}");
    }
}

#[test]
fn every_policy_carries_a_ping_pong() {
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        let c = cfg(wait);
        let (mut a, mut b) = pair_on::<16>(&Sim::with_devices(2), &c, &c);
        let (mut x, mut y) = ([0u8; 8], [0u8; 8]);
        let mut x = a.pd.register(&mut x).unwrap();
        let mut y = b.pd.register(&mut y).unwrap();
        std::thread::scope(|t| {
            t.spawn(|| {
                for i in 0..200u64 {
                    let got = b.ch.receive([y.slice_mut(..).unwrap()]).unwrap();
                    assert_eq!(got.byte_len, 8);
                    assert_eq!(u64::from_le_bytes(y.as_slice().try_into().unwrap()), i);
                    b.ch.send([y.slice(..).unwrap()]).unwrap();
                }
            });
            for i in 0..200u64 {
                x.as_mut_slice().copy_from_slice(&i.to_le_bytes());
                a.ch.send([x.slice(..).unwrap()]).unwrap();
                a.ch.receive([x.slice_mut(..).unwrap()]).unwrap();
                assert_eq!(
                    u64::from_le_bytes(x.as_slice().try_into().unwrap()),
                    i,
                    "{wait:?}"
                );
            }
        });
    }
}

#[test]
fn three_threads_sleep_on_one_shared_queue_and_each_wakes_for_its_own() {
    const LEAVES: usize = 3;
    let sim = Sim::with_devices(LEAVES + 1);
    let c = ChannelConfig {
        completion_queues: CqLayout::Shared,
        ..cfg(WaitPolicy::SpinSleep)
    };
    let ctxs: Vec<_> = (0..=LEAVES)
        .map(|i| Context::open(&sim, &format!("sim{i}")).unwrap())
        .collect();
    let pds: Vec<_> = ctxs.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let root = MultiChannel::<Sim, 4, 8, 1>::prepare(&ctxs[0], &pds[0], 1..=LEAVES, &c).unwrap();
    let leaves: Vec<_> = (1..=LEAVES)
        .map(|i| zverbs::Channel::<Sim, 8, 1>::prepare(&ctxs[i], &pds[i], &c).unwrap())
        .collect();
    let leaf_eps: Vec<_> = leaves.iter().map(|l| l.endpoint()).collect();
    let root_eps: Vec<_> = (1..=LEAVES).map(|p| root.endpoint(p).unwrap()).collect();
    let mut root = root
        .connect(|p| leaf_eps.get(p.wrapping_sub(1)).copied())
        .unwrap();
    let leaves: Vec<_> = leaves
        .into_iter()
        .zip(&root_eps)
        .map(|(l, e)| l.connect(e).unwrap())
        .collect();
    let mut inboxes = [[0u8; 8]; LEAVES];
    let mut regions: Vec<_> = inboxes
        .iter_mut()
        .map(|b| pds[0].register(b).unwrap())
        .collect();
    let wall0 = Instant::now();
    std::thread::scope(|t| {
        // Each leaf sends after its own delay: 300, 600 and 900 ms.
        for (i, mut leaf) in leaves.into_iter().enumerate() {
            let pd = &pds[i + 1];
            t.spawn(move || {
                std::thread::sleep(Duration::from_millis(300 * (i as u64 + 1)));
                let mut msg = [b'0' + i as u8; 3];
                leaf.send([pd.register(&mut msg).unwrap().slice(..).unwrap()])
                    .unwrap();
            });
        }
        // One thread per peer of the root, all sleeping on the root's shared queues.
        let waiters: Vec<_> = root
            .channels_mut()
            .zip(regions.iter_mut())
            .map(|((peer, ch), r)| {
                t.spawn(move || {
                    let cpu0 = thread_cpu();
                    let got = ch.receive([r.slice_mut(..).unwrap()]).unwrap();
                    (peer, got.byte_len, wall0.elapsed(), thread_cpu() - cpu0)
                })
            })
            .collect();
        for w in waiters {
            let (peer, len, woke, cpu) = w.join().unwrap();
            assert_eq!(len, 3);
            let sent = Duration::from_millis(300 * peer as u64);
            assert!(
                woke >= sent,
                "peer {peer} woke at {woke:?}, before its send"
            );
            assert!(cpu < woke / 5, "peer {peer}: {cpu:?} of CPU in {woke:?}");
        }
    });
    drop(regions);
    for (i, b) in inboxes.iter().enumerate() {
        assert_eq!(&b[..3], &[b'0' + i as u8; 3]);
    }
}
