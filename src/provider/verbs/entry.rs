//! The backend's send entries: an `ibv_send_wr` with its gather list beside it, built
//! where a channel's ring keeps it and posted from there ([`post_entries`]), so a post is
//! the library's request as the channel wrote it, linked, and one call: no request of ours
//! read back and translated, no 128-byte request zeroed per post.

use core::ptr;

use ibverbs_sys as ffi;

use super::chain::bad_index;
use super::error::VerbsError;
use super::PostFn;
use crate::provider::{PostError, SendEntry, WorkRequest};
use crate::types::{SendFlags, SendOp, Sge, WcOpcode};

/// A send work request in the verbs library's layout with room for `SGES` gather entries.
///
/// Every field the library reads for the request's opcode is written by
/// [`set_op`](SendEntry::set_op) (the opcode, the flags, and the immediate, remote
/// address, atomic operands or datagram destination where the opcode has them), by the
/// gather setters, or by [`post_entries`] (the links `sg_list` and `next`); the XRC and
/// memory-window unions stay zero from [`BLANK`](WorkRequest::BLANK).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Entry<const SGES: usize> {
    wr: ffi::ibv_send_wr,
    sges: [Sge; SGES],
}

// SAFETY: the raw pointers in `wr` (`next`, `sg_list`, a datagram's `ah`) are values, not
// borrows: only the verbs library dereferences them, inside `post_entries`, which points
// `next` and `sg_list` into the entries it posts just before its call; a datagram's address
// handle is the poster's contract, as for `Provider::post_send`. So an entry may move to,
// and be read from, another thread.
unsafe impl<const SGES: usize> Send for Entry<SGES> {}
// SAFETY: a shared entry is only read, and its raw pointers are never dereferenced
// outside `post_entries`, which needs the entry exclusively.
unsafe impl<const SGES: usize> Sync for Entry<SGES> {}

impl<const SGES: usize> Entry<SGES> {
    /// The request as the library reads it.
    #[inline(always)]
    pub(super) fn wr(&self) -> &ffi::ibv_send_wr {
        &self.wr
    }

    /// Its gather entries (the first `num_sge` in use).
    #[inline(always)]
    pub(super) fn sges(&self) -> &[Sge; SGES] {
        &self.sges
    }

    /// Whether `num_sge` names no more entries than `sges` holds: the library would read
    /// past it otherwise.
    #[inline(always)]
    fn fits(&self) -> bool {
        (self.wr.num_sge as u32) <= SGES as u32
    }

    /// Points the request at its own gather list and at `next`.
    #[inline(always)]
    fn link(&mut self, next: *mut ffi::ibv_send_wr) {
        self.wr.sg_list = self.sges.as_mut_ptr().cast::<ffi::ibv_sge>();
        self.wr.next = next;
    }
}

impl<const SGES: usize> WorkRequest for Entry<SGES> {
    const BLANK: Self = Entry {
        // SAFETY: `ibv_send_wr` is integers, raw pointers and unions of those: all zeroes
        // is a valid value (null links, opcode RDMA_WRITE, no flags).
        wr: unsafe { core::mem::zeroed() },
        sges: [Sge::EMPTY; SGES],
    };
    #[inline(always)]
    fn set_wr_id(&mut self, id: u64) {
        self.wr.wr_id = id;
    }
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }
    #[inline]
    fn opcode(&self) -> WcOpcode {
        use ffi::ibv_wr_opcode as op;
        match self.wr.opcode {
            op::IBV_WR_RDMA_WRITE | op::IBV_WR_RDMA_WRITE_WITH_IMM => WcOpcode::RdmaWrite,
            op::IBV_WR_RDMA_READ => WcOpcode::RdmaRead,
            op::IBV_WR_ATOMIC_CMP_AND_SWP => WcOpcode::CompareSwap,
            op::IBV_WR_ATOMIC_FETCH_AND_ADD => WcOpcode::FetchAdd,
            _ => WcOpcode::Send,
        }
    }
    #[inline(always)]
    fn set_signaled(&mut self, on: bool) {
        let signaled = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if on {
            self.wr.send_flags |= signaled;
        } else {
            self.wr.send_flags &= !signaled;
        }
    }
}

impl<const SGES: usize> SendEntry<SGES> for Entry<SGES> {
    #[inline(always)]
    fn sges_mut(&mut self) -> &mut [Sge; SGES] {
        &mut self.sges
    }
    #[inline(always)]
    fn set_num_sge(&mut self, n: u8) {
        self.wr.num_sge = i32::from(n);
    }
    #[inline(always)]
    fn set_op(&mut self, op: SendOp, flags: SendFlags) {
        self.wr.send_flags = flags.bits();
        super::wr::set_send_op(op, &mut self.wr);
    }
}

/// Posts `entries` through `post` (the queue pair's `post_send` from its context's op
/// table) as one chain, linked where they lie, up to the first entry that names more
/// gather entries than it holds (reported with `EINVAL` once those before it are posted:
/// the library would read past its list); reports the index in `entries` of the one
/// refused. One entry, the usual post, is posted inline: no chain to walk.
///
/// # Safety
/// `qp` is live and `post` is its `post_send`; the caller upholds the provider trait's
/// contract on the memory the entries name.
#[inline(always)]
pub(super) unsafe fn post_entries<const SGES: usize>(
    qp: *mut ffi::ibv_qp,
    post: PostFn<ffi::ibv_send_wr>,
    entries: &mut [Entry<SGES>],
) -> Result<(), PostError<VerbsError>> {
    if let [e] = entries {
        if e.fits() {
            e.link(ptr::null_mut());
            let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
            // SAFETY: `post` is `qp`'s `post_send` (this function's contract); `e.wr` is one
            // request (`next` NULL) pointing at its own `num_sge <= SGES` gather entries
            // (`fits`), alive across the call; the memory they name is the caller's
            // contract; `bad` is a valid out-pointer.
            let ret = unsafe { post(qp, &mut e.wr, &mut bad) };
            return match ret {
                0 => Ok(()),
                ret => Err(PostError {
                    index: 0,
                    error: VerbsError::from_ret("ibv_post_send", ret),
                }),
            };
        }
    }
    // SAFETY: forwarded contract.
    unsafe { post_chain(qp, post, entries) }
}

/// [`post_entries`] of a chain (or of one malformed entry): one pass checks and links the
/// entries up to the first malformed one, which is reported once those are posted.
///
/// # Safety
/// As [`post_entries`].
#[inline(never)]
unsafe fn post_chain<const SGES: usize>(
    qp: *mut ffi::ibv_qp,
    post: PostFn<ffi::ibv_send_wr>,
    entries: &mut [Entry<SGES>],
) -> Result<(), PostError<VerbsError>> {
    let base = entries.as_mut_ptr();
    let mut len = entries.len();
    for (i, e) in entries.iter_mut().enumerate() {
        if !e.fits() {
            len = i;
            break;
        }
        // `wrapping_add` keeps this free of unsafe; the pointer stays inside `entries` (or
        // one past it, replaced by NULL below).
        e.link(base.wrapping_add(i + 1).cast::<ffi::ibv_send_wr>());
    }
    let malformed = (len < entries.len()).then(|| PostError {
        index: len,
        error: VerbsError::os("ibv_post_send", super::error::errno::EINVAL),
    });
    let Some(last) = len.checked_sub(1) else {
        return malformed.map_or(Ok(()), Err);
    };
    entries[last].wr.next = ptr::null_mut();
    // SAFETY: the first `len` entries are linked as `post_linked` needs: each to the next,
    // the last to NULL, each at its own gather list, which fits (`fits`).
    unsafe { post_linked(qp, post, &mut entries[..len]) }?;
    malformed.map_or(Ok(()), Err)
}

/// [`post_entries`] of a chain an earlier successful call of it (or of this) linked, where
/// it lies, with nothing but `wr_id`s written since (`linked`): posted as it is. Otherwise
/// as [`post_entries`].
///
/// # Safety
/// As [`post_entries`]; and `linked` only as said.
#[inline(always)]
pub(super) unsafe fn post_entries_linked<const SGES: usize>(
    qp: *mut ffi::ibv_qp,
    post: PostFn<ffi::ibv_send_wr>,
    entries: &mut [Entry<SGES>],
    linked: bool,
) -> Result<(), PostError<VerbsError>> {
    if linked && !entries.is_empty() {
        // SAFETY: a successful `post_entries` left every entry linked (each to the next,
        // the last to NULL, each at its own gather list, which fits), and nothing that
        // changes a link or a count was written since (this function's contract).
        return unsafe { post_linked(qp, post, entries) };
    }
    // SAFETY: forwarded contract.
    unsafe { post_entries(qp, post, entries) }
}

/// Posts `entries`, linked already, as one chain.
///
/// # Safety
/// As [`post_entries`]; and `entries` is not empty, each entry links to the next, the last
/// to NULL, and each points at its own gather entries, of which it counts at most `SGES`.
#[inline(always)]
unsafe fn post_linked<const SGES: usize>(
    qp: *mut ffi::ibv_qp,
    post: PostFn<ffi::ibv_send_wr>,
    entries: &mut [Entry<SGES>],
) -> Result<(), PostError<VerbsError>> {
    let base = entries.as_mut_ptr();
    let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
    // SAFETY: `post` is `qp`'s `post_send` (this function's contract). The chain is
    // `entries.len()` linked requests (an `Entry` starts with its `ibv_send_wr`: `repr(C)`),
    // each pointing at its own `num_sge <= SGES` gather entries, alive across the call; the
    // memory they name is the caller's contract; `bad` is a valid out-pointer.
    let ret = unsafe { post(qp, base.cast::<ffi::ibv_send_wr>(), &mut bad) };
    if ret != 0 {
        return Err(PostError {
            index: bad_index(base, bad.cast::<Entry<SGES>>(), entries.len()),
            error: VerbsError::from_ret("ibv_post_send", ret),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::vec::Vec;

    fn entry(id: u64, op: SendOp, n: u8) -> Entry<2> {
        let mut e = Entry::<2>::BLANK;
        e.set_wr_id(id);
        e.sges_mut()[0] = Sge {
            addr: 0x2000 + id,
            length: 8,
            lkey: 3,
        };
        e.set_num_sge(n);
        e.set_op(op, SendFlags::empty());
        e
    }

    /// An entry rebuilt for another operation holds that one's opcode, flags and
    /// operands, each where the library reads it for the opcode.
    #[test]
    fn an_entry_built_over_another_holds_the_operands_of_its_own() {
        let mut e = entry(
            1,
            SendOp::CompareSwap {
                remote_addr: 0x1000,
                rkey: 7,
                compare: 5,
                swap: 6,
            },
            1,
        );
        e.set_signaled(true);
        assert_eq!(e.opcode(), WcOpcode::CompareSwap);
        e.set_op(
            SendOp::WriteWithImm {
                remote_addr: 0x3000,
                rkey: 9,
                imm: 0x0102_0304,
            },
            SendFlags::FENCE,
        );
        assert_eq!(e.wr.opcode, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(e.wr.send_flags, SendFlags::FENCE.bits(), "flags replaced");
        assert_eq!(e.opcode(), WcOpcode::RdmaWrite);
        // SAFETY: the members `set_op` wrote.
        unsafe {
            assert_eq!(e.wr.__bindgen_anon_1.imm_data, 0x0102_0304u32.to_be());
            assert_eq!((e.wr.wr.rdma.remote_addr, e.wr.wr.rdma.rkey), (0x3000, 9));
        }
        e.set_op(
            SendOp::FetchAdd {
                remote_addr: 0x4000,
                rkey: 11,
                add: 3,
            },
            SendFlags::empty(),
        );
        assert_eq!(e.opcode(), WcOpcode::FetchAdd);
        // SAFETY: the atomic member `set_op` wrote, whole.
        unsafe {
            let a = e.wr.wr.atomic;
            assert_eq!((a.remote_addr, a.rkey, a.compare_add), (0x4000, 11, 3));
            assert_eq!(a.swap, 0, "a fetch-and-add swaps nothing");
        }
        e.set_op(SendOp::Send, SendFlags::SIGNALED | SendFlags::FENCE);
        assert_eq!(e.opcode(), WcOpcode::Send);
        e.set_signaled(false);
        assert_eq!(
            e.wr.send_flags,
            SendFlags::FENCE.bits(),
            "only the signal cleared"
        );
        assert_eq!(e.wr.opcode, ffi::ibv_wr_opcode::IBV_WR_SEND);
        // SAFETY: a plain integer of a union nothing writes.
        unsafe {
            assert_eq!(e.wr.qp_type.xrc.remote_srqn, 0, "XRC target never written");
        }
    }

    /// What the fake `post_send` saw of each request: its id, gather count, whether its
    /// gather list pointer is the entry's own, and whether `next` is the following entry.
    static SEEN: Mutex<Vec<(u64, i32)>> = Mutex::new(Vec::new());

    /// Walks the chain as the library would, checking each link, and refuses the second
    /// request if the first asks so (wr_id 100).
    unsafe extern "C" fn fake_post(
        _qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> i32 {
        let mut seen = SEEN.lock().unwrap();
        seen.clear();
        let mut p = wr;
        let refuse_second = unsafe { (*wr).wr_id } == 100;
        let mut i = 0;
        while !p.is_null() {
            // SAFETY: `post_entries` links live entries, each starting with its request.
            let e = unsafe { &*p.cast::<Entry<2>>() };
            assert_eq!(
                e.wr.sg_list,
                e.sges.as_ptr().cast::<ffi::ibv_sge>().cast_mut()
            );
            // SAFETY: `num_sge` entries of the list the request points at, as above.
            let sge = unsafe { *e.wr.sg_list };
            assert_eq!(sge.addr, 0x2000 + e.wr.wr_id);
            if refuse_second && i == 1 {
                // SAFETY: the out-pointer the caller passed.
                unsafe { *bad = p };
                return 12; // ENOMEM
            }
            seen.push((e.wr.wr_id, e.wr.num_sge));
            p = e.wr.next;
            i += 1;
        }
        0
    }

    #[test]
    fn entries_post_as_one_chain_linked_in_place() {
        let mut es = [
            entry(1, SendOp::Send, 1),
            entry(2, SendOp::Send, 1),
            entry(3, SendOp::Send, 2),
        ];
        // SAFETY: the fake verb reads only the entries and their gather lists.
        unsafe { post_entries(ptr::null_mut(), fake_post, &mut es) }.unwrap();
        assert_eq!(*SEEN.lock().unwrap(), [(1, 1), (2, 1), (3, 2)]);
        assert!(es[2].wr.next.is_null(), "the last ends the chain");

        // A refusal is reported at the request the library names.
        let mut es = [entry(100, SendOp::Send, 1), entry(101, SendOp::Send, 1)];
        // SAFETY: the fake verb reads only these entries and their gather lists.
        let e = unsafe { post_entries(ptr::null_mut(), fake_post, &mut es) }.unwrap_err();
        assert_eq!(e.index, 1);

        // A request naming more gather entries than it holds is cut off before the call
        // (the library would read past its list) and reported after the ones before it.
        let mut es = [
            entry(4, SendOp::Send, 1),
            entry(5, SendOp::Send, 3),
            entry(6, SendOp::Send, 1),
        ];
        // SAFETY: the fake verb reads only these entries and their gather lists.
        let e = unsafe { post_entries(ptr::null_mut(), fake_post, &mut es) }.unwrap_err();
        assert_eq!(e.index, 1);
        assert_eq!(*SEEN.lock().unwrap(), [(4, 1)]);

        // A chain posted again where it lies, `linked`, goes as it is: the links are not
        // written (one bent by hand shows it); moved and not `linked`, it is linked anew.
        let mut es = [
            entry(7, SendOp::Send, 1),
            entry(8, SendOp::Send, 1),
            entry(9, SendOp::Send, 1),
        ];
        // SAFETY: the fake verb reads only these entries and their gather lists.
        unsafe { post_entries_linked(ptr::null_mut(), fake_post, &mut es, false) }.unwrap();
        assert_eq!(*SEEN.lock().unwrap(), [(7, 1), (8, 1), (9, 1)]);
        es[0].wr.next = ptr::addr_of_mut!(es[2].wr);
        // SAFETY: as above; the entries are still linked, one past its neighbour.
        unsafe { post_entries_linked(ptr::null_mut(), fake_post, &mut es, true) }.unwrap();
        assert_eq!(*SEEN.lock().unwrap(), [(7, 1), (9, 1)], "posted as it lies");
        let mut moved = Box::new(es);
        // SAFETY: as above; not `linked`, so the stale links are rewritten first.
        unsafe { post_entries_linked(ptr::null_mut(), fake_post, &mut *moved, false) }.unwrap();
        assert_eq!(*SEEN.lock().unwrap(), [(7, 1), (8, 1), (9, 1)]);
    }
}
