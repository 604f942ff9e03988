//! Steady state does not allocate: posting, executing and polling reuse preallocated queues.

mod common;

use common::*;
use zverbs_sim::*;

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

/// `rounds` of a receive, a send, a write, a fetch-and-add and an inline write; counts
/// the allocations of the rounds from `counted` on.
fn run(p: &Pair, rounds: std::ops::Range<u64>, counted: u64) -> usize {
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    let mut wc = [WorkCompletion {
        status: WcStatus::GeneralErr,
        ..WorkCompletion::EMPTY
    }; 16];
    let write = SendOp::Write {
        remote_addr: b_buf.addr(0),
        rkey: mb.rkey(),
    };
    let fadd = SendOp::FetchAdd {
        remote_addr: b_buf.addr(8),
        rkey: mb.rkey(),
        add: 1,
    };
    let inline = SendFlags::INLINE | SendFlags::SIGNALED;
    let n = rounds.end - rounds.start;
    let mut one = |round| {
        p.b.qp
            .post_recv(&[rwr(round, &[sge(&mb, 16, 32)])])
            .unwrap();
        let wrs = [
            sig(1, SendOp::Send, &[sge(&ma, 0, 8), sge(&ma, 8, 8)]),
            swr(2, write, &[sge(&ma, 0, 8)], SendFlags::empty()),
            sig(3, fadd, &[sge(&ma, 32, 8)]),
            swr(4, write, &[sge(&ma, 40, 8)], inline),
        ];
        p.a.qp.post_send(&wrs).unwrap();
        assert_eq!(p.a.cq.poll(&mut wc).unwrap(), 3);
        assert_eq!(p.b.cq.poll(&mut wc).unwrap(), 1);
    };
    (rounds.start..counted).for_each(&mut one);
    let ((), allocs) = zverbs_testkit::measure(|| (counted..rounds.end).for_each(&mut one));
    let allocs = allocs.count as usize;
    assert_eq!(
        u64::from_ne_bytes(b_buf.get()[8..16].try_into().unwrap()),
        n
    );
    allocs
}

#[test]
fn steady_state_does_not_allocate() {
    assert_eq!(run(&pair(), 0..100, 0), 0, "allocations in steady state");
}

#[test]
fn lazy_queues_allocate_only_until_their_busiest() {
    let lazy = || {
        let cfg = FabricConfig {
            lazy_queues: true,
            ..FabricConfig::instant()
        };
        pair_in(Fabric::with_config(cfg, 2), Cfg::default(), rts_attr())
    };
    // The first round sizes the queues (so they were not sized at creation) ...
    assert!(
        run(&lazy(), 0..1, 0) > 0,
        "lazy queues allocated at creation"
    );
    // ... and after it nothing allocates.
    assert_eq!(
        run(&lazy(), 0..100, 1),
        0,
        "allocations after the busiest round"
    );
}

#[test]
fn freeing_objects_does_not_allocate() {
    // A destroy may run on a data-path thread (a pool dropped when its task ends).
    let p = pair();
    let bufs: Vec<Buf> = (0..5).map(|i| Buf::new(64, i)).collect();
    let mrs: Vec<Mr> = bufs.iter().map(|b| b.reg(&p.a.pd, all_access())).collect();
    let ((), n) = zverbs_testkit::measure(|| drop(mrs));
    assert_eq!(n.count, 0, "allocations while freeing");
    // And the slots come back lowest first.
    let again = bufs[0].reg(&p.a.pd, all_access());
    assert_eq!(again.lkey() >> 8, 0, "the lowest free slot is reused");
}
