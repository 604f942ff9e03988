use super::*;
use std::sync::{Arc, Mutex};

struct Fake(Mutex<Vec<WorkCompletion>>);

impl Fake {
    fn new() -> Self {
        Fake(Mutex::new(Vec::new()))
    }
    fn push(&self, wr_id: u64, byte_len: u32) {
        self.0.lock().unwrap().push(wc(wr_id, byte_len));
    }
}

impl CompletionSource for Fake {
    type Error = ();
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
        let mut q = self.0.lock().unwrap();
        let n = q.len().min(out.len());
        out[..n].copy_from_slice(&q[..n]);
        q.drain(..n);
        Ok(n)
    }
}

fn wc(wr_id: u64, byte_len: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        byte_len,
        ..WorkCompletion::EMPTY
    }
}

#[test]
fn an_inbox_is_eight_bytes() {
    // Every channel on a shared queue holds one per direction.
    assert_eq!(core::mem::size_of::<Inbox>(), 8);
}

#[test]
fn wr_id_round_trips() {
    let id = WrId::new(0xBEEF, 0xA5, (1 << 45) | 0x12_3456_789A);
    assert_eq!(
        (id.inbox(), id.generation(), id.seq()),
        (0xBEEF, 0xA5, 0x12_3456_789A)
    );
}

#[test]
fn completions_reach_their_own_inbox_in_any_order() {
    let d = Dispatcher::new(3, 4);
    let cq = Fake::new();
    let mut a = d.attach(4).unwrap();
    let mut b = d.attach(4).unwrap();
    cq.push(b.wr_id(0), 20);
    cq.push(a.wr_id(0), 10);
    cq.push(b.wr_id(1), 21);
    let mut out = [WorkCompletion::EMPTY; 4];
    assert_eq!(d.take(&mut a, &mut out), 0, "nothing routed yet");
    assert_eq!(d.poll(&cq), Ok(3));
    assert_eq!(d.take(&mut a, &mut out), 1);
    assert_eq!(out[0].byte_len, 10);
    assert_eq!(d.take(&mut b, &mut out), 2);
    assert_eq!((out[0].byte_len, out[1].byte_len), (20, 21));
    assert_eq!(d.stale_completions(), 0);
}

#[test]
fn attach_refuses_too_deep_and_when_full() {
    let d = Dispatcher::new(1, 4);
    assert_eq!(
        d.attach(5),
        Err(AttachError::TooDeep {
            depth: 5,
            capacity: 4
        })
    );
    let a = d.attach(4).unwrap();
    assert_eq!(d.attach(1), Err(AttachError::NoFreeInbox));
    d.detach(a);
    assert!(d.attach(1).is_ok());
}

#[test]
fn a_reattached_inbox_never_sees_its_predecessors_completions() {
    let d = Dispatcher::new(1, 4);
    let cq = Fake::new();
    let old = d.attach(4).unwrap();
    let old_id = old.wr_id(0);
    cq.push(old_id, 1);
    d.poll(&cq).unwrap(); // routed to the old attachment, never taken
    d.detach(old);
    assert_eq!(d.stale_completions(), 1, "dropped with the old attachment");
    let mut new = d.attach(4).unwrap();
    assert_eq!(new.index(), WrId(old_id).inbox());
    assert_ne!(new.wr_id(0), old_id);
    cq.push(old_id, 2); // still in the queue when the queue pair died
    cq.push(new.wr_id(0), 3);
    d.poll(&cq).unwrap();
    let mut out = [WorkCompletion::EMPTY; 4];
    assert_eq!(d.take(&mut new, &mut out), 1);
    assert_eq!(out[0].byte_len, 3);
    assert_eq!(d.stale_completions(), 2);
    cq.push(u64::MAX, 0); // an inbox that does not exist
    d.poll(&cq).unwrap();
    assert_eq!(d.stale_completions(), 3);
}

#[test]
fn a_full_inbox_counts_overflow_instead_of_overwriting() {
    let d = Dispatcher::new(1, 2);
    let cq = Fake::new();
    let mut a = d.attach(2).unwrap();
    for s in 0..3 {
        cq.push(a.wr_id(s), s as u32);
    }
    d.poll(&cq).unwrap();
    assert_eq!(d.overflowed_completions(), 1);
    let mut out = [WorkCompletion::EMPTY; 4];
    assert_eq!(d.take(&mut a, &mut out), 2);
    assert_eq!((out[0].byte_len, out[1].byte_len), (0, 1));
}

#[test]
fn drain_routes_everything_even_past_one_batch() {
    let d = Dispatcher::new(1, 64);
    let cq = Fake::new();
    let mut a = d.attach(64).unwrap();
    for s in 0..40 {
        cq.push(a.wr_id(s), s as u32);
    }
    d.drain(&cq).unwrap();
    let mut out = [WorkCompletion::EMPTY; 64];
    assert_eq!(d.take(&mut a, &mut out), 40);
    assert!(out[..40]
        .iter()
        .enumerate()
        .all(|(i, w)| w.byte_len == i as u32));
}

#[test]
fn threads_share_one_queue() {
    let d = Arc::new(Dispatcher::new(4, 8));
    let cq = Arc::new(Fake::new());
    let handles: Vec<_> = (0..4u32)
        .map(|t| {
            let (d, cq) = (d.clone(), cq.clone());
            std::thread::spawn(move || {
                let mut inbox = d.attach(8).unwrap();
                let mut out = [WorkCompletion::EMPTY; 8];
                for i in 0..2000u64 {
                    cq.push(inbox.wr_id(i), t);
                    loop {
                        d.poll(&*cq).unwrap();
                        match d.take(&mut inbox, &mut out) {
                            0 => std::thread::yield_now(),
                            1 => break,
                            n => panic!("{n} completions for one request"),
                        }
                    }
                    assert_eq!(out[0].byte_len, t);
                    assert_eq!(WrId(out[0].wr_id).seq(), i);
                }
                d.detach(inbox);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(d.stale_completions(), 0);
}

#[test]
fn poll_for_keeps_its_own_in_order_and_routes_the_rest() {
    let d = Dispatcher::new(2, 8);
    let cq = Fake::new();
    let mut a = d.attach(8).unwrap();
    let mut b = d.attach(8).unwrap();
    // a's first completion was routed by someone else before a polls.
    cq.push(a.wr_id(0), 0);
    d.poll(&cq).unwrap();
    cq.push(b.wr_id(0), 100);
    cq.push(a.wr_id(1), 1);
    cq.push(b.wr_id(1), 101);
    cq.push(a.wr_id(2), 2);
    let mut out = [WorkCompletion::EMPTY; 8];
    // The inbox first: what was routed before comes before what is polled now.
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(1));
    assert_eq!(out[0].byte_len, 0);
    // Then straight from the queue: a's own, compacted; b's routed to b.
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(2));
    assert_eq!((out[0].byte_len, out[1].byte_len), (1, 2));
    assert_eq!(d.take(&mut b, &mut out), 2);
    assert_eq!((out[0].byte_len, out[1].byte_len), (100, 101));
    assert_eq!(d.stale_completions(), 0);
}

#[test]
fn the_poll_right_biases_to_a_thread_that_polls_alone_and_another_thread_revokes_it() {
    let d = Dispatcher::new(2, 4);
    let cq = Fake::new();
    let mut a = d.attach(4).unwrap();
    let mut out = [WorkCompletion::EMPTY; 4];
    for _ in 0..right::REBIAS_AFTER {
        assert!(!d.is_biased());
        assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(0));
    }
    if !right::biasing_available() {
        eprintln!("membarrier unavailable here: the right never biases");
        assert!(!d.is_biased());
        return;
    }
    assert!(
        d.is_biased(),
        "biased after {} turns in a row",
        right::REBIAS_AFTER
    );
    // Biased turns still route: another inbox's completion reaches it, ours stays ours.
    let b = d.attach(4).unwrap();
    cq.push(b.wr_id(0), 7);
    cq.push(a.wr_id(0), 3);
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(1));
    assert_eq!(out[0].byte_len, 3);
    // Another thread finds its routed completion, then takes a turn of its own: that
    // revokes the bias, and its poll works.
    let mut b = b;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut out = [WorkCompletion::EMPTY; 4];
            assert_eq!(d.poll_for(&cq, &mut b, &mut out), Ok(1));
            assert_eq!(out[0].byte_len, 7);
            assert!(d.is_biased(), "taking routed mail is no turn");
            cq.push(b.wr_id(1), 8);
            assert_eq!(d.poll_for(&cq, &mut b, &mut out), Ok(1));
            assert_eq!(out[0].byte_len, 8);
        });
    });
    assert!(!d.is_biased());
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(0));
    d.detach(a);
    d.detach(b);
}

#[test]
fn a_biased_poll_hands_out_mail_routed_before_the_bias_first() {
    let d = Dispatcher::new(2, 4);
    let cq = Fake::new();
    let mut a = d.attach(4).unwrap();
    // Another thread's turn routes `a`'s first completion, before any bias.
    cq.push(a.wr_id(0), 1);
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(d.poll(&cq), Ok(1)));
    });
    // This thread takes turns that route nothing, without looking at its mail, until the
    // right is biased to it.
    for _ in 0..right::REBIAS_AFTER {
        assert_eq!(d.poll(&cq), Ok(0));
    }
    assert_eq!(d.is_biased(), right::biasing_available());
    // The device completes `a`'s second request: the older, routed one comes out first.
    cq.push(a.wr_id(1), 2);
    let mut out = [WorkCompletion::EMPTY; 1];
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(1));
    assert_eq!(out[0].byte_len, 1, "the mail first");
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(1));
    assert_eq!(out[0].byte_len, 2);
    d.detach(a);
}

fn shared_recv(buffer: u64, qp_num: u32, byte_len: u32) -> WorkCompletion {
    WorkCompletion {
        qp_num,
        ..wc(WrId::shared_recv(buffer).0, byte_len)
    }
}

/// A channel polling for itself keeps its shared receives among its own completions, in
/// queue order, and routes the other queue pair's to its inbox.
#[test]
fn shared_receives_follow_their_queue_pair_in_queue_order() {
    let d = Dispatcher::new(2, 8).with_qp_routes();
    let cq = Fake::new();
    let (mut a, mut b) = (d.attach(8).unwrap(), d.attach(8).unwrap());
    d.bind_qp(&mut a, 0x100).unwrap();
    d.bind_qp(&mut b, 0x200).unwrap();
    assert_eq!((a.bound_qp(), b.bound_qp()), (Some(0x100), Some(0x200)));
    cq.push(a.wr_id(0), 1);
    cq.0.lock().unwrap().push(shared_recv(9, 0x200, 2));
    cq.0.lock().unwrap().push(shared_recv(4, 0x100, 3));
    cq.push(a.wr_id(1), 4);
    let mut out = [WorkCompletion::EMPTY; 8];
    assert_eq!(d.poll_for(&cq, &mut a, &mut out), Ok(3));
    let lens: Vec<u32> = out[..3].iter().map(|w| w.byte_len).collect();
    assert_eq!(lens, [1, 3, 4]);
    assert_eq!(WrId(out[1].wr_id).seq(), 4, "the wr_id names the buffer");
    assert_eq!(d.take(&mut b, &mut out), 1);
    assert_eq!((out[0].byte_len, WrId(out[0].wr_id).seq()), (2, 9));
    assert_eq!(d.stale_completions(), 0);
}

/// A queue pair bound to no inbox (never, or no longer: its inbox was detached, or bound
/// to another queue pair since) has its shared receives counted stale, never delivered to
/// whoever holds the inbox now.
#[test]
fn shared_receives_of_an_unbound_queue_pair_are_stale() {
    let d = Dispatcher::new(1, 4).with_qp_routes();
    let cq = Fake::new();
    let mut a = d.attach(4).unwrap();
    d.bind_qp(&mut a, 7).unwrap();
    d.bind_qp(&mut a, 8).unwrap(); // rebound: 7 is no longer routed
    cq.0.lock().unwrap().push(shared_recv(0, 7, 1));
    cq.0.lock().unwrap().push(shared_recv(1, 99, 1));
    assert_eq!(d.poll(&cq), Ok(2));
    assert_eq!(d.stale_completions(), 2);
    d.detach(a);
    let mut again = d.attach(4).unwrap();
    cq.0.lock().unwrap().push(shared_recv(2, 8, 1));
    assert_eq!(d.poll(&cq), Ok(1));
    let mut out = [WorkCompletion::EMPTY; 4];
    assert_eq!(
        d.take(&mut again, &mut out),
        0,
        "the old binding went with the detach"
    );
    assert_eq!(d.stale_completions(), 3);
    assert_eq!(
        Dispatcher::new(1, 4).bind_qp(&mut again, 1),
        Err(BindQpError::NoQpRoutes)
    );
    // Not queue pair numbers: refused, and the binding there stays.
    d.bind_qp(&mut again, 9).unwrap();
    for n in [0xFF_FFFF, 0x100_0000, u32::MAX] {
        assert_eq!(d.bind_qp(&mut again, n), Err(BindQpError::NotAQpNumber(n)));
    }
    assert_eq!(again.bound_qp(), Some(9));
}
