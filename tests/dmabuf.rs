//! Device memory registered from dmabufs, on the simulator: peers' RDMA writes, reads and
//! atomics into and out of it, sends and receives from and into it, every bad registration
//! refused with its typed error, and a device that registers no dmabufs.
#![cfg(feature = "sim")]

use std::os::fd::AsFd;

use zverbs::dmabuf::DeviceRegion;
use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::testing::Pair;
use zverbs::{AccessFlags, ChannelConfig, Context, Error, ErrorKind};
use zverbs_sim::Personality;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
/// Where B's device memory is mapped for the NIC (any address: it is the NIC's view).
const IOVA: u64 = 0x7f00_0000_0000;

fn pair() -> Pair<16, 2> {
    Pair::connected(&ChannelConfig::default()).unwrap()
}

/// A's writes land in B's device memory, and A reads back what B's accelerator put there;
/// the host sees the bytes only through the device's copies.
#[test]
fn a_peer_writes_and_reads_device_memory() {
    let mut p = pair();
    let gpu = p.b.ctx.raw().alloc_device_memory(4096).unwrap();
    let region =
        p.b.pd
            .register_dmabuf(gpu.dmabuf_fd(), 0, 4096, IOVA, RW)
            .unwrap();
    let remote = region.remote();
    assert_eq!((remote.addr, remote.len), (IOVA, 4096));

    let mut msg = *b"a tensor, written over RDMA";
    let msg = p.a.pd.register(&mut msg).unwrap();
    let at = remote.slice(100..).unwrap();
    p.a.ch.write([msg.slice(..).unwrap()], &at).unwrap();
    let mut seen = [0u8; 27];
    gpu.copy_out(100, &mut seen).unwrap();
    assert_eq!(&seen, b"a tensor, written over RDMA");

    gpu.copy_in(2000, b"computed on the device").unwrap();
    let mut back = [0u8; 22];
    let mut back_mr = p.a.pd.register(&mut back).unwrap();
    let from = remote.slice(2000..2022).unwrap();
    p.a.ch
        .read([back_mr.slice_mut(..).unwrap()], &from)
        .unwrap();
    drop(back_mr);
    assert_eq!(&back, b"computed on the device");
}

/// Fetch-and-add and compare-and-swap from a peer on a word of device memory.
#[test]
fn a_peer_runs_atomics_on_device_memory() {
    let mut p = pair();
    let gpu = p.b.ctx.raw().alloc_device_memory(64).unwrap();
    gpu.copy_in(8, &40u64.to_ne_bytes()).unwrap();
    let region =
        p.b.pd
            .register_dmabuf(gpu.dmabuf_fd(), 0, 64, IOVA, RW)
            .unwrap();
    let word = region.remote().slice(8..16).unwrap();
    let mut result = [0u8; 8];
    let mut result = p.a.pd.register(&mut result).unwrap();
    let old =
        p.a.ch
            .fetch_add(result.slice_mut(..).unwrap(), &word, 2)
            .unwrap();
    assert_eq!(old, 40);
    let old =
        p.a.ch
            .compare_swap(result.slice_mut(..).unwrap(), &word, 42, 7)
            .unwrap();
    assert_eq!(old, 42);
    let mut now = [0u8; 8];
    gpu.copy_out(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);
}

/// Device memory as a local buffer: A sends from its device memory, B receives into its
/// own; the bytes go device to device.
#[test]
fn sends_and_receives_move_device_memory_to_device_memory() {
    let p = pair();
    let (mut a, mut b) = (p.a, p.b);
    let src = a.ctx.raw().alloc_device_memory(8192).unwrap();
    let dst = b.ctx.raw().alloc_device_memory(8192).unwrap();
    src.copy_in(4096, b"kv cache block").unwrap();
    let lw = AccessFlags::LOCAL_WRITE;
    let src_region =
        a.pd.register_dmabuf(src.dmabuf_fd(), 4096, 4096, 0x1000, lw)
            .unwrap();
    let mut dst_region =
        b.pd.register_dmabuf(dst.dmabuf_fd(), 0, 8192, 0x2000, lw)
            .unwrap();
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let into = dst_region.slice_mut(512..1024).unwrap();
            b.ch.receive([into]).unwrap().byte_len
        });
        a.ch.send([src_region.slice(..14).unwrap()]).unwrap();
        assert_eq!(receiver.join().unwrap(), 14);
    });
    let mut got = [0u8; 14];
    dst.copy_out(512, &mut got).unwrap();
    assert_eq!(&got, b"kv cache block");
}

/// The host cannot read an atomic's result out of device memory: the blocking atomic,
/// which returns it, is refused before anything is posted.
#[test]
fn a_blocking_atomic_with_its_result_in_device_memory_is_refused() {
    let mut p = pair();
    let mut word = [0u8; 8];
    // SAFETY: nothing reads `word` while the mapping is registered.
    let target = unsafe { p.b.pd.register_with_access(&mut word, RW) }.unwrap();
    let gpu = p.a.ctx.raw().alloc_device_memory(64).unwrap();
    let lw = AccessFlags::LOCAL_WRITE;
    let mut region =
        p.a.pd
            .register_dmabuf(gpu.dmabuf_fd(), 0, 64, 0, lw)
            .unwrap();
    let into = region.slice_mut(..8).unwrap();
    assert!(!into.is_host());
    let e = p.a.ch.fetch_add(into, &target.remote(), 1).unwrap_err();
    assert!(matches!(e, Error::InvalidAttribute(_)), "{e}");
    assert_eq!(p.a.ch.in_flight(), (0, 0), "nothing was posted");
}

/// Every malformed registration is refused before the call with a typed error, and the
/// ones only the device can judge (a descriptor that is no dmabuf, a range past its end,
/// a dmabuf of another machine) are refused by it.
#[test]
fn bad_dmabuf_registrations_are_typed_errors() {
    let p = pair();
    let gpu = p.b.ctx.raw().alloc_device_memory(8192).unwrap();
    let fd = gpu.dmabuf_fd();
    let pd = &p.b.pd;
    let kind = |r: Result<DeviceRegion<'_, Sim>, Error<_>>| r.map(drop).unwrap_err().kind();
    let lw = AccessFlags::LOCAL_WRITE;
    let invalid = ErrorKind::InvalidArgument;
    let unknown = AccessFlags::from_bits_retain(1 << 20);
    // (offset, len, iova, access): the first six refused before the call, the last by
    // the device.
    let refused = [
        (0, 0, 0, lw, "no bytes"),
        (0, 4096, 0x10, lw, "page offset"),
        (0, 4096, u64::MAX - 4095, lw, "wraps"),
        (u64::MAX, 1, 0xfff, lw, "offset wraps"),
        (0, 4096, 0, AccessFlags::REMOTE_WRITE, "no local"),
        (0, 4096, 0, unknown, "unknown flag"),
        (4096, 8192, 0, lw, "past the end"),
    ];
    for (offset, len, iova, access, why) in refused {
        let r = pd.register_dmabuf(fd, offset, len, iova, access);
        assert_eq!(kind(r), invalid, "{why}");
    }
    let file = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        kind(pd.register_dmabuf(file.as_fd(), 0, 64, 0, lw)),
        invalid,
        "no dmabuf"
    );
    let theirs = p.a.ctx.raw().alloc_device_memory(64).unwrap();
    let elsewhere = pd.register_dmabuf(theirs.dmabuf_fd(), 0, 64, 0, lw);
    assert_eq!(kind(elsewhere), invalid, "another machine's");
    // A good one, with the descriptor handed over.
    let owned = fd.try_clone_to_owned().unwrap();
    let region = pd
        .register_dmabuf_owned(owned, 4096, 4096, 0x3000, lw)
        .unwrap();
    assert_eq!((region.iova(), region.len()), (0x3000, 4096));
    assert!(region.slice(4000..5000).is_err(), "slices are bounded");
}

/// A device that registers no dmabufs (soft-RoCE, as the rxe personality is) says so in
/// its attributes and refuses with an error of kind `Unsupported`.
#[test]
fn a_device_without_dmabuf_support_refuses_with_unsupported() {
    let cfg = FabricConfig {
        personality: Personality::Rxe,
        ..FabricConfig::default()
    };
    let sim = Sim::with_config(cfg, 1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    assert!(!ctx.query_device().unwrap().dmabuf);
    let gpu = ctx.raw().alloc_device_memory(4096).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let lw = AccessFlags::LOCAL_WRITE;
    let e = pd
        .register_dmabuf(gpu.dmabuf_fd(), 0, 4096, 0, lw)
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

/// The async channel over device memory: each side carves its dmabuf registration into
/// owned device buffers (`DevicePool`); a send from one device buffer lands in a receive
/// into another, and a write from a device buffer lands in the peer's device memory. (An
/// async atomic takes a `HostBuf`: on a `DeviceBuf` it does not compile.)
#[cfg(feature = "tokio")]
#[test]
fn async_operations_move_device_buffers() {
    use zverbs::tokio::AsyncChannel;
    use zverbs::{DeviceBuf, DevicePool, ProtectionDomain};
    type Ch = AsyncChannel<Sim, DeviceBuf<Sim>>;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sim = Sim::with_devices(2);
    let cfg = ChannelConfig::default();
    let open = |dev: &str| {
        let ctx: &'static Context<Sim> = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
        let pd: &'static ProtectionDomain<Sim> = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        let gpu = ctx.raw().alloc_device_memory(1 << 20).unwrap();
        let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
        let region = pd
            .register_dmabuf_owned(fd, 0, 1 << 20, 0x40_0000, RW)
            .unwrap();
        let remote = region.remote();
        let pool = DevicePool::new(region).unwrap();
        (gpu, pool, remote, Ch::prepare(ctx, pd, &cfg).unwrap())
    };
    let ((a_gpu, a_pool, _, a), (b_gpu, b_pool, b_remote, b)) = (open("sim0"), open("sim1"));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    rt.block_on(async {
        let (a, b) = (Ch::new(a).unwrap(), Ch::new(b).unwrap());
        let msg = a_pool.alloc(5).unwrap();
        a_gpu.copy_in(msg.offset(), b"hello").unwrap();
        let inbox = b_pool.alloc(64).unwrap();
        let (got, sent) = tokio::join!(b.receive(inbox), a.send(msg));
        sent.0.unwrap();
        let (done, inbox) = got;
        assert_eq!(done.unwrap().byte_len, 5);
        let mut seen = [0u8; 5];
        b_gpu.copy_out(inbox.offset(), &mut seen).unwrap();
        assert_eq!(&seen, b"hello");

        let block = a_pool.alloc(6).unwrap();
        a_gpu.copy_in(block.offset(), b"layers").unwrap();
        let far = b_remote.slice(900_000..).unwrap();
        let (r, _) = a.write(block, &far).await;
        r.unwrap();
        let mut seen = [0u8; 6];
        b_gpu.copy_out(900_000, &mut seen).unwrap();
        assert_eq!(&seen, b"layers");
    });
}

/// A multi-channel's collectives over device memory: the root scatters three pieces of its
/// device memory into three leaves' device memory with RDMA writes, then gathers them back
/// with reads into another part of it; the leaves' CPUs take no part.
#[test]
fn a_multi_channel_scatters_and_gathers_device_memory() {
    use zverbs::testing::Star;
    let sim = Sim::with_devices(4);
    let mut star = Star::<4>::connected_on(&sim, 3, &ChannelConfig::default()).unwrap();
    let dmabuf = |rank: usize, len: usize| {
        let gpu = star.ctx[rank].raw().alloc_device_memory(len).unwrap();
        let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
        let iova = 0x10_0000 * rank as u64;
        let region = star.pd[rank]
            .register_dmabuf_owned(fd, 0, len, iova, RW)
            .unwrap();
        (gpu, region)
    };
    let (root_gpu, mut root) = dmabuf(0, 4096);
    for piece in 0..3u8 {
        root_gpu
            .copy_in(64 * piece as usize, &[piece + 1; 64])
            .unwrap();
    }
    let leaves: Vec<_> = (1..=3).map(|rank| dmabuf(rank, 64)).collect();
    let remotes: Vec<_> = leaves.iter().map(|(_, region)| region.remote()).collect();

    let pieces = (0..3).map(|i| {
        (
            i + 1,
            root.slice(64 * i..64 * (i + 1)).unwrap(),
            &remotes[i],
        )
    });
    star.root.scatter_write(pieces).unwrap();
    for (i, (gpu, _)) in leaves.iter().enumerate() {
        let mut got = [0u8; 64];
        gpu.copy_out(0, &mut got).unwrap();
        assert_eq!(got, [i as u8 + 1; 64], "leaf {}", i + 1);
    }

    let back = root.slice_mut(1024..1024 + 192).unwrap();
    let (first, rest) = back.split_at(64).unwrap();
    let (second, third) = rest.split_at(64).unwrap();
    let reads = [
        (1, first, &remotes[0]),
        (2, second, &remotes[1]),
        (3, third, &remotes[2]),
    ];
    star.root.gather_read(reads).unwrap();
    let mut all = [0u8; 192];
    root_gpu.copy_out(1024, &mut all).unwrap();
    let want: Vec<u8> = (1..=3u8).flat_map(|b| [b; 64]).collect();
    assert_eq!(&all[..], &want[..]);
}

/// Device memory keeps its rights and bounds against peers: a write into a registration
/// without REMOTE_WRITE, and a write past its end (a remote region a peer made up), both
/// fail with REM_ACCESS_ERR and leave the memory as it was.
#[test]
fn device_memory_refuses_peers_without_rights_or_past_its_end() {
    use zverbs::{RemoteRegion, WcStatus};
    let status = |e: Error<_>| match e {
        Error::Completion(c) => c.status,
        other => panic!("{other}"),
    };
    for (access, past_end) in [(AccessFlags::LOCAL_WRITE, false), (RW, true)] {
        let mut p = pair();
        let gpu = p.b.ctx.raw().alloc_device_memory(4096).unwrap();
        let region =
            p.b.pd
                .register_dmabuf(gpu.dmabuf_fd(), 0, 4096, IOVA, access)
                .unwrap();
        let r = region.remote();
        let target = match past_end {
            false => r,
            true => RemoteRegion {
                addr: r.addr + 4090,
                len: 64,
                rkey: r.rkey,
            },
        };
        let mut msg = [9u8; 16];
        let msg = p.a.pd.register(&mut msg).unwrap();
        let e = p.a.ch.write([msg.slice(..).unwrap()], &target).unwrap_err();
        assert_eq!(status(e), WcStatus::RemAccessErr, "past_end {past_end}");
        let mut after = [1u8; 4096];
        gpu.copy_out(0, &mut after).unwrap();
        assert!(
            after.iter().all(|&b| b == 0),
            "untouched (past_end {past_end})"
        );
    }
}

/// A client of the RPC engine whose large request lies in its device memory: the server
/// reads it straight from there (no host copy on the client), its handler sees the bytes,
/// and the buffer comes back as device memory with the response.
#[test]
fn a_large_rpc_request_is_read_from_device_memory() {
    use zverbs::rpc::{BulkConfig, EngineConfig, MsgBuf};
    use zverbs::testing::RpcPair;
    use zverbs::DevicePool;
    const LEN: usize = 300_000;
    let sim = Sim::with_devices(2);
    let cfg = EngineConfig {
        bulk: Some(BulkConfig::default()),
        ..EngineConfig::default()
    };
    let mut p = RpcPair::connected(&sim, cfg.clone(), cfg, |s| {
        s.register_handler(1, |req, out| {
            // The request's sum and length: the server saw every byte.
            let sum: u64 = req.iter().map(|&b| u64::from(b)).sum();
            out[..8].copy_from_slice(&sum.to_be_bytes());
            out[8..16].copy_from_slice(&(req.len() as u64).to_be_bytes());
            16
        })
    })
    .unwrap();
    let ctx = Context::open(&sim, "sim0").unwrap();
    let gpu = ctx.raw().alloc_device_memory(1 << 20).unwrap();
    let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
    let region = p
        .client
        .pd()
        .register_dmabuf_owned(fd, 0, 1 << 20, IOVA, AccessFlags::REMOTE_READ)
        .unwrap();
    let pool = DevicePool::new(region).unwrap();
    let msg = pool.alloc(LEN).unwrap();
    let bytes: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    gpu.copy_in(msg.offset(), &bytes).unwrap();
    let sum: u64 = bytes.iter().map(|&b| u64::from(b)).sum();

    p.client.enqueue_bulk_device(p.session, 1, msg, 9).unwrap();
    assert!(p.wait_for(1, std::time::Duration::from_secs(20)));
    let o = p.done.pop().unwrap();
    let mut want = sum.to_be_bytes().to_vec();
    want.extend_from_slice(&(LEN as u64).to_be_bytes());
    assert_eq!((o.tag, o.result.unwrap()), (9, want));
    let back = o
        .msg
        .and_then(MsgBuf::into_device)
        .expect("the device buffer");
    assert_eq!((back.len(), back.offset()), (LEN, 0));
    drop(back);
    assert_eq!(
        pool.stats().allocations,
        0,
        "the buffer went back to its pool"
    );
}

/// Device memory a server may not read is refused before anything is sent, with the
/// buffer given back; one beyond the bulk path's largest message too; and memory on
/// another protection domain is refused by the server's device, a typed read failure.
#[test]
fn a_large_rpc_request_from_unreadable_device_memory_is_refused() {
    use zverbs::rpc::{BulkConfig, BulkFailure, EngineConfig, EngineError, RpcError};
    use zverbs::testing::RpcPair;
    use zverbs::{DevicePool, ProtectionDomain};
    let sim = Sim::with_devices(2);
    let cfg = EngineConfig {
        bulk: Some(BulkConfig {
            max_msg_size: 4096,
            ..BulkConfig::default()
        }),
        ..EngineConfig::default()
    };
    let mut p = RpcPair::connected(&sim, cfg.clone(), cfg, |s| {
        s.register_handler(1, |req, out| {
            out[0] = req[0];
            1
        })
    })
    .unwrap();
    let ctx = Context::open(&sim, "sim0").unwrap();
    let other_pd = ctx.alloc_pd().unwrap();
    let pool = |pd: &ProtectionDomain<Sim>, access| {
        let gpu = ctx.raw().alloc_device_memory(1 << 16).unwrap();
        let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
        let region = pd.register_dmabuf_owned(fd, 0, 1 << 16, IOVA, access);
        DevicePool::new(region.unwrap()).unwrap()
    };
    let local_only = pool(p.client.pd(), AccessFlags::LOCAL_WRITE);
    let (e, back) = p
        .client
        .enqueue_bulk_device(p.session, 1, local_only.alloc(64).unwrap(), 1)
        .unwrap_err();
    assert!(matches!(e, EngineError::InvalidConfig(_)), "{e}");
    assert_eq!(back.len(), 64);

    let readable = pool(p.client.pd(), AccessFlags::REMOTE_READ);
    let (e, _) = p
        .client
        .enqueue_bulk_device(p.session, 1, readable.alloc(4097).unwrap(), 2)
        .unwrap_err();
    assert!(matches!(e, EngineError::InvalidConfig(_)), "{e}");

    let elsewhere = pool(&other_pd, AccessFlags::REMOTE_READ);
    let msg = elsewhere.alloc(64).unwrap();
    p.client.enqueue_bulk_device(p.session, 1, msg, 3).unwrap();
    assert!(p.wait_for(1, std::time::Duration::from_secs(20)));
    let o = p.done.pop().unwrap();
    assert!(
        matches!(o.result, Err(RpcError::Bulk(BulkFailure::Read(_)))),
        "{:?}",
        o.result
    );
    assert!(o.msg.is_some(), "the buffer comes back with the failure");
}

/// The async engine's large call from device memory, and the buffer back.
#[cfg(feature = "tokio")]
#[test]
fn an_async_large_call_reads_device_memory() {
    use zverbs::rpc::{BulkConfig, EngineConfig, Rpc};
    use zverbs::tokio::AsyncRpc;
    use zverbs::DevicePool;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sim = Sim::with_devices(2);
    let engine = |dev: &str| {
        let ctx = Context::open(&sim, dev).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cfg = EngineConfig {
            bulk: Some(BulkConfig::default()),
            events: true,
            ..EngineConfig::default()
        };
        let mut rpc = Rpc::new(&ctx, pd, cfg).unwrap();
        rpc.register_handler(1, |req, out| {
            out[..req.len()].copy_from_slice(req);
            req.len()
        })
        .unwrap();
        (ctx, rpc)
    };
    let ((_, server), (ctx, client)) = (engine("sim1"), engine("sim0"));
    let gpu = ctx.raw().alloc_device_memory(1 << 16).unwrap();
    let fd = gpu.dmabuf_fd().try_clone_to_owned().unwrap();
    let region = client.pd().register_dmabuf_owned(fd, 0, 1 << 16, IOVA, RW);
    let pool = DevicePool::new(region.unwrap()).unwrap();
    rt.block_on(async {
        let server = AsyncRpc::new(server).unwrap();
        let client = AsyncRpc::new(client).unwrap();
        let s = client.connect(&server.addr()).await.unwrap();
        let msg = pool.alloc(20_000).unwrap();
        let bytes: Vec<u8> = (0..20_000).map(|i| (i % 199) as u8).collect();
        gpu.copy_in(msg.offset(), &bytes).unwrap();
        let (r, msg, resp) = client.call_bulk_device(s, 1, msg, Vec::new()).await;
        r.unwrap();
        assert_eq!(resp, bytes);
        assert_eq!(msg.expect("the buffer comes back").len(), 20_000);
    });
}
