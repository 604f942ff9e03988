//! `MultiChannel` and the collectives over it, on the simulator: scatter/gather at the
//! three levels, typed errors for bad peers, a model-checked scatter_write → barrier →
//! gather_read, and no allocation on the data path.
#![cfg(feature = "sim")]

mod world;

mod common;

use std::time::Duration;

use proptest::prelude::*;
use world::{config, world, ALGORITHMS};
use zverbs::provider::sim::Sim;
use zverbs::{AccessFlags, Error, MemoryRegion, ProtectionDomain, RemoteRegion};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn register<'a>(pd: &ProtectionDomain<Sim>, buf: &'a mut [u8]) -> MemoryRegion<'a, Sim> {
    // SAFETY: the buffers are only read through the region after the barriers that end
    // every remote access in these tests.
    unsafe { pd.register_with_access(buf, RW) }.unwrap()
}

fn byte(writer: usize, owner: usize, i: usize, salt: u8) -> u8 {
    (writer as u8).wrapping_mul(37) ^ (owner as u8).wrapping_mul(11) ^ (i as u8) ^ salt
}

/// Every rank writes a chunk into every peer's region (at offset writer × chunk), all
/// ranks barrier, then every rank reads back from each peer the chunk a third rank wrote
/// there. Checks both the local regions and what was read against the model.
fn scatter_barrier_gather(
    n: usize,
    chunk: usize,
    alg: usize,
    salt: u8,
) -> Result<(), TestCaseError> {
    let nodes = world::<8>(n, &config(ALGORITHMS[alg], Duration::from_secs(20)));
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0xEE; n * chunk]).collect();
    let mut reads: Vec<Vec<u8>> = (0..n).map(|_| vec![0; n * chunk]).collect();
    let mut regions: Vec<(MemoryRegion<Sim>, MemoryRegion<Sim>)> = nodes
        .iter()
        .zip(bufs.iter_mut().zip(reads.iter_mut()))
        .map(|((pd, _), (b, r))| (register(pd, b), register(pd, r)))
        .collect();
    let remotes: Vec<RemoteRegion> = regions.iter().map(|(m, _)| m.remote()).collect();
    let mut outs: Vec<Vec<u8>> = (0..n)
        .map(|w| {
            (0..n * chunk)
                .map(|k| byte(w, k / chunk, k % chunk, salt))
                .collect()
        })
        .collect();
    let out_regions: Vec<MemoryRegion<Sim>> = nodes
        .iter()
        .zip(outs.iter_mut())
        .map(|((pd, _), o)| pd.register(o).unwrap())
        .collect();
    std::thread::scope(|t| {
        for (((_pd, mut node), (_, read)), out) in nodes
            .into_iter()
            .zip(regions.iter_mut())
            .zip(out_regions.iter())
        {
            let remotes = &remotes;
            t.spawn(move || {
                let me = node.rank();
                let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
                let targets: Vec<RemoteRegion> = peers
                    .iter()
                    .map(|&p| {
                        remotes[p]
                            .slice(((me * chunk) as u64)..((me + 1) * chunk) as u64)
                            .unwrap()
                    })
                    .collect();
                let writes = peers
                    .iter()
                    .zip(&targets)
                    .map(|(&p, r)| (p, out.slice(p * chunk..(p + 1) * chunk).unwrap(), r));
                node.channels().scatter_write(writes).unwrap();
                node.barrier_all().unwrap();
                // Read from each peer p the chunk rank (p + 1) % n wrote there (skip p's own).
                let sources: Vec<RemoteRegion> = peers
                    .iter()
                    .map(|&p| {
                        let w = (p + 1) % n;
                        remotes[p]
                            .slice(((w * chunk) as u64)..((w + 1) * chunk) as u64)
                            .unwrap()
                    })
                    .collect();
                let mut rest = read.slice_mut(..).unwrap();
                let mut locals = Vec::new();
                for k in 0..n {
                    let (head, tail) = rest.split_at(chunk).unwrap();
                    if k != me {
                        locals.push((k, head));
                    }
                    rest = tail;
                }
                let gathers = locals
                    .into_iter()
                    .zip(&sources)
                    .map(|((p, s), r)| (p, s, r));
                node.channels().gather_read(gathers).unwrap();
                node.barrier_all().unwrap();
            });
        }
    });
    drop(out_regions);
    drop(regions);
    for (owner, buf) in bufs.iter().enumerate() {
        for w in 0..n {
            for i in 0..chunk {
                let want = if w == owner {
                    0xEE
                } else {
                    byte(w, owner, i, salt)
                };
                prop_assert_eq!(
                    buf[w * chunk + i],
                    want,
                    "owner {} writer {} byte {}",
                    owner,
                    w,
                    i
                );
            }
        }
    }
    for (me, read) in reads.iter().enumerate() {
        for p in (0..n).filter(|&p| p != me) {
            let w = (p + 1) % n;
            for i in 0..chunk {
                let want = if w == p { 0xEE } else { byte(w, p, i, salt) };
                prop_assert_eq!(
                    read[p * chunk + i],
                    want,
                    "reader {} from {} byte {}",
                    me,
                    p,
                    i
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn scatter_write_barrier_gather_read_matches_the_model(
        n in 2usize..=6, chunk in 1usize..=300, alg in 0usize..3, salt: u8,
    ) {
        scatter_barrier_gather(n, chunk, alg, salt)?;
    }
}

/// Three nodes; rank 0 is the hub of the collectives below.
fn trio() -> Vec<(ProtectionDomain<Sim>, zverbs::node::Node<Sim, 4, 16, 2>)> {
    world::<4>(3, &config(ALGORITHMS[1], Duration::from_secs(10)))
}

#[test]
fn bad_peer_indices_are_typed_errors_and_nothing_is_posted() {
    let mut nodes = trio();
    let (pd, node) = &mut nodes[0];
    let mut buf = [0u8; 8];
    let mut mr = pd.register(&mut buf).unwrap();
    let mc = node.channels();
    assert!(
        matches!(
            mc.peer(0),
            Err(Error::NoSuchPeer {
                peer: 0,
                capacity: 4
            })
        ),
        "self"
    );
    assert!(
        matches!(
            mc.peer(3),
            Err(Error::NoSuchPeer {
                peer: 3,
                capacity: 4
            })
        ),
        "not set up"
    );
    assert!(matches!(
        mc.peer(99),
        Err(Error::NoSuchPeer {
            peer: 99,
            capacity: 4
        })
    ));
    let e = mc
        .gather_receive([(7, mr.slice_mut(..).unwrap())])
        .unwrap_err();
    assert_eq!(e.kind(), zverbs::ErrorKind::InvalidArgument);
    let (a, b) = mr.slice_mut(..).unwrap().split_at(4).unwrap();
    assert!(matches!(
        mc.gather_receive([(1, a), (1, b)]),
        Err(zverbs::PeerError {
            peer: 1,
            error: Error::InvalidAttribute(_),
            ..
        })
    ));
    assert!(matches!(
        mc.multicast_send([5, 1], mr.slice(..).unwrap()),
        Err(zverbs::PeerError {
            peer: 5,
            qp_num: None,
            error: Error::NoSuchPeer { peer: 5, .. }
        })
    ));
    // Posting stops at the first bad index: nothing went to peer 1.
    assert_eq!(mc.peer(1).unwrap().in_flight(), (0, 0));
    assert_eq!(mc.peers().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(mc.len(), 2);
}

#[test]
fn multicast_scatter_and_gather_receive_deliver_to_the_right_peers() {
    let mut nodes = trio();
    let mut hub_out = *b"0123456789abcdefALL!";
    let mut hub_in = [0u8; 16];
    let mut leaf_in: Vec<[u8; 12]> = vec![[0; 12]; 2];
    let mut leaf_out: Vec<[u8; 8]> = vec![*b"from-one", *b"from-two"];
    let (hub, leaves) = nodes.split_at_mut(1);
    let hub_pd = &hub[0].0;
    let out = hub_pd.register(&mut hub_out).unwrap();
    let mut inbox = hub_pd.register(&mut hub_in).unwrap();
    std::thread::scope(|t| {
        for ((pd, node), (li, lo)) in leaves
            .iter_mut()
            .zip(leaf_in.iter_mut().zip(leaf_out.iter_mut()))
        {
            t.spawn(move || {
                let mut li = pd.register(li).unwrap();
                let lo = pd.register(lo).unwrap();
                let ch = node.channels().peer(0).unwrap();
                let got = ch.receive([li.slice_mut(..8).unwrap()]).unwrap();
                assert_eq!(got.byte_len, 8);
                let got = ch.receive([li.slice_mut(8..).unwrap()]).unwrap();
                assert_eq!(got.byte_len, 4);
                ch.send([lo.slice(..).unwrap()]).unwrap();
            });
        }
        let mc = hub[0].1.channels();
        let (first, rest) = out.slice(..16).unwrap().split_at(8).unwrap();
        mc.scatter_send([(1, first), (2, rest)]).unwrap();
        mc.multicast_send([1, 2], out.slice(16..).unwrap()).unwrap();
        let (a, b) = inbox.slice_mut(..).unwrap().split_at(8).unwrap();
        let got = mc.gather_receive([(2, b), (1, a)]).unwrap();
        assert_eq!(got[1].unwrap().byte_len, 8);
        assert_eq!(got[2].unwrap().byte_len, 8);
        assert!(got[0].is_none() && got[3].is_none());
    });
    drop(inbox);
    assert_eq!(&hub_in, b"from-onefrom-two");
    assert_eq!(&leaf_in[0], b"01234567ALL!");
    assert_eq!(&leaf_in[1], b"89abcdefALL!");
}

#[test]
fn scope_posts_to_many_peers_and_waits_for_all_even_past_ring_capacity() {
    let mut nodes = trio();
    let mut remote_bufs: Vec<Vec<u8>> = vec![vec![0; 64]; 2];
    let regions: Vec<MemoryRegion<Sim>> = nodes[1..]
        .iter()
        .zip(remote_bufs.iter_mut())
        .map(|((pd, _), b)| register(pd, b))
        .collect();
    let remotes: Vec<RemoteRegion> = regions.iter().map(|m| m.remote()).collect();
    let mut src: Vec<u8> = (0..64u8).collect();
    let mut back = vec![0u8; 128];
    let (pd, node) = &mut nodes[0];
    let src_mr = pd.register(&mut src).unwrap();
    let mut back_mr = pd.register(&mut back).unwrap();
    let mc = node.channels();
    // 64 one-byte writes per peer: four times the ring capacity of 16.
    mc.scope(|s| {
        for i in 0..64 {
            for (k, remote) in remotes.iter().enumerate() {
                let dst = remote.slice(i as u64..i as u64 + 1)?;
                s.post_write(k + 1, [src_mr.slice(i..i + 1)?], &dst)?;
            }
        }
        Ok(())
    })
    .unwrap();
    let (x, y) = back_mr.slice_mut(..).unwrap().split_at(64).unwrap();
    mc.scope(|s| {
        s.post_read(1, [x], &remotes[0])?;
        s.post_read(2, [y], &remotes[1])?;
        Ok(())
    })
    .unwrap();
    // A scope error: a read beyond the remote region is refused before posting.
    let mut tiny = [0u8; 65];
    let mut tiny = pd.register(&mut tiny).unwrap();
    let e = mc
        .scope(|s| s.post_read(1, [tiny.slice_mut(..).unwrap()], &remotes[0]))
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds(_)), "{e}");
    drop(back_mr);
    drop(regions);
    for b in &remote_bufs {
        assert_eq!(b[..], src[..]);
    }
    assert_eq!(back[..64], src[..]);
    assert_eq!(back[64..], src[..]);
}

#[test]
fn collectives_and_barriers_do_not_allocate_after_setup() {
    let nodes = trio();
    let mut bufs: Vec<Vec<u8>> = vec![vec![0; 256]; 3];
    let regions: Vec<MemoryRegion<Sim>> = nodes
        .iter()
        .zip(bufs.iter_mut())
        .map(|((pd, _), b)| register(pd, b))
        .collect();
    let remotes: Vec<RemoteRegion> = regions.iter().map(|m| m.remote()).collect();
    let ready = std::sync::Barrier::new(3);
    let done = std::sync::Barrier::new(3);
    std::thread::scope(|t| {
        for (((_pd, mut node), mr), remote_of_next) in nodes
            .into_iter()
            .zip(regions.iter())
            .zip(remotes.iter().cycle().skip(1))
        {
            let (ready, done) = (&ready, &done);
            let next = (node.rank() + 1) % 3;
            let dst = remote_of_next.slice(..128).unwrap();
            t.spawn(move || {
                let src = mr.slice(128..).unwrap();
                // Warm up: first barrier and write.
                node.barrier_all().unwrap();
                ready.wait();
                let ((), allocs) = zverbs_testkit::measure(|| {
                    for _ in 0..50 {
                        node.channels().scatter_write([(next, src, &dst)]).unwrap();
                        node.barrier_all().unwrap();
                    }
                });
                assert_eq!(allocs.count, 0, "allocations on the data path");
                done.wait();
            });
        }
    });
}
