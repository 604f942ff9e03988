//! One operation value ([`Op`]) at every level: the same value posted blocking, in a
//! scope and to a peer of a multi-peer scope behaves the same, and is checked the same
//! way before it is posted.
#![cfg(feature = "sim")]

mod common;
mod world;

use std::time::Duration;

use zverbs::provider::sim::Sim;
use zverbs::{AccessFlags, Error, MemoryRegion, Op, ProtectionDomain, WcOpcode, WcStatus};

fn register<'a>(pd: &ProtectionDomain<Sim>, buf: &'a mut [u8]) -> MemoryRegion<'a, Sim> {
    // SAFETY: each test reads the buffers through the region only after the operations
    // that target them have completed.
    unsafe { pd.register_with_access(buf, AccessFlags::all()) }.unwrap()
}

#[test]
fn every_operation_lands_the_same_blocking_and_scoped() {
    let (mut a, mut b) = common::default_pair();
    let mut target = [0u8; 32];
    let target = register(&b.pd, &mut target);
    let remote = target.remote();
    let mut src = *b"0123456789abcdef";
    let src = a.pd.register(&mut src).unwrap();
    let mut result = [0u8; 16];
    let mut result = register(&a.pd, &mut result);

    a.ch.execute(Op::write([src.slice(..8).unwrap()], &remote))
        .unwrap();
    a.ch.scope(|s| {
        s.post(Op::write([src.slice(8..).unwrap()], &remote.slice(8..16)?))?;
        s.post(Op::fetch_add(
            result.slice_mut(..8)?,
            &remote.slice(16..24)?,
            5,
        ))?;
        Ok(())
    })
    .unwrap();
    let (first, second) = result.slice_mut(..).unwrap().split_at(8).unwrap();
    a.ch.execute(Op::fetch_add(second, &remote.slice(16..24).unwrap(), 2))
        .unwrap();
    a.ch.execute(Op::compare_swap(
        first,
        &remote.slice(16..24).unwrap(),
        7,
        1,
    ))
    .unwrap();
    let mut inbox = [0u8; 16];
    let mut inbox = b.pd.register(&mut inbox).unwrap();
    std::thread::scope(|t| {
        let got = t.spawn(|| b.ch.receive([inbox.slice_mut(..).unwrap()]).unwrap());
        a.ch.scope(|s| s.post(Op::send_inline(b"inline")).map(drop))
            .unwrap();
        assert_eq!(got.join().unwrap().byte_len, 6);
    });
    assert_eq!(&inbox.as_slice()[..6], b"inline");
    assert_eq!(&target.as_slice()[..16], b"0123456789abcdef");
    assert_eq!(
        u64::from_ne_bytes(target.as_slice()[16..24].try_into().unwrap()),
        1,
        "0 + 5 + 2, then swapped for 1"
    );
    // The previous values: 0 before the scope's add, 5 before the blocking one, 7 before
    // the swap.
    let got = |i: usize| u64::from_ne_bytes(result.as_slice()[i..i + 8].try_into().unwrap());
    assert_eq!((got(0), got(8)), (7, 5));
}

#[test]
fn an_atomic_needs_an_eight_byte_result_at_every_level() {
    let (mut a, b) = common::default_pair();
    let mut target = [0u8; 8];
    let target = register(&b.pd, &mut target);
    let remote = target.remote();
    let mut result = [0u8; 16];
    let mut result = register(&a.pd, &mut result);
    let bad = |e: Error<_>| matches!(e, Error::InvalidAttribute(_));

    let e =
        a.ch.execute(Op::fetch_add(result.slice_mut(..4).unwrap(), &remote, 1))
            .unwrap_err();
    assert!(bad(e), "{e}");
    let e =
        a.ch.scope(|s| s.post(Op::fetch_add(result.slice_mut(..16)?, &remote, 1)))
            .unwrap_err();
    assert!(bad(e), "{e}");
    let e =
        a.ch.scope(|s| s.post_compare_swap(result.slice_mut(..0)?, &remote, 0, 1))
            .unwrap_err();
    assert!(bad(e), "{e}");
    // Nothing was posted: the target is untouched and the channel still works.
    assert_eq!(
        a.ch.fetch_add(result.slice_mut(..8).unwrap(), &remote, 3),
        Ok(0)
    );
    assert_eq!(target.as_slice(), 3u64.to_ne_bytes());
}

#[test]
fn a_multi_peer_scope_posts_any_operation_to_any_peer() {
    let cfg = world::config(
        zverbs::node::barrier::Algorithm::Dissemination,
        Duration::from_secs(10),
    );
    let mut nodes = world::world::<4>(3, &cfg);
    let mut counters = [[0u8; 8], [0u8; 8]];
    let [c1, c2] = &mut counters;
    let regions = [register(&nodes[1].0, c1), register(&nodes[2].0, c2)];
    let remotes = [regions[0].remote(), regions[1].remote()];
    let mut results = [0u8; 16];
    let (pd, node) = &mut nodes[0];
    let mut results = register(pd, &mut results);
    let (x, y) = results.slice_mut(..).unwrap().split_at(8).unwrap();
    node.channels()
        .scope(|s| {
            s.post(1, Op::fetch_add(x, &remotes[0], 11))?;
            s.post(2, Op::compare_swap(y, &remotes[1], 0, 22))?;
            Ok(())
        })
        .unwrap();
    drop(regions);
    assert_eq!(counters, [11u64.to_ne_bytes(), 22u64.to_ne_bytes()]);
    assert_eq!(results.as_slice(), [0u8; 16]);
}

#[test]
fn a_scope_hands_back_its_sends_completions() {
    let (mut a, b) = common::default_pair();
    let mut target = [0u8; 16];
    let target = register(&b.pd, &mut target);
    let remote = target.remote();
    let mut src = *b"abcdefgh";
    let src = a.pd.register(&mut src).unwrap();
    let forged = zverbs::RemoteRegion {
        rkey: remote.rkey ^ 0x100,
        ..remote
    };
    let (first, last, refused) =
        a.ch.scope(|s| {
            let one = s.post(Op::write([src.slice(..4)?], &remote))?;
            let two = s.post(Op::write([src.slice(4..)?], &remote.slice(4..)?))?;
            // The first was not its batch's signaled last: the second's completion says it
            // is done.
            let first = s.wait_send(one)?;
            let last = s.wait_send(two)?;
            // Taken once: asking again is refused, as is an id from before the scope.
            let again = s.wait_send(two).unwrap_err();
            assert!(matches!(again, Error::InvalidAttribute(_)), "{again}");
            let bad = s.post(Op::write([src.slice(..4)?], &forged))?;
            let refused = s.wait_send(bad).unwrap_err();
            Ok((first, last, refused))
        })
        .map_err(|e| e.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (first.status, last.status),
        (WcStatus::Success, WcStatus::Success)
    );
    assert_eq!(
        (first.opcode, last.opcode),
        (WcOpcode::RdmaWrite, WcOpcode::RdmaWrite)
    );
    let c = refused.completion().expect("the device's verdict");
    assert_eq!(c.status, WcStatus::RemAccessErr);
    assert_eq!(&target.as_slice()[..8], b"abcdefgh");
}

/// The async level posts the same operations, over owned buffers it gives back: checked
/// as the other levels check them (an atomic's 8-byte result, the remote region's room)
/// before anything is posted.
#[cfg(feature = "tokio")]
#[test]
fn the_async_level_posts_the_same_operations_over_owned_buffers() {
    use zverbs::tokio::AsyncChannel;
    use zverbs::{ChannelConfig, MrPool, Owned};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let p = zverbs::testing::Pair::<64, 4>::connected_for_async(&ChannelConfig::default()).unwrap();
    let (pa, pb, ch) = (p.a.pd, p.b.pd, p.a.ch);
    let mut target = [0u8; 16];
    let target = register(&pb, &mut target);
    let remote = target.remote();
    let pool = MrPool::new(&pa, 1 << 12).unwrap();
    rt.block_on(async {
        let a = AsyncChannel::new(ch).unwrap();
        let mut msg = pool.alloc(8).unwrap();
        msg.copy_from_slice(b"abcdefgh");
        let (r, msg) = a.post(Op::write(Owned(msg), &remote)).await;
        assert_eq!(
            r.map(|c| (c.opcode, c.byte_len)),
            Ok((WcOpcode::RdmaWrite, 8))
        );
        // Too long for the remote region: refused, the buffer back whole.
        let (r, msg) = a
            .post(Op::write(Owned(msg), &remote.slice(..4).unwrap()))
            .await;
        assert!(matches!(r, Err(Error::OutOfBounds(_))), "{r:?}");
        assert_eq!(&msg[..], b"abcdefgh");
        // An atomic over anything but 8 bytes: refused.
        let wide = pool.alloc(16).unwrap();
        let (r, wide) = a
            .post(Op::fetch_add(Owned(wide), &remote.slice(8..).unwrap(), 1))
            .await;
        assert!(matches!(r, Err(Error::InvalidAttribute(_))), "{r:?}");
        assert_eq!(wide.len(), 16);
        let old = pool.alloc(8).unwrap();
        let (r, old) = a
            .post(Op::fetch_add(Owned(old), &remote.slice(8..).unwrap(), 5))
            .await;
        assert_eq!(r.map(|c| c.opcode), Ok(WcOpcode::FetchAdd));
        assert_eq!(&old[..], 0u64.to_ne_bytes());
        let back = pool.alloc(16).unwrap();
        let (r, back) = a.post(Op::read(Owned(back), &remote)).await;
        assert_eq!(r.map(|c| c.opcode), Ok(WcOpcode::RdmaRead));
        assert_eq!(&back[..8], b"abcdefgh");
        assert_eq!(&back[8..], 5u64.to_ne_bytes());
    });
}
