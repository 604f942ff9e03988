//! Two threads ping-pong over one connection.
//!
//! Under valgrind, run these with `--fair-sched=yes`: valgrind runs one thread at a time,
//! and its default scheduler can leave a thread spinning for a lock (a CQ writer lock, the
//! gate's drain) while the holder waits for its turn, for minutes; fairly scheduled, the
//! file takes seconds.

mod common;

use common::*;
use zverbs_sim::*;

const ROUNDS: u32 = 1000;

/// Sends 0.., each after receiving the previous one back (or first, when `starts`).
fn player(s: &Side, starts: bool) {
    let (out, inb) = (Buf::new(4, 0), Buf::new(4, 0));
    let mo = out.reg(&s.pd, AccessFlags::empty());
    let mi = inb.reg(&s.pd, AccessFlags::LOCAL_WRITE);
    let mut wc = [WorkCompletion {
        status: WcStatus::GeneralErr,
        ..WorkCompletion::EMPTY
    }; 2];
    let mut one = [wc[0]];
    let send = |n: u32| {
        out.set(0, &n.to_le_bytes());
        s.qp.post_send(&[sig(u64::from(n), SendOp::Send, &[sge(&mo, 0, 4)])])
            .unwrap();
    };
    s.qp.post_recv(&[rwr(0, &[sge(&mi, 0, 4)])]).unwrap();
    if starts {
        send(0);
    }
    let (mut got, mut sent) = (0u32, u32::from(starts));
    let mut sends_done = 0;
    while got < ROUNDS || sends_done < sent {
        let n = s.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            if w.opcode == WcOpcode::Send {
                sends_done += 1;
                continue;
            }
            let v = u32::from_le_bytes(inb.get().try_into().unwrap());
            assert_eq!(v, got * 2 + u32::from(starts));
            got += 1;
            s.qp.post_recv(&[rwr(u64::from(got), &[sge(&mi, 0, 4)])])
                .unwrap();
            let next = v + 1;
            if next < 2 * ROUNDS {
                // Each send's buffer is reused only after the previous send completed.
                while sends_done < sent {
                    let n = s.cq.poll(&mut one).unwrap();
                    assert!(n == 0 || one[0].opcode == WcOpcode::Send);
                    sends_done += n as u32;
                    std::thread::yield_now();
                }
                send(next);
                sent += 1;
            }
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
}

#[test]
fn ping_pong_1000_messages() {
    let p = pair();
    std::thread::scope(|sc| {
        sc.spawn(|| player(&p.a, true));
        sc.spawn(|| player(&p.b, false));
    });
    assert_eq!(p.a.qp.state(), QpState::ReadyToSend);
    assert_eq!(p.b.qp.state(), QpState::ReadyToSend);
}

/// Requests each end writes to the other in `both_ends_stream_while_the_world_changes`.
const WRITES: usize = 40_000;

/// Writes `WRITES` words into the peer's `inb` (word `k` holds `k + 1`), in lists of four
/// (three unsignaled writes, then a signaled write with immediate `k`, which consumes one
/// of the peer's receives), reposting its own receives as their completions arrive;
/// returns the immediates received, in order.
fn streamer(s: &Side, peer_inb: (u64, u32)) -> Vec<u32> {
    let out = Buf::new(WRITES * 8, 0);
    for k in 0..WRITES {
        out.set(k * 8, &(k as u64 + 1).to_le_bytes());
    }
    let mo = out.reg(&s.pd, AccessFlags::empty());
    let mut wc = [blank_wc(); 16];
    let (mut imms, mut sent, mut acked) = (Vec::new(), 0, 0);
    let expected = WRITES / 4;
    let mut poll = |imms: &mut Vec<u32>, acked: &mut usize| {
        let n = s.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            match w.opcode {
                WcOpcode::RecvRdmaWithImm => {
                    imms.push(w.imm.unwrap());
                    s.qp.post_recv(&[rwr(0, &[])]).unwrap();
                }
                _ => *acked += 1,
            }
        }
        n
    };
    while sent < WRITES {
        let wrs: [SendWr<MAX_SGE>; 4] = core::array::from_fn(|i| {
            let k = sent + i;
            let remote_addr = peer_inb.0 + k as u64 * 8;
            let rkey = peer_inb.1;
            let (op, flags) = if i == 3 {
                let imm = (k / 4) as u32;
                let op = SendOp::WriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                };
                (op, SendFlags::SIGNALED)
            } else {
                (SendOp::Write { remote_addr, rkey }, SendFlags::empty())
            };
            let mut sg_list = [Sge::default(); MAX_SGE];
            sg_list[0] = sge(&mo, k * 8, 8);
            SendWr::<MAX_SGE> {
                wr_id: k as u64,
                sg_list,
                num_sge: 1,
                op,
                flags,
            }
        });
        // SAFETY: no request is inline.
        let res = unsafe { s.qp.post_send_raw(&wrs) };
        match res {
            Ok(()) => sent += 4,
            // Room comes back with the completions.
            Err(e) if e.index == 0 && e.error == SimError::QueueFull => {}
            Err(e) => panic!("{e:?}"),
        }
        poll(&mut imms, &mut acked);
    }
    while imms.len() < expected || acked < expected {
        if poll(&mut imms, &mut acked) == 0 {
            std::thread::yield_now();
        }
    }
    imms
}

/// Both ends write to each other at once (on their send lanes, each consuming the
/// other's receives and writing the other's CQ), while a third thread keeps changing the
/// world: queue pairs created and destroyed (their lanes joining and leaving the gate's
/// list), counters and attributes read. Every word arrives, every completion is a
/// success, the immediates arrive in order, and the counters add up.
#[test]
fn both_ends_stream_while_the_world_changes() {
    let cfg = Cfg {
        cap: QpCaps {
            max_send_wr: 8,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        cq_depth: 256,
        ..Cfg::default()
    };
    let p = pair_with(cfg);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (ia, ib) = (Buf::new(WRITES * 8, 0), Buf::new(WRITES * 8, 0));
    let (ma, mb) = (ia.reg(&p.a.pd, access), ib.reg(&p.b.pd, access));
    for s in [&p.a, &p.b] {
        for _ in 0..64 {
            s.qp.post_recv(&[rwr(0, &[])]).unwrap();
        }
    }
    let (addr_a, addr_b) = (ia.addr(0), ib.addr(0));
    let done = std::sync::atomic::AtomicBool::new(false);
    let (ra, rb) = std::thread::scope(|sc| {
        let ta = sc.spawn(|| streamer(&p.a, (addr_b, mb.rkey())));
        let tb = sc.spawn(|| streamer(&p.b, (addr_a, ma.rkey())));
        sc.spawn(|| {
            let mut churn = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                // A context, PD, CQ and queue pair made and gone.
                drop(side(&p.fabric, "sim0", &cfg));
                churn += p.a.qp.counters().sends_posted + u64::from(p.b.qp.query().sq_psn);
                std::thread::yield_now();
            }
            churn
        });
        let r = (ta.join().unwrap(), tb.join().unwrap());
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    });
    let want: Vec<u32> = (0..(WRITES / 4) as u32).collect();
    assert_eq!(ra, want);
    assert_eq!(rb, want);
    for inb in [&ia, &ib] {
        let got = inb.get();
        for k in 0..WRITES {
            let v = u64::from_le_bytes(got[k * 8..][..8].try_into().unwrap());
            assert_eq!(v, k as u64 + 1, "word {k}");
        }
    }
    // Most went on the lanes (a list meeting the gate closed, or an empty receive queue,
    // takes the packet path).
    let direct = p.fabric.direct_executions();
    assert!(direct > WRITES as u64, "{direct} of {}", 2 * WRITES);
    for s in [&p.a, &p.b] {
        assert_eq!(s.qp.state(), QpState::ReadyToSend);
        let c = s.qp.counters();
        assert_eq!(c.sends_posted, WRITES as u64);
        assert_eq!(c.send_completions, (WRITES / 4) as u64);
    }
}
