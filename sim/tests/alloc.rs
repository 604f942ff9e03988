//! Steady state does not allocate: posting, executing and polling reuse preallocated queues.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::*;
use zverbs_sim::*;

struct Counting;

thread_local! {
    static COUNT: Cell<Option<usize>> = const { Cell::new(None) };
}

// SAFETY: forwards to `System`; only counts calls made on a thread that enabled counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        COUNT.with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_does_not_allocate() {
    let p = pair();
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    let mut wc = [Wc {
        wr_id: 0,
        status: WcStatus::GeneralErr,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: None,
        qp_num: 0,
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
    COUNT.with(|c| c.set(Some(0)));
    for round in 0..100u64 {
        p.b.qp.post_recv([rwr(round, &[sge(&mb, 16, 32)])]).unwrap();
        let wrs = [
            sig(1, SendOp::Send, &[sge(&ma, 0, 8), sge(&ma, 8, 8)]),
            swr(2, write, &[sge(&ma, 0, 8)], SendFlags::empty()),
            sig(3, fadd, &[sge(&ma, 32, 8)]),
            swr(4, write, &[sge(&ma, 40, 8)], inline),
        ];
        p.a.qp.post_send(wrs).unwrap();
        assert_eq!(p.a.cq.poll(&mut wc).unwrap(), 3);
        assert_eq!(p.b.cq.poll(&mut wc).unwrap(), 1);
    }
    let n = COUNT.with(|c| c.replace(None)).unwrap();
    assert_eq!(n, 0, "allocations in steady state");
    assert_eq!(
        u64::from_ne_bytes(b_buf.get()[8..16].try_into().unwrap()),
        100
    );
}
