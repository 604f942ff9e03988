//! Work requests in the verbs library's layout, built from ours and linked into chains,
//! one doorbell per chain ([`post_chains`]): the backend's post path.

use core::mem::MaybeUninit;
use core::ptr;

use ibverbs_sys as ffi;

use super::error::{self, VerbsError};
use super::{wr, PostFn};
use crate::provider::PostError;
use crate::types::{RecvWr, SendWr};

/// Work requests linked per doorbell; longer slices are posted in chunks of this size.
const CHAIN: usize = 32;

/// A work request of the verbs library made from one of ours (`W`), linked to the next,
/// and the queue pair's verb that posts a chain of them.
pub(super) trait Chained<W>: Default {
    /// The verb's name, for errors.
    const VERB: &'static str;
    /// Whether `w` names no more entries than its list holds.
    fn fits(w: &W) -> bool;
    /// `w` as the library's request (its SGE pointer borrows `w`).
    fn fill(w: &W, out: &mut Self);
    fn set_next(&mut self, next: *mut Self);
}

impl<const SGES: usize> Chained<SendWr<SGES>> for ffi::ibv_send_wr {
    const VERB: &'static str = "ibv_post_send";
    fn fits(w: &SendWr<SGES>) -> bool {
        w.sges_fit()
    }
    fn fill(w: &SendWr<SGES>, out: &mut Self) {
        wr::send_wr(w, out);
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl<const SGES: usize> Chained<RecvWr<SGES>> for ffi::ibv_recv_wr {
    const VERB: &'static str = "ibv_post_recv";
    fn fits(w: &RecvWr<SGES>) -> bool {
        w.sges_fit()
    }
    fn fill(w: &RecvWr<SGES>, out: &mut Self) {
        wr::recv_wr(w, out);
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Posts `wrs` through `post` (a queue pair's or an SRQ's verb from its context's op table,
/// `ibv_post_send` being `qp->context->ops.post_send`) to `target` in linked chains of at most [`CHAIN`], one
/// doorbell each, after the requests that name more entries than they hold are cut off
/// ([`well_formed`]); stops at the first refusal and reports its index in `wrs`.
///
/// # Safety
/// `target` is live and `post` is its verb for requests `C`; the caller upholds the
/// provider trait's contract on the memory `wrs` name.
pub(super) unsafe fn post_chains<W, C: Chained<W>, T>(
    target: *mut T,
    post: PostFn<C, T>,
    wrs: &[W],
) -> Result<(), PostError<VerbsError>> {
    // One request, the usual post: built where the library reads it, no chain to link.
    if let [w] = wrs {
        if C::fits(w) {
            let mut c = C::default();
            C::fill(w, &mut c);
            let mut bad: *mut C = ptr::null_mut();
            // SAFETY: as below, for a chain of one (`default` zeroes `next`; `fill` leaves it).
            let ret = unsafe { post(target, &mut c, &mut bad) };
            return match ret {
                0 => Ok(()),
                ret => Err(PostError {
                    index: 0,
                    error: VerbsError::from_ret(C::VERB, ret),
                }),
            };
        }
    }
    let (wrs, malformed) = well_formed(wrs, C::fits, C::VERB);
    let mut chain: [MaybeUninit<C>; CHAIN] = [const { MaybeUninit::uninit() }; CHAIN];
    for (c, batch) in wrs.chunks(CHAIN).enumerate() {
        let base = link(&mut chain, batch, C::fill, C::set_next);
        let mut bad: *mut C = ptr::null_mut();
        // SAFETY: `post` is `target`'s verb for `C` (this function's contract). The chain is
        // `batch.len()` linked, fully initialised requests in `chain` (alive across the
        // call) whose SGE pointers borrow `batch`, memory the caller vouches for; `bad` is
        // a valid out-pointer.
        let ret = unsafe { post(target, base, &mut bad) };
        if ret != 0 {
            return Err(PostError {
                index: c * CHAIN + bad_index(base, bad, batch.len()),
                error: VerbsError::from_ret(C::VERB, ret),
            });
        }
    }
    malformed.map_or(Ok(()), Err)
}

/// Splits `wrs` before the first request whose `num_sge` exceeds its own list (`!fits`):
/// the requests to post, and the `EINVAL` to report for that one once they are posted.
/// The verbs library would read such a list past its end.
fn well_formed<'a, W>(
    wrs: &'a [W],
    fits: impl Fn(&W) -> bool,
    verb: &'static str,
) -> (&'a [W], Option<PostError<VerbsError>>) {
    match wrs.iter().position(|w| !fits(w)) {
        None => (wrs, None),
        Some(index) => (
            &wrs[..index],
            Some(PostError {
                index,
                error: VerbsError::os(verb, error::errno::EINVAL),
            }),
        ),
    }
}

/// Fills the first `wrs.len()` slots of `chain` from `wrs`, links each to the next (the
/// last to NULL) and returns the head. Only those slots are initialised, each zeroed and
/// filled where it lies (no copy of a request built elsewhere). One zeroing per request,
/// not one for the chain: a chain-long `memset` takes `rep stosb`, which callgrind counts
/// byte by byte (4 KB for 32 sends).
fn link<W, C: Default>(
    chain: &mut [MaybeUninit<C>],
    wrs: &[W],
    fill: impl Fn(&W, &mut C),
    set_next: impl Fn(&mut C, *mut C),
) -> *mut C {
    let base = chain.as_mut_ptr().cast::<C>();
    for (i, (slot, w)) in chain.iter_mut().zip(wrs).enumerate() {
        let c = slot.write(C::default());
        fill(w, c);
        // `wrapping_add` keeps this free of unsafe; the pointer stays inside `chain`.
        let next = if i + 1 < wrs.len() {
            base.wrapping_add(i + 1)
        } else {
            ptr::null_mut()
        };
        set_next(c, next);
    }
    base
}

/// The position of `bad` in the chain of `len` requests at `base`; 0 (nothing known to be
/// posted) if the library did not point into the chain.
pub(super) fn bad_index<C>(base: *mut C, bad: *mut C, len: usize) -> usize {
    let (b, p) = (base as usize, bad as usize);
    let size = core::mem::size_of::<C>();
    if bad.is_null() || p < b || (p - b) % size != 0 || (p - b) / size >= len {
        0
    } else {
        (p - b) / size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{SendFlags, SendOp, Sge};

    fn write(id: u64, len: u32) -> SendWr<2> {
        let mut w = SendWr::<2>::new(
            id,
            SendOp::Write {
                remote_addr: 0x1000 + id,
                rkey: 7,
            },
            SendFlags::empty(),
        );
        w.sg_list[0] = Sge {
            addr: 0x2000,
            length: len,
            lkey: 3,
        };
        w.num_sge = 1;
        w
    }

    /// A chain built over slots that held other bytes: each request is what its source
    /// says and nothing else (the rest zero), linked in order, the last to NULL, and the
    /// slots past the chain are untouched.
    #[test]
    fn a_chain_is_built_in_place_over_stale_slots() {
        let wrs = [write(1, 8), write(2, 16), write(3, 24)];
        let mut chain = [const { MaybeUninit::<ffi::ibv_send_wr>::uninit() }; 4];
        for slot in &mut chain {
            // SAFETY: a slot is plain bytes; 0xA5 fills them with stale data.
            unsafe { ptr::write_bytes(slot.as_mut_ptr(), 0xA5, 1) };
        }
        let base = link(
            &mut chain,
            &wrs,
            <ffi::ibv_send_wr as Chained<SendWr<2>>>::fill,
            <ffi::ibv_send_wr as Chained<SendWr<2>>>::set_next,
        );
        assert_eq!(base, chain.as_mut_ptr().cast());
        for (i, w) in wrs.iter().enumerate() {
            // SAFETY: `link` initialised the first three slots.
            let c = unsafe { chain[i].assume_init_ref() };
            assert_eq!(c.wr_id, w.wr_id);
            assert_eq!(c.num_sge, 1);
            assert_eq!(c.opcode, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
            assert_eq!(c.send_flags, 0);
            // SAFETY: a write's member of the union, and two members the write leaves zero.
            unsafe {
                assert_eq!(c.wr.rdma.remote_addr, 0x1000 + w.wr_id);
                assert_eq!(c.wr.rdma.rkey, 7);
                assert_eq!(c.__bindgen_anon_1.imm_data, 0, "no stale immediate");
                assert_eq!(c.qp_type.xrc.remote_srqn, 0, "no stale XRC target");
            }
            let next = if i + 1 < wrs.len() {
                base.wrapping_add(i + 1)
            } else {
                ptr::null_mut()
            };
            assert_eq!(c.next, next);
        }
        // SAFETY: the fourth slot still holds the stale bytes written above.
        let past = unsafe { chain[3].assume_init_ref() };
        assert_eq!(
            past.wr_id, 0xA5A5_A5A5_A5A5_A5A5,
            "past the chain: untouched"
        );
    }

    #[test]
    fn bad_index_points_into_the_chain_or_is_zero() {
        let mut chain = [const { MaybeUninit::<ffi::ibv_recv_wr>::uninit() }; 4];
        let base = chain.as_mut_ptr().cast::<ffi::ibv_recv_wr>();
        assert_eq!(bad_index(base, base.wrapping_add(2), 3), 2);
        assert_eq!(
            bad_index(base, base.wrapping_add(3), 3),
            0,
            "past the chain"
        );
        assert_eq!(bad_index(base, ptr::null_mut(), 3), 0);
        let odd = (base as usize + 1) as *mut ffi::ibv_recv_wr;
        assert_eq!(bad_index(base, odd, 3), 0, "not at a request");
    }
}
