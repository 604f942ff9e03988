//! `QpCounters`: doorbells, posts and send completions, on the direct path (untimed
//! fabric) and on the packet path (stepped fabric) alike.

mod common;

use common::*;
use zverbs_sim::*;

/// `n` one-byte writes from `a` to `b`, the last one signaled; the one at `bad` (if any)
/// names a wrong rkey.
fn writes(mrs: &[Mr; 2], n: usize, bad: Option<usize>) -> Vec<SendWr<MAX_SGE>> {
    (0..n)
        .map(|i| {
            let rkey = if Some(i) == bad {
                0xdead
            } else {
                mrs[1].rkey()
            };
            let op = SendOp::Write {
                remote_addr: mrs[1].addr() + i as u64,
                rkey,
            };
            let flags = if i + 1 == n {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            swr(i as u64, op, &[sge(&mrs[0], i, 1)], flags)
        })
        .collect()
}

fn fabrics() -> [Fabric; 2] {
    [Fabric::with_devices(2), stepped(7, Faults::none(), 2)]
}

#[test]
fn one_doorbell_per_post_call_and_one_completion_per_signaled_batch() {
    for fabric in fabrics() {
        let p = pair_in(fabric, Cfg::default(), rts_attr());
        let bufs = [Buf::new(8, 0xab), Buf::new(8, 0)];
        let mrs = [
            bufs[0].reg(&p.a.pd, all_access()),
            bufs[1].reg(&p.b.pd, all_access()),
        ];
        p.a.qp.post_send(&writes(&mrs, 4, None)).unwrap();
        p.fabric.run_until_idle();
        assert_eq!(ids(&drain(&p.a.cq)), [(3, WcStatus::Success)]);
        p.a.qp.post_send(&writes(&mrs, 2, None)).unwrap();
        p.b.qp.post_recv(&[rwr(9, &[])]).unwrap();
        p.b.qp.post_recv::<1>(&[]).unwrap(); // posts nothing: no doorbell
        p.fabric.run_until_idle();
        let c = p.a.qp.counters();
        assert_eq!(
            (
                c.send_doorbells,
                c.sends_posted,
                c.send_completions,
                c.silent_sends
            ),
            (2, 6, 2, 4)
        );
        assert_eq!((c.recv_doorbells, c.recvs_posted), (0, 0));
        let c = p.fabric.qp_counters(p.b.qp.qp_num()).unwrap();
        assert_eq!(
            (c.recv_doorbells, c.recvs_posted, c.send_doorbells),
            (1, 1, 0)
        );
        assert_eq!(bufs[1].get()[..4], [0xab; 4]);
    }
}

#[test]
fn a_failure_mid_batch_completes_it_and_flushes_the_rest() {
    for fabric in fabrics() {
        let p = pair_in(fabric, Cfg::default(), rts_attr());
        let bufs = [Buf::new(8, 0xab), Buf::new(8, 0)];
        let mrs = [
            bufs[0].reg(&p.a.pd, all_access()),
            bufs[1].reg(&p.b.pd, all_access()),
        ];
        p.a.qp.post_send(&writes(&mrs, 5, Some(2))).unwrap();
        p.fabric.run_until_idle();
        let wcs = ids(&drain(&p.a.cq));
        assert_eq!(
            wcs,
            [
                (2, WcStatus::RemAccessErr),
                (3, WcStatus::WrFlushErr),
                (4, WcStatus::WrFlushErr)
            ]
        );
        // Two silent successes, the failure and two flushes: every request ends once.
        let c = p.a.qp.counters();
        assert_eq!(
            (
                c.send_doorbells,
                c.sends_posted,
                c.send_completions,
                c.silent_sends
            ),
            (1, 5, 3, 2)
        );
        // Posted in ERR: accepted, and flushed at once.
        p.a.qp.post_send(&writes(&mrs, 1, None)).unwrap();
        let c = p.a.qp.counters();
        assert_eq!(
            (c.send_doorbells, c.sends_posted, c.send_completions),
            (2, 6, 4)
        );
    }
}

#[test]
fn a_refused_post_counts_only_what_it_posted() {
    let p = pair();
    let bufs = [Buf::new(8, 0xab), Buf::new(8, 0)];
    let mrs = [
        bufs[0].reg(&p.a.pd, all_access()),
        bufs[1].reg(&p.b.pd, all_access()),
    ];
    let mut wrs = writes(&mrs, 3, None);
    wrs[1].num_sge = MAX_SGE as u8 + 1;
    assert_eq!(p.a.qp.post_send(&wrs).unwrap_err().index, 1);
    let c = p.a.qp.counters();
    assert_eq!((c.send_doorbells, c.sends_posted), (1, 1));
    // Refused at the first request: nothing posted, no doorbell.
    assert_eq!(p.a.qp.post_send(&wrs[1..]).unwrap_err().index, 0);
    assert_eq!(p.a.qp.counters().send_doorbells, 1);
    assert_eq!(p.fabric.qp_counters(0), None);
}
