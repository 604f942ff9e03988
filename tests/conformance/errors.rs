//! Error-path scenarios: bad local and remote keys, missing rights, bounds, short
//! receives, flush on error, posting in the error state, RNR exhaustion; and (in
//! [`expected`]) the outcome the verbs specification requires of each.
//!
//! Side A is the requester, side B the responder. wr_ids: A's sends 1.., A's receives
//! 11.., B's receives 101...

use super::scenarios::*;
use super::*;
use zverbs::ProviderError;

/// A send whose gather entry is `bad(sge)`; B has a receive posted.
fn bad_local<E: Env>(env: &E, bad: impl Fn(Sge) -> Sge) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?;
    let src = filled(&a.pd, 32, LW, 1)?;
    let dst = region(&b.pd, 64, LW, 0xEE)?;
    // SAFETY: leaked regions; the bad entry is rejected by the device, never dereferenced
    // outside registered memory.
    unsafe {
        post_recv(&b, &[rwr(101, &[sge(&dst, 0, 64)])])?;
        post_send(&a, &[swr(1, SendOp::Send, SIG, &[bad(sge(&src, 0, 32))])])?;
    }
    let aw = wait(env, &a.scq, 1)?;
    let bw = settle(env, &b.rcq)?;
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .state("a.state", &a)
        .wcs("b", &bw)
        .state("b.state", &b);
    Ok(o)
}

pub fn loc_prot_bad_lkey<E: Env>(env: &E) -> Run<Outcome> {
    bad_local(env, |s| Sge {
        lkey: bad_key(s.lkey),
        ..s
    })
}

pub fn loc_prot_out_of_bounds<E: Env>(env: &E) -> Run<Outcome> {
    bad_local(env, |s| Sge { length: 64, ..s })
}

/// One operation from A against B's region (`b_access`, 64 bytes); reports both sides.
fn bad_remote<E: Env>(
    env: &E,
    o: &PairOptions,
    b_access: AccessFlags,
    op: impl Fn(RemoteOf) -> SendOp,
    len: usize,
    b_recv: bool,
) -> Run<Outcome> {
    let (a, b, local, remote) = one_sided(env, o, b_access, 64, 64)?;
    let r = remote.remote();
    let wr = swr(
        1,
        op(RemoteOf {
            addr: r.addr,
            rkey: r.rkey,
        }),
        SIG,
        &[sge(&local, 0, len)],
    );
    let mut out = Outcome::default();
    // SAFETY: leaked regions, read only after completion.
    unsafe {
        if b_recv {
            post_recv(&b, &[rwr(101, &[])])?;
        }
        // A provider may reject the request at post time (rxe: misaligned atomics).
        if let Err(e) = a.qp.post_send(&[wr]) {
            out.item("post_send", format_args!("{:?}", e.error.kind()));
            return Ok(out.state("a.state", &a).clone());
        }
    }
    let aw = wait(env, &a.scq, 1)?;
    let bw = if b_recv {
        wait(env, &b.rcq, 1)?
    } else {
        settle(env, &b.rcq)?
    };
    out.wcs("a", &aw)
        .state("a.state", &a)
        .wcs("b", &bw)
        .state("b.state", &b)
        .check("remote_untouched", remote.as_slice() == &pattern(64, 2)[..]);
    Ok(out)
}

/// B's region as A sees it.
#[derive(Clone, Copy)]
pub struct RemoteOf {
    addr: u64,
    rkey: u32,
}

fn write_to(addr: u64, rkey: u32) -> SendOp {
    SendOp::Write {
        remote_addr: addr,
        rkey,
    }
}

pub fn rem_access_bad_rkey<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions::default();
    bad_remote(
        env,
        &o,
        RW,
        |r| write_to(r.addr, bad_key(r.rkey)),
        32,
        false,
    )
}

pub fn rem_access_no_remote_write<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions::default();
    bad_remote(env, &o, RR, |r| write_to(r.addr, r.rkey), 32, false)
}

pub fn rem_access_no_remote_read<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions::default();
    let read = |r: RemoteOf| SendOp::Read {
        remote_addr: r.addr,
        rkey: r.rkey,
    };
    bad_remote(env, &o, RW, read, 32, false)
}

pub fn rem_access_write_out_of_bounds<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions::default();
    bad_remote(env, &o, RW, |r| write_to(r.addr + 48, r.rkey), 32, false)
}

pub fn rem_write_imm_bad_rkey<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions::default();
    let op = |r: RemoteOf| SendOp::WriteWithImm {
        remote_addr: r.addr,
        rkey: bad_key(r.rkey),
        imm: 7,
    };
    bad_remote(env, &o, RW, op, 32, true)
}

pub fn rem_qp_no_remote_write<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions {
        b_access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..PairOptions::default()
    };
    bad_remote(env, &o, RW, |r| write_to(r.addr, r.rkey), 32, false)
}

pub fn rem_atomic_misaligned<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions::default();
    let op = |r: RemoteOf| SendOp::FetchAdd {
        remote_addr: r.addr + 4,
        rkey: r.rkey,
        add: 1,
    };
    bad_remote(env, &o, RA, op, 8, false)
}

pub fn loc_len_short_recv<E: Env>(env: &E) -> Run<Outcome> {
    two_sided(env, SendOp::Send, 64, 16)
}

pub fn flush_after_error<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?;
    let src = filled(&a.pd, 32, LW, 1)?;
    let (ra, rb) = (region(&a.pd, 64, LW, 0)?, region(&b.pd, 64, LW, 0)?);
    let good = sge(&src, 0, 16);
    // Past the end of the region: LOC_PROT_ERR everywhere (rxe reports a bad lkey otherwise).
    let bad = Sge { length: 64, ..good };
    // The first send fails; the unsignaled and the signaled one after it must both be
    // flushed, in order, as must A's receives.
    let sends = [
        swr(1, SendOp::Send, SIG, &[bad]),
        swr(2, SendOp::Send, NONE, &[good]),
        swr(3, SendOp::Send, SIG, &[good]),
    ];
    // SAFETY: leaked regions, read only after completion.
    unsafe {
        post_recv(
            &a,
            &[rwr(11, &[sge(&ra, 0, 32)]), rwr(12, &[sge(&ra, 32, 32)])],
        )?;
        post_recv(
            &b,
            &[rwr(101, &[sge(&rb, 0, 32)]), rwr(102, &[sge(&rb, 32, 32)])],
        )?;
        post_send(&a, &sends)?;
    }
    let (asw, arw) = (wait(env, &a.scq, 3)?, wait(env, &a.rcq, 2)?);
    let bw = settle(env, &b.rcq)?;
    let mut o = Outcome::default();
    o.wcs("a.send", &asw)
        .wcs("a.recv", &arw)
        .state("a.state", &a)
        .wcs("b", &bw)
        .state("b.state", &b);
    Ok(o)
}

pub fn flush_on_modify_err<E: Env>(env: &E) -> Run<Outcome> {
    let (a, _b) = pair(env, &PairOptions::default())?;
    let ra = region(&a.pd, 48, LW, 0)?;
    let recvs: Vec<_> = (0..3)
        .map(|i| rwr(11 + i as u64, &[sge(&ra, 16 * i, 16)]))
        .collect();
    // SAFETY: leaked region.
    unsafe { post_recv(&a, &recvs)? };
    a.qp.set_error()
        .map_err(|e| format!("modify to ERR: {e}"))?;
    let arw = wait(env, &a.rcq, 3)?;
    let mut o = Outcome::default();
    o.wcs("a.recv", &arw).state("a.state", &a);
    Ok(o)
}

pub fn post_after_error<E: Env>(env: &E) -> Run<Outcome> {
    let (a, _b) = pair(env, &PairOptions::default())?;
    let src = filled(&a.pd, 16, LW, 1)?;
    a.qp.set_error()
        .map_err(|e| format!("modify to ERR: {e}"))?;
    // SAFETY: leaked region.
    let posted = unsafe { post_send(&a, &[swr(1, SendOp::Send, SIG, &[sge(&src, 0, 16)])]) };
    let mut o = Outcome::default();
    o.item("post_send", if posted.is_ok() { "ok" } else { "error" });
    let asw = wait(env, &a.scq, 1)?;
    o.wcs("a.send", &asw).state("a.state", &a);
    Ok(o)
}

pub fn rnr_retry_exceeded<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions {
        a_rnr_retry: 1,
        b_min_rnr_timer: 1,
        ..PairOptions::default()
    };
    let (a, b) = pair(env, &o)?;
    let src = filled(&a.pd, 16, LW, 1)?;
    // SAFETY: leaked region. B has no receive posted.
    unsafe { post_send(&a, &[swr(1, SendOp::Send, SIG, &[sge(&src, 0, 16)])])? };
    let aw = wait(env, &a.scq, 1)?;
    let bw = settle(env, &b.rcq)?;
    let mut out = Outcome::default();
    out.wcs("a", &aw)
        .state("a.state", &a)
        .wcs("b", &bw)
        .state("b.state", &b);
    Ok(out)
}

/// What the verbs specification requires of each error scenario.
/// What the responder's owner learns of an error no receive of B's can carry (IBA
/// C9-222.1.1: an RDMA write without immediate data, a read, an atomic): an affiliated
/// asynchronous error naming B's queue pair. `access`: a write past B's region
/// (`QP_ACCESS_ERR`); `request`: a write to a queue pair that accepts none
/// (`QP_REQ_ERR`); `write_imm`: a write with immediate data past the region, which B's
/// receive reports instead (no event).
pub fn responder_error_events<E: Env>(env: &E) -> Run<Outcome> {
    let no_write = PairOptions {
        b_access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        ..PairOptions::default()
    };
    let past_end = |r: RemoteOf| write_to(r.addr + 48, r.rkey);
    let imm_past_end = |r: RemoteOf| SendOp::WriteWithImm {
        remote_addr: r.addr + 48,
        rkey: r.rkey,
        imm: 7,
    };
    let mut o = Outcome::default();
    o.item(
        "access",
        affiliated(env, &PairOptions::default(), past_end, false)?,
    )
    .item("request", affiliated(env, &no_write, past_end, false)?)
    .item(
        "write_imm",
        affiliated(env, &PairOptions::default(), imm_past_end, true)?,
    );
    Ok(o)
}

/// The first asynchronous event B's context gets within [`LATE`] of A's failed request
/// `op` (32 bytes at B's 64-byte region), as `KIND(b)` when it names B's queue pair.
fn affiliated<E: Env>(
    env: &E,
    o: &PairOptions,
    op: impl Fn(RemoteOf) -> SendOp,
    b_recv: bool,
) -> Run<String> {
    const LATE: Duration = Duration::from_millis(200);
    let (a, b, local, remote) = one_sided(env, o, RW, 64, 64)?;
    while b
        .ctx
        .next_async_event()
        .map_err(err("async event"))?
        .is_some()
    {}
    let r = remote.remote();
    let wr = swr(
        1,
        op(RemoteOf {
            addr: r.addr,
            rkey: r.rkey,
        }),
        SIG,
        &[sge(&local, 0, 32)],
    );
    // SAFETY: leaked regions, read only after completion.
    unsafe {
        if b_recv {
            post_recv(&b, &[rwr(101, &[])])?;
        }
        post_send(&a, &[wr])?;
    }
    wait(env, &a.scq, 1)?;
    let ev = b.ctx.wait_async_event(Some(LATE));
    Ok(match ev.map_err(err("async event"))? {
        None => "none".into(),
        Some(ev) => {
            let names_b = ev.element == zverbs::EventElement::Qp(b.qp.qp_num());
            format!("{:?}{}", ev.kind, if names_b { "(b)" } else { "" })
        }
    })
}

pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const responder_error_events: &str =
        "access=QpAccessErr(b); request=QpReqErr(b); write_imm=none";
    pub const loc_prot_bad_lkey: &str =
        "a=[1:LOC_PROT_ERR]; a.state=Error; b=[]; b.state=ReadyToSend";
    pub const loc_prot_out_of_bounds: &str = loc_prot_bad_lkey;
    // Remote access and invalid-request errors are responder class C errors: NAK, and the
    // responder's queue pair enters the error state too (rxe: `do_class_ac_error`).
    pub const rem_access_bad_rkey: &str = "a=[1:REM_ACCESS_ERR]; a.state=Error; b=[]; \
         b.state=Error; remote_untouched=ok";
    pub const rem_access_no_remote_write: &str = rem_access_bad_rkey;
    pub const rem_access_no_remote_read: &str = rem_access_bad_rkey;
    pub const rem_access_write_out_of_bounds: &str = rem_access_bad_rkey;
    pub const rem_write_imm_bad_rkey: &str = "a=[1:REM_ACCESS_ERR]; a.state=Error; \
         b=[101:LOC_ACCESS_ERR]; b.state=Error; remote_untouched=ok";
    pub const rem_qp_no_remote_write: &str = "a=[1:REM_INV_REQ_ERR]; a.state=Error; b=[]; \
         b.state=Error; remote_untouched=ok";
    pub const rem_atomic_misaligned: &str = rem_qp_no_remote_write;
    pub const loc_len_short_recv: &str = "a=[1:REM_INV_REQ_ERR]; b=[101:LOC_LEN_ERR]; \
         a.state=Error; b.state=Error";
    pub const flush_after_error: &str = "a.send=[1:LOC_PROT_ERR, 2:WR_FLUSH_ERR, 3:WR_FLUSH_ERR]; \
         a.recv=[11:WR_FLUSH_ERR, 12:WR_FLUSH_ERR]; a.state=Error; b=[]; b.state=ReadyToSend";
    pub const flush_on_modify_err: &str =
        "a.recv=[11:WR_FLUSH_ERR, 12:WR_FLUSH_ERR, 13:WR_FLUSH_ERR]; a.state=Error";
    pub const post_after_error: &str = "post_send=ok; a.send=[1:WR_FLUSH_ERR]; a.state=Error";
    pub const rnr_retry_exceeded: &str =
        "a=[1:RNR_RETRY_EXC_ERR]; a.state=Error; b=[]; b.state=ReadyToSend";
}
