//! Addresses, lengths and offsets from a peer or a user are not trusted arithmetic: every
//! sub-range computation is total over the full `u64` (and `usize`) range. `Ok` exactly
//! when the sub-range fits without overflow, with the exact address and length; otherwise a
//! `BoundsError`, never a panic (these tests run with overflow checks on in debug) and never
//! a wrapped address. Through the public API; the simulator part needs feature `sim`.

use std::ops::Bound;

use proptest::prelude::*;
use zverbs::{BoundsError, RemoteRegion};

/// Values spread over the whole range, with the edges (0, `u64::MAX`, 2^32) often.
fn edgy_u64() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        any::<u64>(),
        0..64u64,
        (0..64u64).prop_map(|d| u64::MAX - d),
        (0..64u64).prop_map(|d| (1u64 << 32) - 32 + d),
        (0..64u64).prop_map(|d| (1u64 << 63) - 32 + d),
    ]
}

fn bound(v: impl Strategy<Value = u64> + Clone) -> impl Strategy<Value = Bound<u64>> {
    prop_oneof![
        v.clone().prop_map(Bound::Included),
        v.prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

/// The sub-range `(start, end)` of a region of `len` bytes that `range` names, computed
/// without any possibility of overflow; `None` if it is not a range inside `0..len`.
fn model(range: (Bound<u64>, Bound<u64>), len: u64) -> Option<(u128, u128)> {
    let start = match range.0 {
        Bound::Included(s) => u128::from(s),
        Bound::Excluded(s) => u128::from(s) + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.1 {
        Bound::Included(e) => u128::from(e) + 1,
        Bound::Excluded(e) => u128::from(e),
        Bound::Unbounded => u128::from(len),
    };
    (start <= end && end <= u128::from(len)).then_some((start, end))
}

/// A refused range is a typed `BoundsError` (the signature says so) whose report is
/// itself total.
fn check_error(e: &BoundsError) {
    let _ = e.to_string();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// `RemoteRegion::slice` over every field value and every bound form.
    #[test]
    fn remote_slice_is_total_and_exact(
        addr in edgy_u64(),
        len in edgy_u64(),
        rkey: u32,
        start in bound(edgy_u64()),
        end in bound(edgy_u64()),
    ) {
        let r = RemoteRegion { addr, len, rkey };
        let fits = model((start, end), len)
            .filter(|&(_, e)| u128::from(addr) + e <= u128::from(u64::MAX));
        match (r.slice((start, end)), fits) {
            (Ok(s), Some((off, e))) => {
                prop_assert_eq!(u128::from(s.addr), u128::from(addr) + off);
                prop_assert_eq!(u128::from(s.len), e - off);
                prop_assert_eq!(s.rkey, rkey);
                // And the result's own addresses never wrap.
                prop_assert!(s.addr.checked_add(s.len).is_some());
            }
            (Err(e), None) => check_error(&e),
            (got, want) => prop_assert!(false, "slice gave {got:?}, model {want:?}"),
        }
    }

    /// Offset-and-length sub-ranges near the top of the address space: slicing
    /// `off..off + sub` (as a caller with an offset and a length from the wire would).
    #[test]
    fn remote_offset_and_length(
        addr in edgy_u64(),
        len in edgy_u64(),
        off in edgy_u64(),
        sub in edgy_u64(),
    ) {
        let r = RemoteRegion { addr, len, rkey: 1 };
        let Some(end) = off.checked_add(sub) else {
            // The caller's own sum overflows; the region cannot hold it either.
            prop_assert!(r.slice(off..).and_then(|s| s.slice(..sub)).is_err());
            return Ok(());
        };
        let fits = end <= len && addr.checked_add(end).is_some();
        match r.slice(off..end) {
            Ok(s) => {
                prop_assert!(fits);
                prop_assert_eq!((s.addr, s.len), (addr + off, sub));
            }
            Err(_) => prop_assert!(!fits),
        }
        // Nested slicing agrees with slicing in one step, for a region that does not
        // itself wrap (one that does refuses `off..`, its own end being past u64::MAX).
        let nested = r.slice(off..).and_then(|s| s.slice(..sub));
        if addr.checked_add(len).is_some() {
            prop_assert_eq!(nested.is_ok(), fits);
        } else {
            prop_assert!(nested.is_err());
        }
        if let Ok(s) = nested {
            prop_assert_eq!((s.addr, s.len), (addr + off, sub));
        }
    }
}

#[test]
fn remote_slice_edges() {
    let top = RemoteRegion {
        addr: u64::MAX - 8,
        len: u64::MAX,
        rkey: 5,
    };
    // Usable up to the end of the address space, and not a byte further.
    let s = top.slice(..8).unwrap();
    assert_eq!((s.addr, s.len), (u64::MAX - 8, 8));
    assert_eq!(top.slice(8..8).unwrap().len, 0);
    let e = top.slice(..9).unwrap_err();
    assert_eq!((e.offset, e.len, e.region_len), (0, 9, 8));
    assert!(top.slice(9..).is_err());
    assert!(top.slice(..).is_err(), "the region as stated wraps");
    assert!(top.slice(8..).is_err());
    assert!(top.slice(..=u64::MAX).is_err());
    let all = RemoteRegion {
        addr: 0,
        len: u64::MAX,
        rkey: 5,
    };
    assert!(all.slice(0..=u64::MAX).is_err(), "2^64 bytes do not fit");
    assert_eq!(all.slice(0..=u64::MAX - 1).unwrap().len, u64::MAX);
    let past = (Bound::Excluded(u64::MAX), Bound::Unbounded);
    assert!(all.slice(past).is_err(), "a start past u64::MAX");
    assert_eq!(all.slice(u64::MAX..).unwrap().len, 0);
}

#[cfg(feature = "sim")]
mod sim {
    use std::ops::Bound;

    use proptest::prelude::*;
    use zverbs::provider::sim::Sim;
    use zverbs::{Context, Error, RemoteRegion, SendFlags, SendOp, WcStatus};

    fn usize_edgy() -> impl Strategy<Value = usize> + Clone {
        prop_oneof![
            any::<usize>(),
            0..80usize,
            (0..8usize).prop_map(|d| usize::MAX - d),
            (0..8usize).prop_map(|d| (u32::MAX as usize).wrapping_add(d).wrapping_sub(4)),
        ]
    }

    fn bound(v: impl Strategy<Value = usize> + Clone) -> impl Strategy<Value = Bound<usize>> {
        prop_oneof![
            v.clone().prop_map(Bound::Included),
            v.prop_map(Bound::Excluded),
            Just(Bound::Unbounded),
        ]
    }

    fn model(range: (Bound<usize>, Bound<usize>), len: usize) -> Option<(usize, usize)> {
        let to = |b: Bound<usize>| b.map(|v| v as u64);
        super::model((to(range.0), to(range.1)), len as u64)
            .map(|(s, e)| (s as usize, (e - s) as usize))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// `MemoryRegion::slice` / `slice_mut` and `split_at` of both local slice types,
        /// over every `usize` bound and split point.
        #[test]
        fn local_slices_are_total_and_exact(
            start in bound(usize_edgy()),
            end in bound(usize_edgy()),
            mid in usize_edgy(),
        ) {
            let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let mut buf = [0u8; 64];
            let mut mr = pd.register(&mut buf).unwrap();
            let base = mr.as_slice().as_ptr() as u64;
            let want = model((start, end), 64);

            let got = mr.slice((start, end));
            prop_assert_eq!(got.is_ok(), want.is_some(), "{:?}", got);
            if let (Ok(s), Some((off, len))) = (got, want) {
                prop_assert_eq!((s.sge().addr, s.len()), (base + off as u64, len));
                match s.split_at(mid) {
                    Ok((h, t)) => {
                        prop_assert!(mid <= len);
                        prop_assert_eq!((h.sge().addr, h.len()), (base + off as u64, mid));
                        prop_assert_eq!(
                            (t.sge().addr, t.len()),
                            (base + (off + mid) as u64, len - mid)
                        );
                    }
                    Err(e) => {
                        prop_assert!(mid > len);
                        prop_assert_eq!(e.region_len, len as u64);
                    }
                }
            }

            let got = mr.slice_mut((start, end));
            prop_assert_eq!(got.is_ok(), want.is_some());
            if let (Ok(s), Some((off, len))) = (got, want) {
                prop_assert_eq!((s.sge().addr, s.len()), (base + off as u64, len));
                match s.split_at(mid) {
                    Ok((h, t)) => {
                        prop_assert!(mid <= len);
                        prop_assert_eq!(h.len(), mid);
                        prop_assert_eq!(
                            (t.sge().addr, t.len()),
                            (base + (off + mid) as u64, len - mid)
                        );
                    }
                    Err(_) => prop_assert!(mid > len),
                }
            }
        }
    }

    /// A work request whose `num_sge` exceeds its own list (`S`) is refused at post time
    /// with `EINVAL`, after the requests before it, even when the queue pair's SGE limit
    /// would allow that many: nothing reads past the list, nothing panics.
    #[test]
    fn num_sge_past_the_list_is_refused_not_a_panic() {
        use zverbs::{
            ErrorKind, ProviderError, QpCaps, RecvWr, SendFlags, SendOp, SendWr, WorkCompletion,
        };
        let caps = QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 0,
        };
        let zverbs::testing::Loopback { qp, cq, pd, .. } =
            zverbs::testing::Loopback::new(caps, 16).unwrap();
        let mut buf = [0u8; 32];
        let all = zverbs::AccessFlags::all();
        // SAFETY: the loop-back writes finish (polled below) before `buf` is dropped.
        let mr = unsafe { pd.register_with_access(&mut buf, all) }.unwrap();
        let sge = mr.slice(..4).unwrap().sge();
        for bad in [2u8, u8::MAX] {
            let mut wrs = [SendWr::<1>::new(
                0,
                SendOp::Write {
                    remote_addr: sge.addr + 16,
                    rkey: mr.rkey(),
                },
                SendFlags::SIGNALED,
            ); 3];
            for (i, wr) in wrs.iter_mut().enumerate() {
                (wr.wr_id, wr.sg_list[0], wr.num_sge) = (i as u64, sge, 1);
            }
            wrs[1].num_sge = bad;
            assert!(!wrs[1].sges_fit() && wrs[1].sges().len() == 1);
            // SAFETY: the writes stay inside `buf`.
            let e = unsafe { qp.post_send(&wrs) }.unwrap_err();
            assert_eq!((e.index, e.error.kind()), (1, ErrorKind::InvalidArgument));
            let mut wcs = [WorkCompletion::EMPTY; 4];
            assert_eq!(cq.poll(&mut wcs).unwrap(), 1, "the request before it ran");
            assert_eq!((wcs[0].wr_id, wcs[0].status), (0, WcStatus::Success));

            let mut rwr = RecvWr::<1>::new(7);
            (rwr.sg_list[0], rwr.num_sge) = (sge, bad);
            // SAFETY: refused, so never touches `buf`.
            let e = unsafe { qp.post_recv(&[rwr]) }.unwrap_err();
            assert_eq!((e.index, e.error.kind()), (0, ErrorKind::InvalidArgument));
        }
    }

    fn status<E: core::fmt::Debug>(e: &Error<E>) -> WcStatus {
        match e {
            Error::Completion(c) => c.status,
            e => panic!("not a completion error: {e:?}"),
        }
    }

    /// Remote ranges whose end wraps past `u64::MAX`: the channel's blocking calls refuse
    /// them before posting (`OutOfBounds`, nothing in flight), and the same requests posted
    /// unpolled reach the responder's memory check, which refuses them with
    /// `REM_ACCESS_ERR` (no panic, no wrapped access).
    #[test]
    fn wrapping_remote_ranges_are_refused_and_the_responder_checks_too() {
        #[derive(Debug, Clone, Copy)]
        enum Op {
            Write,
            /// A write whose wrapped end lands inside the real region.
            WriteWrapsIntoRegion,
            Read,
            FetchAdd,
        }
        for op in [Op::Write, Op::WriteWrapsIntoRegion, Op::Read, Op::FetchAdd] {
            let (mut a, b) = super::common::default_pair();
            let mut local = [5u8; 16];
            let mut local_mr = a.pd.register(&mut local).unwrap();
            let mut target = [9u8; 32];
            let all = zverbs::AccessFlags::all();
            // SAFETY: read only after the operation failed.
            let target_mr = unsafe { b.pd.register_with_access(&mut target, all) }.unwrap();
            let real = target_mr.remote();
            // The last 8-aligned word of the address space, 16 bytes long.
            let mut hostile = RemoteRegion {
                addr: u64::MAX - 7,
                len: 16,
                rkey: real.rkey,
            };
            let write = SendOp::Write {
                remote_addr: hostile.addr,
                rkey: real.rkey,
            };
            let (refused, op_code, sge) = match op {
                Op::Write => (
                    a.ch.write([local_mr.slice(..).unwrap()], &hostile),
                    write,
                    local_mr.slice(..).unwrap().sge(),
                ),
                Op::WriteWrapsIntoRegion => {
                    hostile.len = real.addr + 16; // addr + len wraps to real.addr + 8
                    (
                        a.ch.write([local_mr.slice(..).unwrap()], &hostile),
                        write,
                        local_mr.slice(..).unwrap().sge(),
                    )
                }
                Op::Read => (
                    a.ch.read([local_mr.slice_mut(..).unwrap()], &hostile),
                    SendOp::Read {
                        remote_addr: hostile.addr,
                        rkey: real.rkey,
                    },
                    local_mr.slice_mut(..).unwrap().sge(),
                ),
                Op::FetchAdd => {
                    // Its bytes end at 2^64.
                    let word = RemoteRegion { len: 8, ..hostile };
                    assert!(hostile.slice(..8).is_err());
                    let r = a.ch.fetch_add(local_mr.slice_mut(..8).unwrap(), &word, 1);
                    let op = SendOp::FetchAdd {
                        remote_addr: word.addr,
                        rkey: real.rkey,
                        add: 1,
                    };
                    (r.map(drop), op, local_mr.slice_mut(..8).unwrap().sge())
                }
            };
            let e = refused.unwrap_err();
            assert!(matches!(e, Error::OutOfBounds(_)), "{op:?}: {e}");
            assert_eq!(a.ch.in_flight(), (0, 0), "{op:?}: refused before posting");
            // SAFETY: `local` and `target` outlive the wait below.
            let p = unsafe { a.ch.post_send_unpolled(&[sge], op_code, SendFlags::empty()) };
            let e = a.ch.wait(p.unwrap()).unwrap_err();
            assert_eq!(status(&e), WcStatus::RemAccessErr, "{op:?}: {e}");
            assert_eq!(target_mr.as_slice(), &[9; 32], "{op:?}: remote untouched");
            assert_eq!(local_mr.as_slice(), &[5; 16], "{op:?}: local untouched");
        }
    }
}

#[cfg(feature = "sim")]
mod common;
