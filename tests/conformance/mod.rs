//! The conformance suite, written once and run on every backend.
//!
//! Each scenario is a function generic over an [`Env`] (which backend, which devices, how
//! long to wait). It builds a connected pair of RC queue pairs, drives them at the verbs
//! level (post, poll, query) and returns an [`Outcome`]: the completions each side saw
//! (wr_id, status and, where the verbs define them, opcode, byte count and immediate data),
//! byte checks and final queue-pair states, as comparable text. The test files
//! (`conformance_sim.rs`, `conformance_verbs.rs`) assert each outcome against what the
//! verbs specification requires, and record it for the differential report that
//! `scripts/rxe-test.sh` prints (set `ZVERBS_CONFORMANCE_OUT=<file>` to record).
#![allow(dead_code)]

#[cfg(feature = "tokio")]
mod asynchronous;
#[cfg(unix)]
mod cm;
mod collective;
mod datagram;
mod errors;
mod events;
mod liveness;
mod path;
mod porting;
mod rxe;
mod scenarios;
mod srq;

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use zverbs::provider::Provider;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, ReadyToSend, RtrOptions, RtsOptions};
use zverbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

#[cfg(feature = "tokio")]
pub use asynchronous::*;
#[cfg(unix)]
pub use cm::*;
pub use collective::*;
pub use datagram::*;
pub use errors::*;
pub use events::*;
pub use liveness::*;
pub use path::*;
pub use porting::*;
pub use rxe::RXE_DEVIATIONS;
pub use scenarios::*;
pub use srq::*;

/// What the verbs specification requires of each scenario.
pub mod expected {
    #[cfg(feature = "tokio")]
    pub use super::asynchronous::expected::*;
    #[cfg(unix)]
    pub use super::cm::expected::*;
    pub use super::collective::expected::*;
    pub use super::datagram::expected::*;
    pub use super::errors::expected::*;
    pub use super::events::expected::*;
    pub use super::liveness::expected::*;
    pub use super::path::expected::*;
    pub use super::porting::expected::*;
    pub use super::scenarios::expected::*;
    pub use super::srq::expected::*;
}

/// Scatter/gather entries per work request in the suite.
pub const SGES: usize = 4;

/// A backend to run the suite on.
pub trait Env {
    /// The provider.
    type P: Provider;
    /// Short name for reports (`sim`, `rxe`, ...).
    fn backend(&self) -> &'static str;
    /// The provider value.
    fn provider(&self) -> &Self::P;
    /// Device names of the two sides (the same name twice for loopback on one device).
    fn devices(&self) -> (&str, &str);
    /// Queue pair settings for a side on `ctx` (the GID index, chiefly).
    fn qp_config(&self, ctx: &Context<Self::P>) -> QpConfig;
    /// How long to wait for an expected completion.
    fn timeout(&self) -> Duration {
        Duration::from_secs(20)
    }
    /// How long to keep polling to be sure no further completion arrives.
    fn grace(&self) -> Duration {
        Duration::ZERO
    }
    /// Takes the link between the two devices down (`up == false`) or brings it back up,
    /// for the liveness scenarios. Backends that cannot say so.
    fn set_link(&self, up: bool) -> Run<()> {
        let _ = up;
        Err(format!("{} cannot take its link down", self.backend()))
    }
    /// A dmabuf of at least `len` bytes exported on the machine of `ctx`'s device (an
    /// accelerator's memory), for the dmabuf scenarios: whatever owns it, and keeps the
    /// memory alive.
    fn dmabuf(&self, ctx: &Context<Self::P>, len: usize) -> Run<Box<dyn AsFd>>;
    /// Scenarios where this backend is known to deviate from the verbs specification.
    fn deviations(&self) -> &[Deviation] {
        &[]
    }
    /// Whether the backend must produce its [`deviations`](Env::deviations) (a simulator
    /// imitating that device), rather than merely being allowed to.
    fn imitates_deviations(&self) -> bool {
        false
    }
}

/// A documented deviation of a backend from the specification: the scenario passes with
/// this outcome instead of the specified one, and the report says why.
#[derive(Clone, Copy, Debug)]
pub struct Deviation {
    /// The scenario.
    pub scenario: &'static str,
    /// The outcome the backend produces.
    pub outcome: &'static str,
    /// Why, with the source of the behaviour.
    pub why: &'static str,
}

/// Per-pair settings a scenario may change.
#[derive(Clone, Copy, Debug)]
pub struct PairOptions {
    /// Side B's receive CQ reports to a completion channel ([`Side::events`]).
    pub b_events: bool,
    /// Remote operations side B's queue pair accepts.
    pub b_access: AccessFlags,
    /// Side A's RNR retry count (7 = infinite).
    pub a_rnr_retry: u8,
    /// Side B's RNR NAK timer code.
    pub b_min_rnr_timer: u8,
    /// Side A's RTR options (its path to B).
    pub a_rtr: RtrOptions,
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions {
            b_events: false,
            b_access: InitOptions::default().access,
            a_rnr_retry: 7,
            b_min_rnr_timer: 1,
            a_rtr: RtrOptions::default(),
        }
    }
}

/// One side of a connected pair. Fields drop in order: the queue pair before its CQs and PD.
pub struct Side<P: Provider> {
    pub qp: QueuePair<P, ReadyToSend>,
    pub scq: CompletionQueue<P>,
    pub rcq: CompletionQueue<P>,
    /// The completion channel of `rcq`, if [`PairOptions::b_events`] asked for one.
    pub events: Option<CompletionChannel<P>>,
    pub pd: ProtectionDomain<P>,
    pub ctx: Context<P>,
}

/// A scenario's failure to run (not a wrong outcome: an unexpected API error).
pub type Run<T> = Result<T, String>;

fn err<E: fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Sides A and B of a connection.
pub type Pair<P> = (Side<P>, Side<P>);

/// Two RC queue pairs connected to each other, A on the first device, B on the second.
pub fn pair<E: Env>(env: &E, o: &PairOptions) -> Run<Pair<E::P>> {
    let (da, db) = env.devices();
    let prep = |name: &str, access: AccessFlags, events: bool| -> Run<_> {
        let ctx = Context::open(env.provider(), name).map_err(err("open device"))?;
        let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
        let scq = CompletionQueue::create(&ctx, 64).map_err(err("create cq"))?;
        let ch = events
            .then(|| CompletionChannel::create(&ctx).map_err(err("create channel")))
            .transpose()?;
        let rcq = match &ch {
            Some(ch) => CompletionQueue::create_on(&ctx, 64, ch),
            None => CompletionQueue::create(&ctx, 64),
        };
        let rcq = rcq.map_err(err("create cq"))?;
        let qp = QueuePair::create(&ctx, &pd, &scq, &rcq, &env.qp_config(&ctx))
            .map_err(err("create qp"))?;
        let init = InitOptions {
            access,
            ..InitOptions::default()
        };
        let qp = qp
            .into_init(&init)
            .map_err(|e| format!("init: {}", e.error))?;
        Ok((ctx, pd, scq, (rcq, ch), qp))
    };
    let (ca, pa, sa, ra, qa) = prep(da, InitOptions::default().access, false)?;
    let (cb, pb, sb, rb, qb) = prep(db, o.b_access, o.b_events)?;
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    let rtr = |timer| RtrOptions {
        min_rnr_timer: timer,
        ..RtrOptions::default()
    };
    let rts = |rnr_retry| RtsOptions {
        rnr_retry,
        ..RtsOptions::default()
    };
    let qa = qa.into_rtr(&eb, &o.a_rtr);
    let qa = qa.map_err(|e| format!("rtr: {}", e.error))?;
    let qb = qb.into_rtr(&ea, &rtr(o.b_min_rnr_timer));
    let qb = qb.map_err(|e| format!("rtr: {}", e.error))?;
    let qa = qa.into_rts(&rts(o.a_rnr_retry));
    let qa = qa.map_err(|e| format!("rts: {}", e.error))?;
    let qb = qb
        .into_rts(&rts(7))
        .map_err(|e| format!("rts: {}", e.error))?;
    let side = |qp, scq, (rcq, events), pd, ctx| Side {
        qp,
        scq,
        rcq,
        events,
        pd,
        ctx,
    };
    Ok((side(qa, sa, ra, pa, ca), side(qb, sb, rb, pb, cb)))
}

/// A context, a protection domain and a completion queue of `depth` entries on each of the
/// env's two devices.
pub fn two_devices<E: Env>(env: &E, depth: u32) -> Run<[Device<E::P>; 2]> {
    let (da, db) = env.devices();
    let open = |name: &str| -> Run<Device<E::P>> {
        let ctx = Context::open(env.provider(), name).map_err(err("open device"))?;
        let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
        let cq = CompletionQueue::create(&ctx, depth).map_err(err("create cq"))?;
        Ok(Device { cq, pd, ctx })
    };
    Ok([open(da)?, open(db)?])
}

/// The next asynchronous event of `kind` on `ctx` within `within` (others are skipped),
/// or `None`.
pub fn wait_event<P: Provider>(
    ctx: &Context<P>,
    kind: zverbs::AsyncEventKind,
    within: Duration,
) -> Run<Option<zverbs::AsyncEvent>> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctx
            .wait_async_event(Some(left))
            .map_err(err("async event"))?
        {
            Some(ev) if ev.kind == kind => return Ok(Some(ev)),
            Some(_) => continue,
            None => return Ok(None),
        }
    }
}

/// One device's context, protection domain and completion queue (dropped in this order:
/// the queue, the domain, the context).
pub struct Device<P: Provider> {
    pub cq: CompletionQueue<P>,
    pub pd: ProtectionDomain<P>,
    pub ctx: Context<P>,
}

/// A registered buffer of `len` bytes filled with `fill`. The buffer is leaked so the
/// region is `'static` and scenarios stay free of borrow juggling; tests are short-lived.
pub fn region<P: Provider>(
    pd: &ProtectionDomain<P>,
    len: usize,
    access: AccessFlags,
    fill: u8,
) -> Run<MemoryRegion<'static, P>> {
    let buf: &'static mut [u8] = Box::leak(vec![fill; len].into_boxed_slice());
    // SAFETY: the buffer is leaked, so it outlives the registration. Scenarios read it only
    // through `as_slice` after the work (and any peer access) that touches it completed.
    unsafe { pd.register_with_access(buf, access) }.map_err(err("register"))
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `len` bytes at `off` of `mr`.
pub fn sge<P: Provider>(mr: &MemoryRegion<'_, P>, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.remote().addr + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

/// A send work request.
pub fn swr(wr_id: u64, op: SendOp, flags: SendFlags, sges: &[Sge]) -> SendWr<SGES> {
    let mut wr = SendWr::new(wr_id, op, flags);
    wr.sg_list[..sges.len()].copy_from_slice(sges);
    wr.num_sge = sges.len() as u8;
    wr
}

/// A receive work request.
pub fn rwr(wr_id: u64, sges: &[Sge]) -> RecvWr<SGES> {
    let mut wr = RecvWr::new(wr_id);
    wr.sg_list[..sges.len()].copy_from_slice(sges);
    wr.num_sge = sges.len() as u8;
    wr
}

/// Posts sends on `side`.
///
/// # Safety
/// The memory the requests name must stay valid and untouched until they complete (the
/// suite's regions are leaked and read only after completion).
pub unsafe fn post_send<P: Provider>(side: &Side<P>, wrs: &[SendWr<SGES>]) -> Run<()> {
    // SAFETY: forwarded to the caller.
    unsafe { side.qp.post_send(wrs) }.map_err(|e| format!("post_send: {e}"))
}

/// Posts receives on `side`.
///
/// # Safety
/// As [`post_send`].
pub unsafe fn post_recv<P: Provider>(side: &Side<P>, wrs: &[RecvWr<SGES>]) -> Run<()> {
    // SAFETY: forwarded to the caller.
    unsafe { side.qp.post_recv(wrs) }.map_err(|e| format!("post_recv: {e}"))
}

/// Polls `cq` until `n` completions arrived or the env's timeout passed; returns what came.
pub fn wait<E: Env>(env: &E, cq: &CompletionQueue<E::P>, n: usize) -> Run<Vec<WorkCompletion>> {
    let deadline = Instant::now() + env.timeout();
    collect(cq, n, deadline)
}

/// Polls `cq` for the env's grace period; returns any completion that arrived.
pub fn settle<E: Env>(env: &E, cq: &CompletionQueue<E::P>) -> Run<Vec<WorkCompletion>> {
    collect(cq, usize::MAX, Instant::now() + env.grace())
}

fn collect<P: Provider>(
    cq: &CompletionQueue<P>,
    n: usize,
    deadline: Instant,
) -> Run<Vec<WorkCompletion>> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::EMPTY; 16];
    loop {
        let k = cq.poll(&mut buf).map_err(err("poll"))?;
        out.extend_from_slice(&buf[..k]);
        if out.len() >= n || (k == 0 && Instant::now() >= deadline) {
            return Ok(out);
        }
        if k == 0 {
            std::thread::yield_now();
        }
    }
}

/// What a scenario observed, as ordered `key=value` items.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome(Vec<(String, String)>);

fn short(s: WcStatus) -> &'static str {
    s.name().trim_start_matches("IBV_WC_")
}

/// One completion as text. For errors only `wr_id` and status are defined by the verbs;
/// for successes the opcode, and the byte count where the verbs define it (receives,
/// reads, atomics), and immediate data.
pub fn wc_text(wc: &WorkCompletion) -> String {
    let mut s = format!("{}:{}", wc.wr_id, short(wc.status));
    if wc.status == WcStatus::Success {
        let _ = write!(s, " {:?}", wc.opcode);
        if matches!(
            wc.opcode,
            WcOpcode::Recv
                | WcOpcode::RecvRdmaWithImm
                | WcOpcode::RdmaRead
                | WcOpcode::CompareSwap
                | WcOpcode::FetchAdd
        ) {
            let _ = write!(s, " len={}", wc.byte_len);
        }
        if let Some(imm) = wc.imm {
            let _ = write!(s, " imm={imm:#x}");
        }
    }
    s
}

impl Outcome {
    /// Adds `key=value`.
    pub fn item(&mut self, key: &str, value: impl fmt::Display) -> &mut Self {
        self.0.push((key.to_owned(), value.to_string()));
        self
    }

    /// Adds completions as `key=[...]`.
    pub fn wcs(&mut self, key: &str, wcs: &[WorkCompletion]) -> &mut Self {
        let list: Vec<String> = wcs.iter().map(wc_text).collect();
        self.item(key, format_args!("[{}]", list.join(", ")))
    }

    /// Adds `key=ok` or `key=MISMATCH`.
    pub fn check(&mut self, key: &str, ok: bool) -> &mut Self {
        self.item(key, if ok { "ok" } else { "MISMATCH" })
    }

    /// Adds the state of a side's queue pair.
    pub fn state<P: Provider>(&mut self, key: &str, side: &Side<P>) -> &mut Self {
        match side.qp.state() {
            Ok(s) => self.item(key, format_args!("{s:?}")),
            Err(e) => self.item(key, format_args!("query failed: {e}")),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Runs `scenario` on `env`, records its outcome, and asserts it equals `expected` (or the
/// backend's documented deviation for it).
pub fn run<E: Env>(env: &E, name: &str, scenario: fn(&E) -> Run<Outcome>, expected: &str) {
    // A scenario that takes the link down runs alone: on one device (rxe0) it would cut
    // the others too.
    let alone = TAKE_THE_LINK.contains(&name);
    let _shared = (!alone).then(|| LINK.read().unwrap_or_else(|e| e.into_inner()));
    let _alone = alone.then(|| LINK.write().unwrap_or_else(|e| e.into_inner()));
    let got = match scenario(env) {
        Ok(o) => o.to_string(),
        Err(e) => format!("ERROR {e}"),
    };
    let backend = env.backend();
    if env.imitates_deviations() {
        // The documented outcome is required: the spec's is a failure here.
        let d = env.deviations().iter().find(|d| d.scenario == name);
        let (want, note) = d.map_or((expected, String::new()), |d| {
            (
                d.outcome,
                format!("imitates the documented deviation: {}", d.why),
            )
        });
        let verdict = if got == want { "pass" } else { "FAIL" };
        record(backend, name, verdict, &got, &note);
        assert_eq!(got, want, "scenario {name} on {backend}");
        return;
    }
    let deviation = env
        .deviations()
        .iter()
        .find(|d| d.scenario == name && d.outcome == got && got != expected);
    let note = deviation.map_or(String::new(), |d| {
        format!("known {backend} deviation: {}", d.why)
    });
    let verdict = match (got == expected, deviation.is_some()) {
        (true, _) => "pass",
        (false, true) => "pass*",
        (false, false) => "FAIL",
    };
    record(backend, name, verdict, &got, &note);
    if deviation.is_none() {
        assert_eq!(got, expected, "scenario {name} on {backend}");
    }
}

/// Scenarios share the link; these take it alone.
const TAKE_THE_LINK: [&str; 2] = ["link_down_bounded", "port_down_event"];
static LINK: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Appends `backend<TAB>scenario<TAB>verdict<TAB>outcome<TAB>note` to
/// `$ZVERBS_CONFORMANCE_OUT`, if set.
fn record(backend: &str, name: &str, verdict: &str, outcome: &str, note: &str) {
    let Some(path) = std::env::var_os("ZVERBS_CONFORMANCE_OUT") else {
        return;
    };
    let line = format!("{backend}\t{name}\t{verdict}\t{outcome}\t{note}\n");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    // One write per line: appends from parallel tests do not interleave.
    if let Ok(mut f) = file {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Prints a skip line that the test harness does not capture (so it is always visible).
pub fn skip(name: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: {name}: {reason}");
}

/// Defines one `#[test]` per scenario. `$env` is an expression of type
/// `Result<impl Env, String>`; an `Err` skips each test with its reason.
#[macro_export]
macro_rules! conformance_tests {
    ($env:expr) => {
        $crate::conformance_tests!(@each $env;
            send, send_imm, write, write_imm, read, cmp_swap, fetch_add, inline, multi_sge,
            selective_signaling, rnr_then_recv, loc_prot_bad_lkey, loc_prot_out_of_bounds,
            rem_access_bad_rkey, rem_access_no_remote_write, rem_access_no_remote_read,
            rem_access_write_out_of_bounds, rem_write_imm_bad_rkey, rem_qp_no_remote_write,
            responder_error_events,
            rem_atomic_misaligned, loc_len_short_recv, flush_after_error, flush_on_modify_err,
            post_after_error, rnr_retry_exceeded, channel_roundtrip, cq_events,
            multi_channel_scatter_gather, node_barrier, wait_bounded_on_silent_peer,
            send_before_peer_connects, barrier_at_connect_and_exit, link_down_bounded,
            path_attributes, device_attributes, recv_posted_in_init, scoped_receive_completion, prepared_batch,
            ud_send,
            ud_silent_drops, ud_over_mtu, ud_pingpong, cm_connect_accept, cm_reject, cm_nobody,
            cm_disconnect, cm_node_barrier, cm_ud, cm_ud_refused, ud_source, ud_no_grh,
            cq_overflow_event, srq_shared_order, srq_rnr_when_empty, srq_limit_once, srq_last_wqe,
            srq_post_errors,
            port_down_event, comm_est_event, dmabuf_registration
        );
    };
    (@each $env:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                match $env {
                    Ok(env) => conformance::run(
                        &env,
                        stringify!($name),
                        conformance::$name,
                        conformance::expected::$name,
                    ),
                    Err(reason) => conformance::skip(stringify!($name), &reason),
                }
            }
        )*
    };
}
