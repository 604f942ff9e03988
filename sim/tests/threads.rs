//! Two threads ping-pong over one connection.

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
        wr_id: 0,
        status: WcStatus::GeneralErr,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        src_qp: 0,
        grh: false,
    }; 2];
    let mut one = [wc[0]];
    let send = |n: u32| {
        out.set(0, &n.to_le_bytes());
        s.qp.post_send([sig(u64::from(n), SendOp::Send, &[sge(&mo, 0, 4)])])
            .unwrap();
    };
    s.qp.post_recv([rwr(0, &[sge(&mi, 0, 4)])]).unwrap();
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
            s.qp.post_recv([rwr(u64::from(got), &[sge(&mi, 0, 4)])])
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
