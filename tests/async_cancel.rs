//! Cancellation, as a property: random programs of receives (some of whose futures are
//! dropped after a random number of polls) and sends, on a fabric that loses, duplicates
//! and delays packets. Checked: every live receive gets exactly the message the receive
//! queue's order gives it, intact; no buffer goes back to the pool while the device may
//! still write it (a canary allocated right after each drop, likely on the freed block,
//! stays untouched); every buffer is back in the pool once the channels are gone; every
//! task finishes (no lost wake-up). Each program runs with the channels on queues of their
//! own or on shared ones (`AsyncQueue`, each side also carrying an idle second channel, so
//! completions are routed among inboxes).
#![cfg(all(feature = "sim", feature = "tokio"))]

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use zverbs::provider::sim::{FabricConfig, Faults, Sim};
use zverbs::tokio::{AsyncChannel, AsyncQueue};
use zverbs::{ChannelConfig, Context, LocalBuf, MrPool};

type Ch = AsyncChannel<Sim>;

const MSG: usize = 16;
const CANARY: u8 = 0xAA;

#[derive(Clone, Debug)]
enum Step {
    /// Post a receive; `Some(k)`: poll its future `k` times (≥ 1: it is posted), then
    /// drop it. `None`: a task awaits it.
    Receive(Option<u8>),
    /// Send the next message (only when more receives than sends were posted).
    Send,
}

fn program() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            2 => Just(Step::Receive(None)),
            2 => (1u8..4).prop_map(|k| Step::Receive(Some(k))),
            3 => Just(Step::Send),
        ],
        1..40,
    )
}

fn faults(seed: u64) -> Sim {
    let cfg = FabricConfig {
        seed,
        faults: Faults {
            drop: 0.05,
            duplicate: 0.05,
            delay: 0.1,
            max_extra_delay_ns: 20_000,
        },
        ..FabricConfig::default()
    };
    Sim::with_config(cfg, 2)
}

/// A waker that does nothing: the test polls by hand.
struct Noop;

impl std::task::Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// What one program did: message `i` went to the `i`-th posted receive.
fn run(seed: u64, steps: &[Step], shared: bool) -> Result<(), TestCaseError> {
    let noop = Waker::from(Arc::new(Noop));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = faults(seed);
        let cfg = ChannelConfig {
            timeout: Some(Duration::from_secs(20)),
            ..ChannelConfig::default()
        };
        let open = |dev: &str| {
            let ctx = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
            let pd = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
            let q = shared.then(|| AsyncQueue::create(ctx, 4, 64).unwrap());
            let prep = || match &q {
                Some(q) => Ch::prepare_shared(ctx, pd, &cfg, q, q).unwrap(),
                None => Ch::prepare(ctx, pd, &cfg).unwrap(),
            };
            ((prep(), prep()), MrPool::new(pd, 1 << 16).unwrap())
        };
        let (((a, a2), pool_a), ((b, b2), pool_b)) = (open("sim0"), open("sim1"));
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let a = Ch::new(a.connect(&eb).unwrap()).unwrap();
        let b = Ch::new(b.connect(&ea).unwrap()).unwrap();
        // A second, idle pair on the same queues: its inboxes are there to route around.
        let (ea2, eb2) = (a2.endpoint(), b2.endpoint());
        let idle = (
            Ch::new(a2.connect(&eb2).unwrap()).unwrap(),
            Ch::new(b2.connect(&ea2).unwrap()).unwrap(),
        );

        // The i-th receive posted gets message i; `live[i]` says whether a task awaits it.
        let mut live = Vec::new();
        let got = Arc::new(Mutex::new(Vec::<(usize, Vec<u8>)>::new()));
        let mut tasks = Vec::new();
        let mut canaries: Vec<LocalBuf<Sim>> = Vec::new();
        let mut sent = 0usize;
        for step in steps {
            match *step {
                Step::Receive(None) => {
                    let index = live.len();
                    live.push(true);
                    let (b, pool, got) = (b.clone(), pool_b.clone(), got.clone());
                    // Post now (one poll), await in a task.
                    let mut fut = Box::pin(async move {
                        let (r, buf) = b.receive(pool.alloc(MSG).unwrap()).await;
                        r.unwrap();
                        got.lock().unwrap().push((index, buf[..].to_vec()));
                    });
                    let mut cx = TaskContext::from_waker(&noop);
                    if fut.as_mut().poll(&mut cx).is_pending() {
                        tasks.push(tokio::spawn(fut));
                    }
                }
                Step::Receive(Some(polls)) => {
                    live.push(false);
                    {
                        let fut = b.receive(pool_b.alloc(MSG).unwrap());
                        let mut fut = pin!(fut);
                        let mut cx = TaskContext::from_waker(&noop);
                        for _ in 0..polls {
                            if let Poll::Ready((r, _)) = fut.as_mut().poll(&mut cx) {
                                // It finished: the message it took is gone with it.
                                r.unwrap();
                                break;
                            }
                        }
                    }
                    let mut canary = pool_b.alloc(MSG).unwrap();
                    canary.fill(CANARY);
                    canaries.push(canary);
                }
                Step::Send => {
                    if sent >= live.len() {
                        continue;
                    }
                    let mut msg = pool_a.alloc(MSG).unwrap();
                    msg.fill(0);
                    msg[..8].copy_from_slice(&(sent as u64).to_le_bytes());
                    let (r, _) = a.send(msg).await;
                    r.unwrap();
                    sent += 1;
                }
            }
            tokio::task::yield_now().await;
        }
        // Every live receive that was sent to finishes; the others wait for good.
        let t0 = Instant::now();
        loop {
            let done = got.lock().unwrap().len();
            let due = live[..sent].iter().filter(|&&l| l).count();
            if done == due {
                break;
            }
            // Half the channel's timeout: a receive that ends only at its deadline (and
            // finds its message then) lost its wake-up.
            prop_assert!(
                t0.elapsed() < Duration::from_secs(10),
                "lost wake-up: {done} of {due}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for (index, bytes) in got.lock().unwrap().iter() {
            prop_assert!(
                *index < sent,
                "receive {index} finished with no message for it"
            );
            prop_assert_eq!(
                &bytes[..8],
                &(*index as u64).to_le_bytes(),
                "receive {}",
                index
            );
        }
        for c in &canaries {
            prop_assert!(
                c.iter().all(|&x| x == CANARY),
                "the device wrote a released buffer"
            );
        }
        drop(canaries);
        for t in tasks {
            t.abort();
        }
        drop((a, b, idle));
        let t0 = Instant::now();
        while pool_a.stats().allocations + pool_b.stats().allocations != 0 {
            prop_assert!(
                t0.elapsed() < Duration::from_secs(20),
                "buffers never released"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn dropped_futures_never_release_a_buffer_early_nor_lose_a_message(
        seed in any::<u64>(),
        steps in program(),
        shared in any::<bool>(),
    ) {
        let r = run(seed, &steps, shared);
        if r.is_err() {
            eprintln!("seed {seed}, shared {shared}, steps {steps:?}");
        }
        r?;
    }
}
