//! Unit and model tests of the ring.

use super::*;
use crate::types::{SendFlags, SendOp, SendWr};
use proptest::prelude::*;
use std::vec::Vec;

type W = SendWr<1>;
fn wr() -> W {
    SendWr::new(0, SendOp::Send, SendFlags::empty())
}
fn wc(seq: u64, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id: seq,
        status,
        ..WorkCompletion::EMPTY
    }
}

#[test]
fn full_ring_refuses_with_typed_error() {
    let mut r: Ring<W, 2> = Ring::new();
    r.stage(wr(), true).unwrap();
    r.stage(wr(), true).unwrap();
    assert_eq!(r.stage(wr(), true), Err(QueueFull { capacity: 2 }));
    assert_eq!(r.staged().len(), 2);
}

#[test]
fn stale_generation_is_detected() {
    let mut r: Ring<W, 2> = Ring::new();
    let a = r.stage(wr(), true).unwrap();
    r.clear_staged();
    r.complete(&wc(a, WcStatus::Success)).unwrap();
    assert!(r.take(a).unwrap().is_ok());
    let _b = r.stage(wr(), true).unwrap();
    let c = r.stage(wr(), true).unwrap();
    assert_eq!(c % 2, a % 2, "c reuses a's slot");
    // A duplicate completion for `a` must not land in `c`'s slot.
    assert_eq!(
        r.complete(&wc(a, WcStatus::Success)),
        Err(UnknownCompletion { wr_id: a })
    );
    assert!(r.is_pending(c));
}

#[test]
fn an_empty_ring_retires_nothing_at_its_tail() {
    let mut r: Ring<W, 2> = Ring::new();
    let a = r.stage(wr(), false).unwrap();
    let b = r.stage(wr(), true).unwrap();
    r.clear_staged();
    // `b`'s completion retires the unsignaled `a` behind it; taking `b` empties the ring,
    // whose tail then sits on `a`'s slot.
    r.complete(&wc(b, WcStatus::Success)).unwrap();
    assert!(r.take(b).unwrap().is_ok());
    assert!(r.is_idle());
    let next = r.next_seq();
    assert_eq!(next % 2, a % 2, "the tail's slot is a's");
    // A completion naming a number not issued yet retires nothing and leaves the ring whole.
    assert!(!r.retire_oldest(next, next));
    assert!(r.is_idle() && r.in_flight() == 0);
    let c = r.stage(wr(), true).unwrap();
    assert_eq!(c, next);
    assert!(r.is_pending(c));
}

#[test]
fn retire_oldest_retires_only_the_wanted_oldest_request() {
    let mut r: Ring<W, 4> = Ring::new();
    let a = r.stage(wr(), true).unwrap();
    let b = r.stage(wr(), true).unwrap();
    r.clear_staged();
    // Not the wanted one, or not the oldest: nothing changes.
    assert!(!r.retire_oldest(a, b));
    assert!(!r.retire_oldest(b, b));
    assert!(r.is_pending(a) && r.is_pending(b));
    // The wanted oldest one, failed: retired at once, with the posted opcode.
    let failed = wc(a, WcStatus::RemAccessErr);
    assert!(r.retire_oldest(failed.wr_id, a));
    let out = r.retired_failure(&failed);
    assert_eq!(
        (out.status, out.opcode),
        (WcStatus::RemAccessErr, WcOpcode::Send)
    );
    assert!(!r.is_pending(a) && r.take(a).is_none());
    // A duplicate is not the oldest any more: left to `complete`, which refuses it.
    assert!(!r.retire_oldest(failed.wr_id, a));
    assert!(r.complete(&failed).is_err());
    assert!(r.retire_oldest(b, b));
    assert!(r.is_idle());
    assert!(!r.retire_oldest(b, b));
}

#[test]
fn out_of_order_signaled_completion_is_refused() {
    let mut r: Ring<W, 4> = Ring::new();
    let _a = r.stage(wr(), true).unwrap();
    let b = r.stage(wr(), true).unwrap();
    assert!(r.complete(&wc(b, WcStatus::Success)).is_err());
}

#[test]
fn reserve_takes_a_slot_without_staging_and_unreserve_gives_it_back() {
    let mut r: Ring<W, 2> = Ring::new();
    let mut w = wr();
    let a = r.reserve(&mut w, true).unwrap();
    assert_eq!(w.wr_id, a);
    assert!(r.staged().is_empty() && r.is_pending(a));
    let mut w = wr();
    let b = r.reserve(&mut w, true).unwrap();
    assert_eq!(r.reserve(&mut wr(), true), Err(QueueFull { capacity: 2 }));
    r.unreserve();
    assert!(!r.is_pending(b) && r.next_seq() == b && r.in_flight() == 1);
    r.complete(&wc(a, WcStatus::Success)).unwrap();
    assert!(r.take(a).unwrap().is_ok());
    r.unreserve(); // nothing reserved: no effect
    assert!(r.is_idle() && r.next_seq() == b);
}

#[test]
fn unstage_returns_slots() {
    let mut r: Ring<W, 4> = Ring::new();
    r.stage(wr(), true).unwrap();
    r.stage(wr(), true).unwrap();
    r.stage(wr(), true).unwrap();
    r.unstage(2);
    assert_eq!(r.in_flight(), 1);
    assert_eq!(r.next_seq(), 1);
    assert!(r.staged().is_empty());
}

/// A request that could not be built gives back its slot and its entry, and only its own:
/// the batch before it stays staged, and the next request takes the same number.
#[test]
fn unstage_last_returns_one_request() {
    let mut r: Ring<W, 4> = Ring::new();
    let a = r.stage(wr(), true).unwrap();
    let (b, _) = r.stage_next(WcOpcode::RdmaWrite, false).unwrap();
    r.unstage_last();
    assert_eq!((r.in_flight(), r.staged().len(), r.next_seq()), (1, 1, b));
    assert!(r.is_pending(a) && !r.holds(b));
    let (again, e) = r.stage_next(WcOpcode::Send, false).unwrap();
    assert_eq!((again, e.wr_id), (b, b));
    r.unstage_last();
    r.unstage_last();
    r.unstage_last(); // nothing staged: no effect
    assert!(r.is_idle() && r.staged().is_empty() && r.next_seq() == a);
}

#[derive(Clone, Debug)]
enum Op {
    Post { signaled: bool },
    CompleteOldestSignaled { ok: bool },
    TakeAny(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any::<bool>().prop_map(|signaled| Op::Post { signaled }),
        any::<bool>().prop_map(|ok| Op::CompleteOldestSignaled { ok }),
        (0usize..8).prop_map(Op::TakeAny),
    ]
}

proptest! {
    // Model: a FIFO of (seq, signaled, outcome). The ring must agree with it on which
    // requests are pending, which outcomes are delivered (exactly once), and capacity.
    #[test]
    fn ring_matches_fifo_model(ops in proptest::collection::vec(op(), 1..200)) {
        const DEPTH: usize = 4;
        let mut r: Ring<W, DEPTH> = Ring::new();
        // (seq, signaled, Some(ok) once completed, taken)
        let mut model: Vec<(u64, bool, Option<bool>, bool)> = Vec::new();
        for op in ops {
            match op {
                Op::Post { signaled } => {
                    let in_flight = model.iter().position(|e| !e.3).map_or(0, |p| model.len() - p);
                    let res = r.stage(wr(), signaled);
                    r.clear_staged();
                    if in_flight == DEPTH {
                        prop_assert!(res.is_err());
                    } else {
                        let seq = res.unwrap();
                        model.push((seq, signaled, None, false));
                    }
                }
                Op::CompleteOldestSignaled { ok } => {
                    // The device completes the next request in order that makes a CQE:
                    // a signaled one, or (when failing) the oldest outstanding one.
                    let pos = model.iter().position(|e| e.2.is_none() && !e.3 && (e.1 || !ok));
                    if let Some(p) = pos {
                        let status = if ok { WcStatus::Success } else { WcStatus::RemAccessErr };
                        r.complete(&wc(model[p].0, status)).unwrap();
                        for e in model.iter_mut().take(p) {
                            if e.2.is_none() && !e.3 { e.2 = Some(true); e.3 = true; }
                        }
                        model[p].2 = Some(ok);
                    }
                }
                Op::TakeAny(i) => {
                    if let Some(e) = model.iter_mut().filter(|e| !e.3).nth(i) {
                        let got = r.take(e.0);
                        match e.2 {
                            None => prop_assert!(got.is_none()),
                            Some(ok) => {
                                prop_assert_eq!(got.map(|g| g.is_ok()), Some(ok));
                                e.3 = true;
                            }
                        }
                        prop_assert!(r.take(e.0).is_none() || !e.3);
                    }
                }
            }
            for e in &model {
                prop_assert_eq!(r.is_pending(e.0), e.2.is_none() && !e.3);
            }
            let live = model.iter().filter(|e| !e.3).count();
            let first_live = model.iter().position(|e| !e.3);
            let expect_in_flight = first_live.map_or(0, |p| model.len() - p);
            prop_assert_eq!(r.in_flight(), expect_in_flight);
            prop_assert!(live <= DEPTH);
        }
    }
}

#[test]
fn a_signaled_completion_retires_the_unsignaled_before_it() {
    use crate::types::{SendFlags, SendOp};
    let mut ring: Ring<SendWr<2>, 4> = Ring::new();
    let a = ring
        .stage(SendWr::new(0, SendOp::Send, SendFlags::empty()), false)
        .unwrap();
    let b = ring
        .stage(SendWr::new(0, SendOp::Send, SendFlags::SIGNALED), true)
        .unwrap();
    assert_eq!(ring.staged().len(), 2);
    ring.clear_staged();
    let wc = WorkCompletion {
        wr_id: b,
        ..WorkCompletion::EMPTY
    };
    ring.complete(&wc).unwrap();
    assert!(ring.take(b).unwrap().is_ok());
    assert!(!ring.holds(a));
    assert!(ring.is_idle());
}

#[test]
fn requests_built_in_place_carry_their_ids_and_the_entries_are_reused() {
    let mut r: Ring<W, 4> = Ring::new();
    r.set_id_tag(7 << 8, 0xff);
    // A batch of two, built where it is staged, then one copied in.
    for seq in 0..2 {
        let (s, e) = r.stage_next(WcOpcode::RdmaWrite, false).unwrap();
        assert_eq!(s, seq);
        e.num_sge = 1;
        e.op = SendOp::Write {
            remote_addr: 64,
            rkey: 9,
        };
    }
    let c = r.stage(wr(), true).unwrap();
    let ids: Vec<u64> = r.staged().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [7 << 8, 7 << 8 | 1, 7 << 8 | 2]);
    assert_eq!(c, 2);
    assert_eq!(r.opcode(0), WcOpcode::RdmaWrite);
    assert_eq!(r.opcode(c), WcOpcode::Send);
    // Posted: the entries are free again, and a request posted by itself is built in the
    // first, with the next number; a full ring refuses it and keeps its slots.
    r.clear_staged();
    let e = r.lone_entry();
    assert_eq!(e.wr_id, 7 << 8 | 3);
    let (seq, posted) = r.reserve_lone(WcOpcode::Send, true).unwrap();
    assert_eq!((seq, posted.wr_id), (3, 7 << 8 | 3));
    assert_eq!(r.in_flight(), 4);
    assert_eq!(
        r.stage_next(WcOpcode::Send, false).map(|(s, _)| s),
        Err(QueueFull { capacity: 4 })
    );
    assert_eq!(
        r.reserve_lone(WcOpcode::Send, true).map(|(s, _)| s),
        Err(QueueFull { capacity: 4 })
    );
    assert_eq!(r.in_flight(), 4);
    assert!(r.staged().is_empty());
}

#[test]
fn a_batch_retires_through_its_signaled_last_request_across_the_wrap() {
    let mut r: Ring<W, 4> = Ring::new();
    // Move the ring's start so that the next batch of four wraps.
    for _ in 0..3 {
        let s = r.stage(wr(), true).unwrap();
        r.clear_staged();
        assert!(r.retire_oldest(s, s));
    }
    let seqs: Vec<u64> = (0..4).map(|i| r.stage(wr(), i == 3).unwrap()).collect();
    r.clear_staged();
    let last = seqs[3];
    // Not the completion of the request asked for: nothing changes.
    assert!(!r.retire_through(last, seqs[2]));
    assert_eq!(
        (r.pending(seqs[0]), r.pending(last)),
        (Some(false), Some(true))
    );
    assert!(r.retire_through(last, last));
    assert!(r.is_idle());
    assert!(seqs.iter().all(|&s| !r.holds(s)));
    // Its slot is free but kept the opcode a failure would report.
    let failed = r.retired_failure(&wc(last, WcStatus::WrFlushErr));
    assert_eq!(
        (failed.status, failed.opcode),
        (WcStatus::WrFlushErr, WcOpcode::Send)
    );
}

#[test]
fn a_batch_does_not_retire_through_an_outcome_or_a_signaled_request() {
    for blocker_signaled in [false, true] {
        let mut r: Ring<W, 8> = Ring::new();
        let first = r.stage(wr(), true).unwrap();
        let rest: Vec<u64> = (0..3).map(|i| r.stage(wr(), i == 2).unwrap()).collect();
        r.clear_staged();
        if !blocker_signaled {
            // `first` has its outcome, not yet taken: it stops the retirement.
            r.complete(&wc(first, WcStatus::Success)).unwrap();
        }
        let last = rest[2];
        assert!(!r.retire_through(last, last));
        // Nothing changed: the general path still records the completion.
        assert!(r.holds(first) && r.is_pending(rest[0]) && r.is_pending(last));
        assert_eq!(
            r.complete(&wc(last, WcStatus::Success)).is_ok(),
            !blocker_signaled
        );
    }
}

#[test]
fn a_chain_takes_a_run_of_slots_across_the_wrap_and_counts_its_ids_within_the_tag() {
    let mut r: Ring<W, 4> = Ring::new();
    r.set_id_tag(7 << 8, 0xff);
    // The head to 254: slot 2 of 4, an id whose low bits wrap two requests later.
    for seq in 0..254 {
        assert_eq!(r.reserve(&mut wr(), true), Ok(seq));
        r.complete(&wc(seq, WcStatus::Success)).unwrap();
        assert!(r.take(seq).unwrap().is_ok());
    }
    let mut chain = [wr(); 4];
    let slots = [
        Slot::posted(WcOpcode::RdmaWrite, false),
        Slot::posted(WcOpcode::Send, false),
        Slot::posted(WcOpcode::RdmaRead, false),
        Slot::posted(WcOpcode::RdmaWrite, true),
    ];
    assert_eq!(r.reserve_chain(&mut chain, &slots), Ok(254));
    let ids: Vec<u64> = chain.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [7 << 8 | 254, 7 << 8 | 255, 7 << 8, 7 << 8 | 1]);
    assert_eq!(
        (r.opcode(254), r.opcode(256)),
        (WcOpcode::RdmaWrite, WcOpcode::RdmaRead)
    );
    assert_eq!((r.pending(256), r.pending(257)), (Some(false), Some(true)));
    assert_eq!(
        r.reserve_chain(&mut [wr()], &slots[..1]),
        Err(QueueFull { capacity: 4 })
    );
    // The last two not posted: given back, and taken again by a chain whose ids count up.
    r.unreserve_run(2);
    assert!(!r.holds(256) && r.holds(255));
    let mut two = [wr(); 2];
    assert_eq!(r.reserve_chain(&mut two, &slots[2..]), Ok(256));
    assert_eq!((two[0].wr_id, two[1].wr_id), (7 << 8, 7 << 8 | 1));
    // One completion of the signaled last retires the chain.
    r.complete(&wc(257, WcStatus::Success)).unwrap();
    assert!(r.take(257).unwrap().is_ok());
    assert!(r.is_idle());
}
