//! The builders against a fake provider: what each request becomes.
use super::*;
use crate::provider::{SendEntry, WorkRequest};
use crate::types::{SendFlags, SendOp, Sge};
use std::cell::{Cell, RefCell};
use std::vec::Vec;

/// The ABI of the extended context's end, as `verbs.h` lays it out: six pointer-sized
/// fields from `create_qp_ex` to `context`.
const _: () = assert!(offset_of!(VerbsContextTail, context) == 7 * 8);
const _: () = assert!(offset_of!(VerbsContextTail, sz) == 6 * 8);

/// A call the fake provider saw: the builder or setter, and `wr_id`, `wr_flags` and
/// the arguments as integers.
type Call = (&'static str, Vec<u64>);

thread_local! {
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
    /// What the fake `wr_complete` returns.
    static COMPLETE: Cell<i32> = const { Cell::new(0) };
}

fn saw(name: &'static str, args: &[u64]) {
    CALLS.with(|c| c.borrow_mut().push((name, args.to_vec())));
}

/// A builder's call, with the `wr_id` and `wr_flags` it reads.
fn built(q: *mut ffi::ibv_qp_ex, name: &'static str, args: &[u64]) {
    // SAFETY: the fake queue pair of the test, alive across the call.
    let (id, flags) = unsafe { ((*q).wr_id, u64::from((*q).wr_flags)) };
    let mut all = std::vec![id, flags];
    all.extend_from_slice(args);
    saw(name, &all);
}

unsafe extern "C" fn start(_: *mut ffi::ibv_qp_ex) {
    saw("start", &[]);
}
unsafe extern "C" fn complete(_: *mut ffi::ibv_qp_ex) -> i32 {
    saw("complete", &[]);
    COMPLETE.with(Cell::get)
}
unsafe extern "C" fn abort(_: *mut ffi::ibv_qp_ex) {
    saw("abort", &[]);
}
unsafe extern "C" fn send(q: *mut ffi::ibv_qp_ex) {
    built(q, "send", &[]);
}
unsafe extern "C" fn send_imm(q: *mut ffi::ibv_qp_ex, imm: u32) {
    built(q, "send_imm", &[u64::from(imm)]);
}
unsafe extern "C" fn write(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64) {
    built(q, "write", &[u64::from(rkey), addr]);
}
unsafe extern "C" fn write_imm(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    built(q, "write_imm", &[u64::from(rkey), addr, u64::from(imm)]);
}
unsafe extern "C" fn read(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64) {
    built(q, "read", &[u64::from(rkey), addr]);
}
unsafe extern "C" fn cas(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64, cmp: u64, swap: u64) {
    built(q, "cas", &[u64::from(rkey), addr, cmp, swap]);
}
unsafe extern "C" fn faa(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    built(q, "faa", &[u64::from(rkey), addr, add]);
}
unsafe extern "C" fn sge(_: *mut ffi::ibv_qp_ex, lkey: u32, addr: u64, len: u32) {
    saw("sge", &[u64::from(lkey), addr, u64::from(len)]);
}
unsafe extern "C" fn sge_list(_: *mut ffi::ibv_qp_ex, n: usize, _: *const ffi::ibv_sge) {
    saw("sge_list", &[n as u64]);
}
unsafe extern "C" fn inline(_: *mut ffi::ibv_qp_ex, addr: *mut c_void, len: usize) {
    saw("inline", &[addr as u64, len as u64]);
}

/// An extended queue pair whose builders are the fakes above.
fn fake_qp() -> ffi::ibv_qp_ex {
    // SAFETY: integers, raw pointers and optional function pointers: all zeroes is a
    // valid value (every builder absent).
    let mut q: ffi::ibv_qp_ex = unsafe { core::mem::zeroed() };
    q.wr_start = Some(start);
    q.wr_complete = Some(complete);
    q.wr_abort = Some(abort);
    q.wr_send = Some(send);
    q.wr_send_imm = Some(send_imm);
    q.wr_rdma_write = Some(write);
    q.wr_rdma_write_imm = Some(write_imm);
    q.wr_rdma_read = Some(read);
    q.wr_atomic_cmp_swp = Some(cas);
    q.wr_atomic_fetch_add = Some(faa);
    q.wr_set_sge = Some(sge);
    q.wr_set_sge_list = Some(sge_list);
    q.wr_set_inline_data = Some(inline);
    q
}

fn entry(id: u64, op: SendOp, flags: SendFlags, sges: u8) -> Entry<2> {
    let mut e = Entry::<2>::BLANK;
    e.set_wr_id(id);
    for (i, s) in e.sges_mut().iter_mut().enumerate() {
        *s = Sge {
            addr: 0x2000 + 0x100 * i as u64,
            length: 8,
            lkey: 3,
        };
    }
    e.set_num_sge(sges);
    e.set_op(op, flags);
    e
}

/// Posts `es` through the fake builders; the calls seen, and whether the legacy post
/// was asked for.
fn post(q: &mut ffi::ibv_qp_ex, es: &mut [Entry<2>]) -> (Vec<Call>, bool, Option<usize>) {
    CALLS.with(|c| c.borrow_mut().clear());
    let b = Builders::of(NonNull::from(q)).expect("every builder present");
    let mut legacy = false;
    // SAFETY: the fake builders read only their arguments and the fake queue pair.
    let r = unsafe {
        b.post(es, |_| {
            legacy = true;
            Ok(())
        })
    };
    (CALLS.with(|c| c.take()), legacy, r.err().map(|e| e.index))
}

fn c(name: &'static str, args: &[u64]) -> Call {
    (name, args.to_vec())
}

/// Every operation takes its own builder with its operands, its `wr_id` and flags
/// written first, then its one gather entry; a chain is one region.
#[test]
fn each_operation_is_its_builder_and_one_gather_entry_in_one_region() {
    let mut q = fake_qp();
    let (rkey, at) = (7, 0x1000);
    let s = SendFlags::SIGNALED.bits() as u64;
    let mut es = [
        entry(1, SendOp::Send, SendFlags::SIGNALED, 1),
        entry(2, SendOp::SendWithImm(0x0102_0304), SendFlags::empty(), 1),
        entry(
            3,
            SendOp::Write {
                remote_addr: at,
                rkey,
            },
            SendFlags::empty(),
            1,
        ),
        entry(
            4,
            SendOp::WriteWithImm {
                remote_addr: at,
                rkey,
                imm: 9,
            },
            SendFlags::empty(),
            1,
        ),
        entry(
            5,
            SendOp::Read {
                remote_addr: at,
                rkey,
            },
            SendFlags::empty(),
            1,
        ),
        entry(
            6,
            SendOp::CompareSwap {
                remote_addr: at,
                rkey,
                compare: 10,
                swap: 11,
            },
            SendFlags::empty(),
            1,
        ),
        entry(
            7,
            SendOp::FetchAdd {
                remote_addr: at,
                rkey,
                add: 12,
            },
            SendFlags::empty(),
            1,
        ),
    ];
    let (calls, legacy, refused) = post(&mut q, &mut es);
    assert!(!legacy && refused.is_none());
    let sg = c("sge", &[3, 0x2000, 8]);
    let imm = |v: u32| u64::from(v.to_be());
    assert_eq!(
        calls,
        [
            c("start", &[]),
            c("send", &[1, s]),
            sg.clone(),
            c("send_imm", &[2, 0, imm(0x0102_0304)]),
            sg.clone(),
            c("write", &[3, 0, 7, at]),
            sg.clone(),
            c("write_imm", &[4, 0, 7, at, imm(9)]),
            sg.clone(),
            c("read", &[5, 0, 7, at]),
            sg.clone(),
            c("cas", &[6, 0, 7, at, 10, 11]),
            sg.clone(),
            c("faa", &[7, 0, 7, at, 12]),
            sg,
            c("complete", &[]),
        ]
    );
    // One request alone: the same region, inline in the caller.
    let (calls, ..) = post(&mut q, &mut es[..1]);
    assert_eq!(calls.len(), 4);
}

/// Inline bytes go through the inline setter (the flag kept: rxe reads it), no gather
/// entry through an empty list.
#[test]
fn inline_and_empty_requests_take_their_own_setters() {
    let mut q = fake_qp();
    let i = SendFlags::INLINE.bits() as u64;
    let mut es = [
        entry(1, SendOp::Send, SendFlags::INLINE, 1),
        entry(2, SendOp::Send, SendFlags::empty(), 0),
    ];
    let (calls, legacy, _) = post(&mut q, &mut es);
    assert!(!legacy);
    assert_eq!(
        calls,
        [
            c("start", &[]),
            c("send", &[1, i]),
            c("inline", &[0x2000, 8]),
            c("send", &[2, 0]),
            c("sge_list", &[0]),
            c("complete", &[]),
        ]
    );
}

/// A chain with a request the builders do not take here (two gather entries; an
/// inline read) is abandoned whole before its doorbell and posted the old way.
#[test]
fn a_chain_the_builders_do_not_take_goes_to_ibv_post_send_whole() {
    let mut q = fake_qp();
    let mut es = [
        entry(1, SendOp::Send, SendFlags::empty(), 1),
        entry(2, SendOp::Send, SendFlags::empty(), 2),
    ];
    let (calls, legacy, _) = post(&mut q, &mut es);
    assert!(legacy);
    assert_eq!(calls.first(), Some(&c("start", &[])));
    assert_eq!(calls.last(), Some(&c("abort", &[])));
    assert!(!calls.iter().any(|(n, _)| *n == "complete"));

    let read = SendOp::Read {
        remote_addr: 0x1000,
        rkey: 7,
    };
    for mut one in [
        [entry(3, read, SendFlags::INLINE, 1)],
        [entry(4, SendOp::Send, SendFlags::empty(), 2)],
    ] {
        let (calls, legacy, _) = post(&mut q, &mut one);
        assert!(
            legacy && calls.is_empty(),
            "one request: checked before the region"
        );
    }
}

/// A region the provider refuses posted nothing: index 0, with its error.
#[test]
fn a_refused_region_posted_nothing() {
    let mut q = fake_qp();
    COMPLETE.with(|r| r.set(12));
    for n in [1, 3] {
        let mut es = [entry(1, SendOp::Send, SendFlags::empty(), 1); 3];
        let (calls, legacy, refused) = post(&mut q, &mut es[..n]);
        assert!(!legacy);
        assert_eq!(refused, Some(0));
        assert_eq!(calls.last(), Some(&c("complete", &[])));
    }
    COMPLETE.with(|r| r.set(0));
}

/// A queue pair missing one builder has none: it posts the old way.
#[test]
fn a_queue_pair_missing_a_builder_has_none() {
    let mut q = fake_qp();
    q.wr_atomic_fetch_add = None;
    assert!(Builders::of(NonNull::from(&mut q)).is_none());
}

/// The check made of one request before its region and the builders' own answer in a
/// chain agree, for every operation, gather count and inline flag: a request goes to
/// `ibv_post_send` alone exactly when it would in a chain.
#[test]
fn one_request_and_a_chain_agree_on_what_is_buildable() {
    let mut q = fake_qp();
    let (remote_addr, rkey) = (0x1000, 7);
    let ops = [
        SendOp::Send,
        SendOp::SendWithImm(1),
        SendOp::Write { remote_addr, rkey },
        SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: 2,
        },
        SendOp::Read { remote_addr, rkey },
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare: 3,
            swap: 4,
        },
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add: 5,
        },
    ];
    let mut built_alone = 0;
    for op in ops {
        for sges in 0..=2 {
            for flags in [SendFlags::empty(), SendFlags::INLINE] {
                let e = entry(1, op, flags, sges);
                let (_, alone, _) = post(&mut q, &mut [e]);
                let (_, chained, _) = post(&mut q, &mut [e, e]);
                assert_eq!(alone, chained, "{op:?}, {sges} entries, {flags:?}");
                assert_eq!(alone, !buildable(&e), "{op:?}, {sges} entries, {flags:?}");
                built_alone += usize::from(!alone);
            }
        }
    }
    // Sends and writes at 0 or 1 entries, inline or not; reads and atomics not inline.
    assert_eq!(built_alone, 4 * 2 * 2 + 3 * 2);
}
