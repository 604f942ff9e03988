//! The RPC engine's bulk path (`EngineConfig::bulk`) on the simulator: large messages read
//! with RDMA reads over a reliable connection per session, responses inline or read back,
//! buffers handed back, every failure typed (no link, no memory, a bad key, a lying peer,
//! a vanished server), loss hidden by RC retransmission, and no allocation per call.
#![cfg(feature = "sim")]

use std::time::{Duration, Instant};

use zverbs::pool::LocalBuf;
use zverbs::provider::sim::{FabricConfig, Faults, Sim};
use zverbs::provider::Provider;
use zverbs::rpc::{
    BulkConfig, BulkFailure, Config, EngineConfig, EngineError, Event, MsgBuf, Notice, Rpc,
    RpcError,
};
use zverbs::testing::RpcPair;
use zverbs::types::WcStatus;
use zverbs::Context;

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const ECHO: u8 = 1;
/// Answers with the request's first 8 bytes: a large request, a small response.
const HEAD: u8 = 2;
const MS: u64 = 1_000_000;
const MIB: usize = 1 << 20;

fn cfg(bulk: Option<BulkConfig>) -> EngineConfig {
    EngineConfig {
        core: Config {
            max_sessions: 2,
            window: 4,
            session_timeout_ns: 200 * MS,
            ..Config::default()
        },
        bulk,
        ..EngineConfig::default()
    }
}

fn bulk(max_msg_size: usize, pool_bytes: usize) -> Option<BulkConfig> {
    Some(BulkConfig {
        max_msg_size,
        pool_bytes,
    })
}

fn rpc(sim: &Sim, dev: &str, cfg: EngineConfig) -> Rpc<Sim> {
    let ctx = Context::open(sim, dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    Rpc::new(&ctx, pd, cfg).unwrap()
}

/// A server with the echo and head handlers and a client with a session to it.
fn pair(sim: &Sim, client: EngineConfig, server: EngineConfig) -> RpcPair {
    RpcPair::connected(sim, client, server, |s| {
        s.register_handler(ECHO, |req, out| {
            out[..req.len()].copy_from_slice(req);
            req.len()
        })?;
        s.register_handler(HEAD, |req, out| {
            out[..8].copy_from_slice(&req[..8]);
            8
        })
    })
    .unwrap()
}

/// A large request of `len` bytes (byte `i` is `i * 7 + tag`) of `req_type`.
fn call(p: &mut RpcPair, req_type: u8, len: usize, tag: u64) {
    let mut msg = p.client.alloc_msg(len).unwrap();
    fill(&mut msg, tag);
    if let Err((e, _)) = p.client.enqueue_bulk(p.session, req_type, msg, tag) {
        panic!("enqueue_bulk: {e}");
    }
}

/// Runs until `n` outcomes in all.
fn wait_for(p: &mut RpcPair, n: usize) {
    assert!(p.wait_for(n, Duration::from_secs(20)), "outcomes missing");
}

fn fill(msg: &mut LocalBuf<Sim>, tag: u64) {
    for (i, b) in msg.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u64 * 7 + tag) as u8;
    }
}

fn pattern(len: usize, tag: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 7 + tag) as u8).collect()
}

fn in_use(rpc: &Rpc<Sim>) -> usize {
    rpc.msg_pool().unwrap().stats().allocations
}

#[test]
fn one_mib_echo_goes_by_two_reads_and_gives_the_buffer_back() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(2 * MIB, 8 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    assert!(p.client.has_bulk_link(p.session));
    let packets = p.client.core().stats().tx_packets;
    call(&mut p, ECHO, MIB, 3);
    wait_for(&mut p, 1);
    let o = p.done.pop().unwrap();
    assert_eq!(o.tag, 3);
    assert_eq!(o.result.unwrap(), pattern(MIB, 3));
    let msg = o.msg.and_then(MsgBuf::into_host);
    let msg = msg.expect("the request's buffer comes back");
    assert_eq!(
        msg.as_slice(),
        &pattern(MIB, 3)[..],
        "the buffer is unchanged"
    );
    // Two datagrams for a mebibyte: the descriptor and the answer's (no multi-packet).
    assert_eq!(p.client.core().stats().tx_packets - packets, 1);
    // The client holds only the returned buffer; the server held the response until the
    // client's release message, a few passes later.
    assert_eq!(in_use(&p.client), 1);
    let end = Instant::now() + Duration::from_secs(5);
    while in_use(&p.server) != 0 && Instant::now() < end {
        p.run_until(Duration::from_millis(1), |_| false);
    }
    assert_eq!(in_use(&p.server), 0, "the held response was freed");
    assert_eq!(p.server.stats().no_handler, 0);
}

#[test]
fn a_small_response_to_a_large_request_comes_inline() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(MIB, 4 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    call(&mut p, HEAD, 100_000, 9);
    wait_for(&mut p, 1);
    let o = p.done.pop().unwrap();
    assert_eq!(o.result.unwrap(), pattern(8, 9));
    assert_eq!(in_use(&p.server), 0, "nothing held for an inline response");
    drop(o.msg);
    assert_eq!(in_use(&p.client), 0);
}

#[test]
fn many_large_requests_in_flight_all_answered_in_full() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(256 << 10, 16 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    let sizes = [1usize, 4096, 70_000, 256 << 10];
    let mut sent = 0;
    for round in 0..8u64 {
        for (k, &len) in sizes.iter().enumerate() {
            call(&mut p, ECHO, len, round * 4 + k as u64);
            sent += 1;
        }
        wait_for(&mut p, sent);
    }
    for o in &p.done {
        let len = sizes[(o.tag % 4) as usize];
        assert_eq!(
            o.result.as_ref().unwrap(),
            &pattern(len, o.tag),
            "tag {}",
            o.tag
        );
    }
}

#[test]
fn a_server_without_a_bulk_path_means_no_link_and_the_buffer_back() {
    let sim = Sim::with_devices(2);
    let mut p = pair(&sim, cfg(bulk(MIB, 2 * MIB)), cfg(None));
    assert!(!p.client.has_bulk_link(p.session));
    let msg = p.client.alloc_msg(4096).unwrap();
    let s = p.session;
    let (e, msg) = p.client.enqueue_bulk(s, ECHO, msg, 1).unwrap_err();
    assert!(
        matches!(e, EngineError::Rpc(RpcError::Bulk(BulkFailure::NoLink))),
        "{e}"
    );
    assert_eq!(msg.len(), 4096);
    // Small requests still work on the session.
    p.client.enqueue_request(s, ECHO, b"small", 2).unwrap();
    wait_for(&mut p, 1);
    assert_eq!(p.done[0].result.as_ref().unwrap(), b"small");
}

#[test]
fn bad_arguments_are_typed_errors_with_the_buffer_back() {
    let sim = Sim::with_devices(3);
    let c = cfg(bulk(64 << 10, MIB));
    let mut p = pair(&sim, c.clone(), c.clone());
    let s = p.session;
    // Larger than the limit (the pool has room for it).
    let big = p.client.alloc_msg(128 << 10).unwrap();
    let (e, big) = p.client.enqueue_bulk(s, ECHO, big, 1).unwrap_err();
    assert!(matches!(e, EngineError::InvalidConfig(_)), "{e}");
    drop(big);
    // A buffer from another engine's pool.
    let other = rpc(&sim, "sim2", c);
    let foreign = other.alloc_msg(64).unwrap();
    let (e, _) = p.client.enqueue_bulk(s, ECHO, foreign, 1).unwrap_err();
    assert!(matches!(e, EngineError::InvalidConfig(_)), "{e}");
    // The bulk path's own request types.
    for t in [0xfe, 0xff] {
        let e = p.server.register_handler(t, |_, _| 0).unwrap_err();
        assert!(matches!(e, EngineError::InvalidConfig(_)), "{e}");
    }
    // No bulk path at all.
    let plain = rpc(&sim, "sim2", cfg(None));
    assert!(matches!(
        plain.alloc_msg(64),
        Err(EngineError::InvalidConfig(_))
    ));
    assert!(plain.msg_pool().is_none());
    // Zero bytes, and more than the pool.
    assert!(matches!(p.client.alloc_msg(0), Err(EngineError::Pool(_))));
    assert!(matches!(
        p.client.alloc_msg(4 * MIB),
        Err(EngineError::Pool(_))
    ));
}

#[test]
fn a_server_out_of_pool_memory_answers_no_memory() {
    let sim = Sim::with_devices(2);
    // The server's pool holds the request but not a response buffer beside it.
    let (client, server) = (cfg(bulk(MIB, 4 * MIB)), cfg(bulk(MIB, MIB)));
    let mut p = pair(&sim, client, server);
    call(&mut p, ECHO, MIB, 5);
    wait_for(&mut p, 1);
    let o = p.done.pop().unwrap();
    assert_eq!(o.result.unwrap_err(), RpcError::Bulk(BulkFailure::NoMemory));
    assert!(o.msg.is_some());
    assert_eq!(in_use(&p.server), 0);
}

#[test]
fn a_lying_client_gets_typed_refusals_and_the_server_serves_on() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(MIB, 4 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    let s = p.session;
    let msg = p.client.alloc_msg(4096).unwrap();
    let desc = |rkey: u32, len: u32| {
        let mut d = vec![1u8, ECHO];
        d.extend_from_slice(&msg.addr().to_be_bytes());
        d.extend_from_slice(&rkey.to_be_bytes());
        d.extend_from_slice(&len.to_be_bytes());
        d
    };
    // Raw internal requests, as a hostile client would send them.
    let bad_key = desc(0xdead_beef, 4096);
    let too_long = desc(0, (2 * MIB) as u32);
    let zero = desc(0, 0);
    let reqs: [&[u8]; 5] = [&bad_key, &too_long, &zero, &bad_key[..7], &[9, 9]];
    for (tag, req) in reqs.iter().enumerate() {
        p.client.enqueue_request(s, 0xfe, req, tag as u64).unwrap();
        wait_for(&mut p, tag + 1);
    }
    let status = |tag: usize| p.done[tag].result.as_ref().unwrap().clone();
    let read_failed = status(0);
    assert_eq!(&read_failed[..2], &[1, 4], "a read with a bad key fails");
    let code = u32::from_be_bytes(read_failed[2..6].try_into().unwrap());
    assert_eq!(WcStatus::from_raw(code), WcStatus::RemAccessErr);
    for tag in 1..5 {
        assert_eq!(status(tag), [1, 5], "request {tag} is refused");
    }
    // A lying connect request on a session with a link: refused, the link stays.
    p.client.enqueue_request(s, 0xff, &[1, 2, 3], 7).unwrap();
    wait_for(&mut p, 6);
    assert_eq!(p.done[5].result.as_ref().unwrap(), &[1, 5]);
    drop(msg);
    // The failed read left both queue pairs in error and the server reset its side: the
    // next large request learns it (no link), and the client connects again.
    call(&mut p, ECHO, 300_000, 8);
    wait_for(&mut p, 7);
    let e = p.done[6].result.as_ref().unwrap_err();
    assert_eq!(e, &RpcError::Bulk(BulkFailure::NoLink));
    let s = p.session;
    let end = Instant::now() + Duration::from_secs(5);
    while !p.client.has_bulk_link(s) && Instant::now() < end {
        p.run_until(Duration::from_millis(1), |_| false);
    }
    assert!(p.client.has_bulk_link(s), "the link is set up again");
    call(&mut p, ECHO, 300_000, 9);
    wait_for(&mut p, 8);
    assert_eq!(p.done[7].result.as_ref().unwrap(), &pattern(300_000, 9));
}

#[test]
fn loss_on_the_fabric_is_hidden_by_the_reliable_connection() {
    for seed in [1u64, 2, 3] {
        let fc = FabricConfig {
            faults: Faults {
                drop: 0.05,
                duplicate: 0.05,
                ..Faults::none()
            },
            seed,
            ..FabricConfig::default()
        };
        let sim = Sim::with_config(fc, 2);
        let c = EngineConfig {
            core: Config {
                rto_ns: MS,
                session_timeout_ns: 5_000 * MS,
                ..cfg(None).core
            },
            ..cfg(bulk(MIB, 8 * MIB))
        };
        let mut p = pair(&sim, c.clone(), c);
        for tag in 0..4 {
            call(&mut p, ECHO, 200_000 + tag as usize, tag);
        }
        wait_for(&mut p, 4);
        for o in &p.done {
            let want = pattern(200_000 + o.tag as usize, o.tag);
            assert_eq!(
                o.result.as_ref().ok(),
                Some(&want),
                "seed {seed} tag {}",
                o.tag
            );
        }
    }
}

#[test]
fn a_server_that_vanishes_fails_the_request_and_gives_the_buffer_back() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(MIB, 4 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    call(&mut p, ECHO, MIB, 4);
    let RpcPair {
        mut client, server, ..
    } = p;
    drop(server);
    let start = Instant::now();
    let mut out = None;
    while out.is_none() && start.elapsed() < Duration::from_secs(2) {
        client
            .run_event_loop_once(&mut |n| {
                if let Notice::Failed { tag, error, msg } = n {
                    out = Some((tag, error, msg));
                }
            })
            .unwrap();
    }
    let (tag, error, msg) = out.expect("no failure within 10x the session timeout");
    assert_eq!((tag, error), (4, RpcError::TimedOut));
    assert_eq!(msg.map(|m| m.len()), Some(MIB));
}

#[test]
fn the_end_of_a_session_frees_what_the_server_held() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(MIB, 4 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    // A client that never reads its response (nor sends the release message): a raw
    // large request naming a real buffer, whose answer it takes as plain bytes.
    let mut msg = p.client.alloc_msg(MIB).unwrap();
    fill(&mut msg, 1);
    let (_, rkey) = Sim::mr_keys(p.client.msg_pool().unwrap().raw());
    let mut desc = vec![1u8, ECHO];
    desc.extend_from_slice(&msg.addr().to_be_bytes());
    desc.extend_from_slice(&rkey.to_be_bytes());
    desc.extend_from_slice(&(MIB as u32).to_be_bytes());
    let s = p.session;
    p.client.enqueue_request(s, 0xfe, &desc, 1).unwrap();
    wait_for(&mut p, 1);
    assert_eq!(
        p.done[0].result.as_ref().unwrap()[..2],
        [1, 1],
        "answered remote"
    );
    p.run_until(Duration::from_millis(20), |_| false);
    assert_eq!(in_use(&p.server), 1, "held while the client may read it");
    p.client.disconnect(s).unwrap();
    let mut closed = false;
    let end = Instant::now() + Duration::from_secs(5);
    while !closed && Instant::now() < end {
        p.client.run_event_loop_once(&mut |_| {}).unwrap();
        p.server
            .run_event_loop_once(&mut |n| {
                closed |= matches!(n, Notice::Session(Event::Disconnected(_)));
            })
            .unwrap();
    }
    assert!(closed);
    assert_eq!(in_use(&p.server), 0);
    // A new session gets a fresh link and works.
    let s = p.client.create_session(&p.server.addr()).unwrap();
    p.session = s;
    assert!(p.run_until(Duration::from_secs(5), |n| matches!(
        n,
        Notice::Session(Event::Connected(_))
    )));
    assert!(p.client.has_bulk_link(s));
    call(&mut p, ECHO, 5000, 2);
    wait_for(&mut p, 2);
    assert_eq!(p.done[1].result.as_ref().unwrap(), &pattern(5000, 2));
    drop(msg);
}

#[test]
fn no_allocation_per_large_call_after_set_up() {
    let sim = Sim::with_devices(2);
    let c = cfg(bulk(MIB, 8 * MIB));
    let mut p = pair(&sim, c.clone(), c);
    call(&mut p, ECHO, MIB, 0); // warm: first use of every path
    wait_for(&mut p, 1);
    let (answered, allocs) = zverbs_testkit::measure(|| {
        let mut answered = 0;
        for tag in 1..=16u64 {
            call(&mut p, ECHO, 100_000, tag);
            let mut ok = None;
            let end = Instant::now() + Duration::from_secs(10);
            while ok.is_none() && Instant::now() < end {
                p.server.run_event_loop_once(&mut |_| {}).unwrap();
                p.client
                    .run_event_loop_once(&mut |n| {
                        if let Notice::Response { tag: t, bytes, .. } = n {
                            let same = bytes
                                .iter()
                                .enumerate()
                                .all(|(i, &b)| b == (i as u64 * 7 + t) as u8);
                            ok = Some(t == tag && bytes.len() == 100_000 && same);
                        }
                    })
                    .unwrap();
            }
            answered += usize::from(ok == Some(true));
        }
        answered
    });
    assert_eq!(answered, 16);
    assert_eq!(allocs.count, 0);
}
