//! Multi-node scenarios: the layers above the channel (`MultiChannel`, `Node`) on the same
//! backend, with several ranks as threads. Rank `r` opens the first of [`Env::devices`] for
//! even `r`, the second for odd `r` (so on one device, as on `rxe0`, every connection is a
//! loopback one, and on two devices some are), each rank with its own context and
//! protection domain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use super::*;
use zverbs::node::barrier::Algorithm;
use zverbs::node::{Node, NodeConfig};
use zverbs::{ChannelConfig, LocalSlice, LocalSliceMut, MultiChannel, RemoteRegion};

/// Ranks in the multi-node scenarios.
const RANKS: usize = 3;
/// Capacity (peer indices) of each rank's `MultiChannel` / `Node`.
const CAP: usize = 4;
/// Bytes per rank-to-rank chunk.
const CHUNK: usize = 256;
/// Consecutive full barriers per algorithm.
const ROUNDS: usize = 4;

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const REMOTE_RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// A rank's context and protection domain (the protection domain drops first).
struct Rank<P: Provider> {
    pd: ProtectionDomain<P>,
    ctx: Context<P>,
}

fn ranks<E: Env>(env: &E) -> Run<Vec<Rank<E::P>>> {
    let (da, db) = env.devices();
    (0..RANKS)
        .map(|r| {
            let name = if r % 2 == 0 { da } else { db };
            let ctx = Context::open(env.provider(), name).map_err(err("open device"))?;
            let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
            Ok(Rank { pd, ctx })
        })
        .collect()
}

fn channel_config<E: Env>(env: &E, ctx: &Context<E::P>) -> ChannelConfig {
    ChannelConfig {
        qp: env.qp_config(ctx),
        timeout: Some(env.timeout()),
        ..ChannelConfig::default()
    }
}

/// Byte `i` of the chunk rank `writer` sends or writes to rank `owner`.
fn byte(writer: usize, owner: usize, i: usize) -> u8 {
    (writer as u8).wrapping_mul(37) ^ (owner as u8).wrapping_mul(11) ^ (i as u8)
}

fn chunk_of(writer: usize, owner: usize) -> Vec<u8> {
    (0..CHUNK).map(|i| byte(writer, owner, i)).collect()
}

/// `mr` cut into `RANKS` chunks; chunk `k` is `Some` when `keep(k)`.
fn chunks_mut<'a, P: Provider>(
    mr: &'a mut MemoryRegion<'static, P>,
    keep: impl Fn(usize) -> bool,
) -> Run<Vec<(usize, LocalSliceMut<'a>)>> {
    let mut rest = mr.slice_mut(..).map_err(err("slice"))?;
    let mut out = Vec::new();
    for k in 0..RANKS {
        let (head, tail) = rest.split_at(CHUNK).map_err(err("split"))?;
        if keep(k) {
            out.push((k, head));
        }
        rest = tail;
    }
    Ok(out)
}

fn chunk<'a, P: Provider>(mr: &'a MemoryRegion<'static, P>, k: usize) -> Run<LocalSlice<'a>> {
    mr.slice(k * CHUNK..(k + 1) * CHUNK).map_err(err("slice"))
}

/// One rank of [`multi_channel_scatter_gather`]: its channels and buffers.
struct SgRank<P: Provider> {
    mc: MultiChannel<P, CAP, 16, SGES>,
    /// Chunk `p` is what this rank sends or writes to rank `p`.
    out: MemoryRegion<'static, P>,
    /// Chunk `s` receives the message from rank `s`.
    msgs: MemoryRegion<'static, P>,
    /// Chunk `w` is written by rank `w` (remote write and read).
    inbox: MemoryRegion<'static, P>,
    /// Chunk `p` is read from rank `p`'s inbox.
    gathered: MemoryRegion<'static, P>,
    /// The synchronisation message: 8 bytes of the rank.
    sync_out: MemoryRegion<'static, P>,
    /// Chunk `p` receives rank `p`'s synchronisation message.
    sync_in: MemoryRegion<'static, P>,
}

/// Three ranks, each with a `MultiChannel` to the other two:
/// 1. rank 0 `scatter_send`s a distinct chunk to each leaf, which `gather_receive`s it and
///    `scatter_send`s one back, which rank 0 `gather_receive`s;
/// 2. every rank `scatter_write`s a chunk into slot `me` of every peer's inbox;
/// 3. a scoped round of sends and receives to every peer (each rank's writes completed
///    before it sent, so after it every inbox is final);
/// 4. every rank `gather_read`s from each peer `p` the slot rank `(p + 1) % 3` wrote there.
///
/// Then all memory is checked against the model.
pub fn multi_channel_scatter_gather<E: Env>(env: &E) -> Run<Outcome> {
    let ranks = ranks(env)?;
    let prepared = ranks
        .iter()
        .enumerate()
        .map(|(me, r)| {
            let peers = (0..RANKS).filter(move |&p| p != me);
            let cfg = channel_config(env, &r.ctx);
            MultiChannel::<E::P, CAP, 16, SGES>::prepare(&r.ctx, &r.pd, peers, &cfg)
                .map_err(err("prepare"))
        })
        .collect::<Run<Vec<_>>>()?;
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|m| (0..RANKS).map(|p| m.endpoint(p).ok()).collect())
        .collect();
    let mut states = Vec::new();
    for (me, (m, r)) in prepared.into_iter().zip(&ranks).enumerate() {
        let mc = m.connect(|p| eps[p][me]).map_err(err("connect"))?;
        let mut out = region(&r.pd, RANKS * CHUNK, LW, 0)?;
        for p in 0..RANKS {
            out.as_mut_slice()[p * CHUNK..(p + 1) * CHUNK].copy_from_slice(&chunk_of(me, p));
        }
        states.push(SgRank {
            mc,
            out,
            msgs: region(&r.pd, RANKS * CHUNK, LW, 0xEE)?,
            inbox: region(&r.pd, RANKS * CHUNK, REMOTE_RW, 0xEE)?,
            gathered: region(&r.pd, RANKS * CHUNK, LW, 0xEE)?,
            sync_out: region(&r.pd, 8, LW, me as u8)?,
            sync_in: region(&r.pd, RANKS * CHUNK, LW, 0xEE)?,
        });
    }
    let inboxes: Vec<RemoteRegion> = states.iter().map(|s| s.inbox.remote()).collect();
    let lens: Vec<Run<Vec<u32>>> = thread::scope(|t| {
        let handles: Vec<_> = states
            .iter_mut()
            .enumerate()
            .map(|(me, st)| {
                let inboxes = &inboxes;
                t.spawn(move || sg_rank(me, st, inboxes).map_err(|e| format!("rank {me}: {e}")))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
            .collect()
    });
    let lens = lens.into_iter().collect::<Run<Vec<_>>>()?;

    let slot = |mr: &MemoryRegion<'static, E::P>, k: usize| -> Vec<u8> {
        mr.as_slice()[k * CHUNK..(k + 1) * CHUNK].to_vec()
    };
    let blank = vec![0xEE; CHUNK];
    let (mut sent_ok, mut written_ok, mut read_ok, mut sync_ok) = (true, true, true, true);
    for (me, st) in states.iter().enumerate() {
        for k in 0..RANKS {
            // Rank 0 received from every leaf; a leaf from rank 0 only.
            let from_k = k != me && (me == 0 || k == 0);
            let want = if from_k {
                chunk_of(k, me)
            } else {
                blank.clone()
            };
            sent_ok &= slot(&st.msgs, k) == want;
            let want = if k == me {
                blank.clone()
            } else {
                chunk_of(k, me)
            };
            written_ok &= slot(&st.inbox, k) == want;
            let w = (k + 1) % RANKS;
            let want = if k == me {
                blank.clone()
            } else {
                chunk_of(w, k)
            };
            read_ok &= slot(&st.gathered, k) == want;
            let s = slot(&st.sync_in, k);
            sync_ok &= if k == me {
                s == blank
            } else {
                s[..8] == [k as u8; 8] && s[8..] == blank[8..]
            };
        }
    }
    let mut o = Outcome::default();
    o.item("ranks", RANKS)
        .item("received_lens", format_args!("{lens:?}"))
        .check("scatter_send+gather_receive", sent_ok)
        .check("scatter_write", written_ok)
        .check("scoped_sync", sync_ok)
        .check("gather_read", read_ok);
    Ok(o)
}

/// Steps 1–4 of [`multi_channel_scatter_gather`] for rank `me`; returns the byte counts of
/// the messages it received, in peer order.
fn sg_rank<P: Provider>(me: usize, st: &mut SgRank<P>, inboxes: &[RemoteRegion]) -> Run<Vec<u32>> {
    let SgRank {
        mc,
        out,
        msgs,
        gathered,
        sync_out,
        sync_in,
        ..
    } = st;
    let peers: Vec<usize> = (0..RANKS).filter(|&p| p != me).collect();
    let lens_of = |got: [Option<zverbs::Completion>; CAP]| -> Vec<u32> {
        got.iter().flatten().map(|c| c.byte_len).collect()
    };
    // 1. Rank 0 scatters, the leaves gather and answer, rank 0 gathers the answers.
    let lens = if me == 0 {
        let sends = peers
            .iter()
            .map(|&p| Ok((p, chunk(out, p)?)))
            .collect::<Run<Vec<_>>>()?;
        mc.scatter_send(sends).map_err(err("scatter_send"))?;
        let recvs = chunks_mut(msgs, |k| k != me)?;
        lens_of(mc.gather_receive(recvs).map_err(err("gather_receive"))?)
    } else {
        let recvs = chunks_mut(msgs, |k| k == 0)?;
        let got = mc.gather_receive(recvs).map_err(err("gather_receive"))?;
        mc.scatter_send([(0, chunk(out, 0)?)])
            .map_err(err("scatter_send"))?;
        lens_of(got)
    };
    // 2. Chunk p of `out` into slot `me` of p's inbox.
    let targets = peers
        .iter()
        .map(|&p| {
            let slot = (me * CHUNK) as u64..((me + 1) * CHUNK) as u64;
            inboxes[p].slice(slot).map_err(err("remote slice"))
        })
        .collect::<Run<Vec<_>>>()?;
    let writes = peers
        .iter()
        .zip(&targets)
        .map(|(&p, r)| Ok((p, chunk(out, p)?, r)))
        .collect::<Run<Vec<_>>>()?;
    mc.scatter_write(writes).map_err(err("scatter_write"))?;
    // 3. Everyone's writes are done once everyone's message arrived.
    let own = sync_out.slice(..).map_err(err("slice"))?;
    let slots = chunks_mut(sync_in, |k| k != me)?;
    mc.scope(|s| {
        for (p, slot) in slots {
            s.post_receive(p, [slot])?;
        }
        for &p in &peers {
            s.post_send(p, [own])?;
        }
        Ok(())
    })
    .map_err(err("scoped sync"))?;
    // 4. From each peer p, the slot rank (p + 1) % RANKS wrote there.
    let sources = peers
        .iter()
        .map(|&p| {
            let w = (p + 1) % RANKS;
            let slot = (w * CHUNK) as u64..((w + 1) * CHUNK) as u64;
            inboxes[p].slice(slot).map_err(err("remote slice"))
        })
        .collect::<Run<Vec<_>>>()?;
    let reads = chunks_mut(gathered, |k| k != me)?
        .into_iter()
        .zip(&sources)
        .map(|((p, s), r)| (p, s, r));
    mc.gather_read(reads).map_err(err("gather_read"))?;
    Ok(lens)
}

/// For each algorithm, three ranks (`Node`s, one thread each) run `ROUNDS` consecutive
/// full barriers, then ranks 0 and 2 a barrier of their own, then everyone one more. Each
/// rank counts its arrival before a barrier and checks, once released, that everyone had
/// arrived.
pub fn node_barrier<E: Env>(env: &E) -> Run<Outcome> {
    let ranks = ranks(env)?;
    let mut o = Outcome::default();
    for alg in [
        Algorithm::Centralized,
        Algorithm::Dissemination,
        Algorithm::BinaryTree,
    ] {
        let result = barrier_round(env, &ranks, alg)?;
        o.item(&format!("{alg:?}"), result);
    }
    Ok(o)
}

/// One algorithm of [`node_barrier`]: `completed=<barriers> early=<releases before all
/// arrived> poisoned=<nodes>`, or the first error.
fn barrier_round<E: Env>(env: &E, ranks: &[Rank<E::P>], alg: Algorithm) -> Run<String> {
    let prepared = ranks
        .iter()
        .enumerate()
        .map(|(me, r)| {
            let cfg = NodeConfig {
                channel: channel_config(env, &r.ctx),
                algorithm: alg,
                barrier_timeout: Some(env.timeout()),
                ..NodeConfig::default()
            };
            Node::<E::P, CAP, 16, 2>::prepare(&r.ctx, &r.pd, me, RANKS, &cfg)
                .map_err(err("prepare node"))
        })
        .collect::<Run<Vec<_>>>()?;
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|n| (0..RANKS).map(|p| n.endpoints(p).ok()).collect())
        .collect();
    let mut nodes = prepared
        .into_iter()
        .enumerate()
        .map(|(me, n)| n.connect(|p| eps[p][me]).map_err(err("connect node")))
        .collect::<Run<Vec<_>>>()?;
    let arrivals: Vec<AtomicUsize> = (0..=ROUNDS).map(|_| AtomicUsize::new(0)).collect();
    let subset = AtomicUsize::new(0);
    let early = AtomicUsize::new(0);
    // The threads borrow the nodes: none is dropped (its queue pairs destroyed, maybe with
    // a barrier message not yet on the wire) before every rank left its last barrier.
    let results: Vec<Run<(usize, bool)>> = thread::scope(|t| {
        let handles: Vec<_> = nodes
            .iter_mut()
            .map(|node| {
                let (arrivals, subset, early) = (&arrivals, &subset, &early);
                t.spawn(move || -> Run<(usize, bool)> {
                    let me = node.rank();
                    let fail = |e| format!("rank {me}: {e}");
                    let mut done = 0;
                    let mut full = |node: &mut Node<E::P, CAP, 16, 2>, a: &AtomicUsize| {
                        if me == (done % RANKS) {
                            thread::yield_now(); // vary who comes last
                        }
                        a.fetch_add(1, Ordering::SeqCst);
                        node.barrier_all().map_err(fail)?;
                        if a.load(Ordering::SeqCst) != RANKS {
                            early.fetch_add(1, Ordering::SeqCst);
                        }
                        done += 1;
                        Ok::<_, String>(())
                    };
                    for a in &arrivals[..ROUNDS] {
                        full(node, a)?;
                    }
                    let mut extra = 0;
                    if me % 2 == 0 {
                        subset.fetch_add(1, Ordering::SeqCst);
                        node.barrier(&[0, 2]).map_err(fail)?;
                        if subset.load(Ordering::SeqCst) != 2 {
                            early.fetch_add(1, Ordering::SeqCst);
                        }
                        extra = 1;
                    }
                    full(node, &arrivals[ROUNDS])?;
                    Ok((done + extra, node.is_poisoned()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
            .collect()
    });
    let mut completed = 0;
    let mut poisoned = 0;
    for r in results {
        let (n, p) = r?;
        completed += n;
        poisoned += usize::from(p);
    }
    Ok(format!(
        "completed={completed} early={} poisoned={poisoned}",
        early.load(Ordering::SeqCst)
    ))
}

/// What the multi-node scenarios must give on every backend.
pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const multi_channel_scatter_gather: &str = "ranks=3; received_lens=[[256, 256], [256], \
         [256]]; scatter_send+gather_receive=ok; scatter_write=ok; scoped_sync=ok; gather_read=ok";
    /// 3 ranks × 5 full barriers + 2 ranks × 1 subset barrier.
    pub const node_barrier: &str = "Centralized=completed=17 early=0 poisoned=0; \
         Dissemination=completed=17 early=0 poisoned=0; BinaryTree=completed=17 early=0 \
         poisoned=0";
}
