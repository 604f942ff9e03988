//! The RPC layer against raw UD, on the (untimed) simulator, one thread driving both ends
//! so that the figures are software cost per core, every variant in one run:
//!
//! ```text
//! cargo bench --features sim --bench rpc
//! ```
//!
//! - `rtt_32B/raw_ud`: a 32-byte datagram sent from A to B and one sent back, each side
//!   polling its CQ and reposting the receive it used: the floor of any protocol on UD.
//! - `rtt_32B/rpc`: one 32-byte echo request through two [`Rpc`]s (client pass, server
//!   pass, client pass).
//! - `rate_32B/raw_ud`: 8 datagrams per doorbell from A to B, B reposting in a chain.
//! - `rate_32B/rpc`: echo requests with a window of 8 outstanding; elements = RPCs
//!   completed (each also served by the same thread).
//! - `echo_1MiB/ud_packets`: one 1 MiB echo at a time as eRPC moves it: 1,024-byte
//!   datagrams, credits and requests-for-response, each packet copied into the ring and
//!   out of it; bytes = request + response.
//! - `echo_1MiB/bulk_rc`: the same echo on the bulk path (`EngineConfig::bulk`): a
//!   descriptor datagram, an RDMA read of the request, the handler, a descriptor back and
//!   an RDMA read of the response, over the session's reliable connection.
//!
//! Every measured loop runs with its allocations counted and panics if one allocated.

mod common;

use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use zverbs::provider::sim::Sim;
use zverbs::qp::{AddressHandle, QpConfig, QueuePair, ReadyToSend, Ud, UdOptions};
use zverbs::rpc::{BulkConfig, Config, EngineConfig, Event, MsgBuf, Notice, Rpc, SessionId};
use zverbs::{
    AhAttr, CompletionQueue, Context, MemoryRegion, ProtectionDomain, RecvWr, SendFlags, SendOp,
    SendWr, Sge, UdDest, WorkCompletion,
};

use common::{timed_no_alloc, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const MSG: usize = 32;
const WINDOW: usize = 8;
const QKEY: u32 = 0x0205;

/// A raw UD endpoint: queue pair, CQ, and a registered buffer of 8 receive slots of
/// 40 + 64 bytes followed by a send area.
struct Raw {
    qp: QueuePair<Sim, ReadyToSend, Ud>,
    cq: CompletionQueue<Sim>,
    mr: MemoryRegion<'static, Sim>,
    ah: Option<AddressHandle<Sim>>,
    _pd: ProtectionDomain<Sim>,
}

const SLOT: usize = 128;

impl Raw {
    fn new(sim: &Sim, dev: &str) -> Raw {
        let ctx = Box::leak(Box::new(Context::open(sim, dev).unwrap()));
        let pd = ctx.alloc_pd().unwrap();
        let cq = CompletionQueue::create(ctx, 64).unwrap();
        let qp = QueuePair::create_ud(ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
        let opts = UdOptions {
            qkey: QKEY,
            pkey_index: 0,
        };
        let qp = qp
            .into_init(&opts)
            .unwrap()
            .into_rtr()
            .unwrap()
            .into_rts()
            .unwrap();
        let buf: &'static mut [u8] = Box::leak(vec![0u8; SLOT * 16].into_boxed_slice());
        let mr = pd.register(buf).unwrap();
        let raw = Raw {
            qp,
            cq,
            mr,
            ah: None,
            _pd: pd,
        };
        let recvs: Vec<_> = (0..WINDOW as u64).map(|i| raw.recv_wr(i)).collect();
        // SAFETY: the buffer is leaked and only the device touches the receive slots.
        unsafe { raw.qp.post_recv(&recvs) }.unwrap();
        raw
    }

    fn recv_wr(&self, slot: u64) -> RecvWr<1> {
        let mut wr = RecvWr::new(slot);
        wr.sg_list[0] = self.sge(slot as usize * SLOT, (40 + 64) as u32);
        wr.num_sge = 1;
        wr
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.remote().addr + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn aim(&mut self, sim: &Sim, to: &Raw) {
        let _ = sim;
        let e = to.qp.endpoint();
        let attr = AhAttr::new(1, e.gid, 0, e.lid);
        self.ah = Some(AddressHandle::create(&self._pd, &attr).unwrap());
    }

    fn datagram(&self, to: &Raw, wr_id: u64, flags: SendFlags) -> SendWr<1> {
        let dest = UdDest {
            ah: self.ah.as_ref().unwrap().key(),
            remote_qpn: to.qp.qp_num(),
            remote_qkey: QKEY,
        };
        let mut wr = SendWr::new(wr_id, SendOp::Datagram { dest, imm: None }, flags);
        wr.sg_list[0] = self.sge(8 * SLOT, MSG as u32);
        wr.num_sge = 1;
        wr
    }

    /// Polls until `n` receives completed, reposting them as one chain.
    fn take(&self, n: usize) {
        let mut wcs = [WorkCompletion::EMPTY; 16];
        let mut recvs = [RecvWr::<1>::new(0); 16];
        let mut got = 0;
        while got < n {
            let k = self.cq.poll(&mut wcs).unwrap();
            let mut r = 0;
            for wc in &wcs[..k] {
                if wc.opcode == zverbs::WcOpcode::Recv {
                    recvs[r] = self.recv_wr(wc.wr_id);
                    r += 1;
                }
            }
            if r > 0 {
                // SAFETY: as in `new`.
                unsafe { self.qp.post_recv(&recvs[..r]) }.unwrap();
            }
            got += r;
        }
    }
}

fn raw_pair() -> (Raw, Raw) {
    let sim = Sim::with_devices(2);
    let (mut a, mut b) = (Raw::new(&sim, "sim0"), Raw::new(&sim, "sim1"));
    a.aim(&sim, &b);
    b.aim(&sim, &a);
    // Warm up: a window each way, so the fabric's datagram store and the queues have
    // their working size before allocations are counted.
    for (x, y) in [(&a, &b), (&b, &a)] {
        let mut wrs = [x.datagram(y, 0, SendFlags::empty()); WINDOW];
        wrs[WINDOW - 1].flags = SendFlags::SIGNALED;
        // SAFETY: the send area is leaked and not written while in flight.
        unsafe { x.qp.post_send(&wrs) }.unwrap();
        y.take(WINDOW);
        let mut wcs = [WorkCompletion::EMPTY; 4];
        while x.cq.poll(&mut wcs).unwrap() == 0 {}
    }
    (a, b)
}

/// A client and a server `Rpc` with an echo handler and an open session.
fn rpc_pair() -> (Rpc<Sim>, Rpc<Sim>, SessionId) {
    rpc_pair_with(4096, None)
}

/// [`rpc_pair`] with messages up to `max_msg_size` and the bulk path as given.
fn rpc_pair_with(max_msg_size: usize, bulk: Option<BulkConfig>) -> (Rpc<Sim>, Rpc<Sim>, SessionId) {
    let sim = Sim::with_devices(2);
    let cfg = EngineConfig {
        core: Config {
            max_sessions: 2,
            max_msg_size,
            ..Config::default()
        },
        bulk,
        ..EngineConfig::default()
    };
    let make = |dev| {
        let ctx = Context::open(&sim, dev).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        Rpc::new(&ctx, pd, cfg.clone()).unwrap()
    };
    let (mut client, mut server) = (make("sim0"), make("sim1"));
    server
        .register_handler(1, |req, out| {
            out[..req.len()].copy_from_slice(req);
            req.len()
        })
        .unwrap();
    let session = client.create_session(&server.addr()).unwrap();
    let mut up = false;
    while !up {
        server.run_event_loop_once(&mut |_| {}).unwrap();
        client
            .run_event_loop_once(&mut |n| up |= matches!(n, Notice::Session(Event::Connected(_))))
            .unwrap();
    }
    // Warm up: a full window, as for the raw pair.
    let mut done = 0;
    for k in 0..WINDOW as u64 {
        client.enqueue_request(session, 1, &[0; MSG], k).unwrap();
    }
    drive(&mut client, &mut server, &mut done, WINDOW);
    (client, server, session)
}

/// Runs passes until `*done` reaches `target`.
fn drive(client: &mut Rpc<Sim>, server: &mut Rpc<Sim>, done: &mut usize, target: usize) {
    while *done < target {
        client
            .run_event_loop_once(&mut |n| {
                *done += usize::from(matches!(n, Notice::Response { .. }))
            })
            .unwrap();
        server.run_event_loop_once(&mut |_| {}).unwrap();
    }
}

fn rtt(c: &mut Criterion) {
    let mut g = c.benchmark_group("rtt_32B");
    let (a, b) = raw_pair();
    g.bench_function("raw_ud", |bench| {
        bench.iter_custom(|iters| {
            timed_no_alloc("raw_ud", iters, |iters| {
                for i in 0..iters {
                    // SAFETY: the send area is leaked and not written while in flight.
                    unsafe { a.qp.post_send(&[a.datagram(&b, i, SendFlags::SIGNALED)]) }.unwrap();
                    b.take(1);
                    // SAFETY: as above.
                    unsafe { b.qp.post_send(&[b.datagram(&a, i, SendFlags::SIGNALED)]) }.unwrap();
                    a.take(1);
                }
            })
        })
    });
    let (mut client, mut server, session) = rpc_pair();
    let req = [0x5Au8; MSG];
    let mut done = 0;
    g.bench_function("rpc", |bench| {
        bench.iter_custom(|iters| {
            timed_no_alloc("rpc", iters, |iters| {
                for i in 0..iters {
                    client.enqueue_request(session, 1, &req, i).unwrap();
                    let target = done + 1;
                    drive(&mut client, &mut server, &mut done, target);
                }
            })
        })
    });
    g.finish();
}

fn rate(c: &mut Criterion) {
    let mut g = c.benchmark_group("rate_32B");
    g.throughput(Throughput::Elements(WINDOW as u64));
    let (a, b) = raw_pair();
    g.bench_function("raw_ud", |bench| {
        bench.iter_custom(|iters| {
            timed_no_alloc("raw_ud", iters, |iters| {
                let mut wrs = [a.datagram(&b, 0, SendFlags::empty()); WINDOW];
                wrs[WINDOW - 1].flags = SendFlags::SIGNALED;
                for _ in 0..iters {
                    // SAFETY: the send area is leaked and not written while in flight.
                    unsafe { a.qp.post_send(&wrs) }.unwrap();
                    b.take(WINDOW);
                    let mut wcs = [WorkCompletion::EMPTY; 4];
                    while a.cq.poll(&mut wcs).unwrap() == 0 {}
                }
            })
        })
    });
    let (mut client, mut server, session) = rpc_pair();
    let req = [0x5Au8; MSG];
    let mut done = 0;
    g.bench_function("rpc", |bench| {
        bench.iter_custom(|iters| {
            timed_no_alloc("rpc", iters, |iters| {
                for i in 0..iters {
                    for k in 0..WINDOW as u64 {
                        client.enqueue_request(session, 1, &req, i * 8 + k).unwrap();
                    }
                    let target = done + WINDOW;
                    drive(&mut client, &mut server, &mut done, target);
                }
            })
        })
    });
    g.finish();
}

fn large(c: &mut Criterion) {
    const MIB: usize = 1 << 20;
    let mut g = c.benchmark_group("echo_1MiB");
    g.throughput(Throughput::Bytes(2 * MIB as u64));
    let (mut client, mut server, session) = rpc_pair_with(MIB, None);
    let req = vec![0x5Au8; MIB];
    let mut done = 0;
    // Warm: the first large message grows the simulator's queues to their working size.
    client.enqueue_request(session, 1, &req, 0).unwrap();
    drive(&mut client, &mut server, &mut done, 1);
    g.bench_function("ud_packets", |bench| {
        bench.iter_custom(|iters| {
            timed_no_alloc("ud_packets", iters, |iters| {
                for i in 0..iters {
                    client.enqueue_request(session, 1, &req, i).unwrap();
                    let target = done + 1;
                    drive(&mut client, &mut server, &mut done, target);
                }
            })
        })
    });
    let bulk = BulkConfig {
        max_msg_size: MIB,
        pool_bytes: 8 * MIB,
    };
    let (mut client, mut server, session) = rpc_pair_with(4096, Some(bulk));
    let mut msg = Some(client.alloc_msg(MIB).unwrap());
    g.bench_function("bulk_rc", |bench| {
        bench.iter_custom(|iters| {
            timed_no_alloc("bulk_rc", iters, |iters| {
                for i in 0..iters {
                    let m = msg.take().unwrap();
                    if client.enqueue_bulk(session, 1, m, i).is_err() {
                        panic!("enqueue_bulk");
                    }
                    while msg.is_none() {
                        client
                            .run_event_loop_once(&mut |n| match n {
                                Notice::Response { bytes, msg: m, .. } => {
                                    assert_eq!(bytes.len(), MIB);
                                    msg = m.and_then(MsgBuf::into_host);
                                }
                                Notice::Failed { error, .. } => panic!("bulk echo: {error}"),
                                Notice::Session(_) => {}
                            })
                            .unwrap();
                        server.run_event_loop_once(&mut |_| {}).unwrap();
                    }
                }
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config().measurement_time(Duration::from_secs(3));
    targets = rtt, rate, large
}

criterion::criterion_main!(benches);
