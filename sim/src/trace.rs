//! The event trace and its Chrome trace-event JSON form.
//!
//! Records are small `Copy` values (no strings) pushed only when tracing is on ([`Trace`]). The writer
//! formats integers only (timestamps as `µs.nnn` by integer division), so the same trace
//! always gives the same bytes.

use std::io::{self, Write};

use crate::types::{QpState, WcOpcode, WcStatus};
use crate::wire::packet::{DropReason, PacketKind};

/// What happened (see [`TraceEvent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TraceKind {
    /// A send work request was posted (with its completion opcode).
    PostSend(WcOpcode),
    /// A receive work request was posted.
    PostRecv,
    /// A packet leaves: a request's first transmission, or a response.
    Send(PacketKind),
    /// A request is sent again (go-back-N after a timeout or an RNR wait).
    Retransmit,
    /// A packet is lost, and why.
    Drop(PacketKind, DropReason),
    /// A packet is duplicated on the wire (both copies arrive).
    Duplicate(PacketKind),
    /// A packet is held back on the wire by this many extra nanoseconds.
    Delay(PacketKind, u64),
    /// A packet arrives at a live queue pair and is processed.
    Deliver(PacketKind),
    /// A request executes at the responder.
    Execute {
        /// A duplicate: a read executed again or an atomic's cached result replayed.
        dup: bool,
    },
    /// The responder found no receive and answers with an RNR NAK carrying this timer
    /// code.
    RnrNak(u8),
    /// A requester's local ACK timer expired.
    Timeout,
    /// A requester waits this many nanoseconds after an RNR NAK before retrying.
    RnrWait(u64),
    /// A completion was queued on a CQ (status and opcode).
    Complete(WcStatus, WcOpcode),
    /// A queue pair changed state (from, to).
    State(QpState, QpState),
}

/// One trace record: what happened, when, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceEvent {
    /// Simulated time, in nanoseconds.
    pub time_ns: u64,
    /// Index of the device it happened on (as [`Fabric::device_index`](crate::Fabric::device_index)).
    pub device: u32,
    /// Number of the queue pair it concerns.
    pub qpn: u32,
    /// Packet sequence number, where one is involved.
    pub psn: Option<u32>,
    /// Work request id, where one is involved.
    pub wr_id: Option<u64>,
    /// What happened.
    pub kind: TraceKind,
}

/// The trace being recorded: nothing unless [`FabricConfig::trace`](crate::FabricConfig::trace)
/// turned it on at creation.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    on: bool,
    pub(crate) events: Vec<TraceEvent>,
}

impl Trace {
    /// A trace that records when `on`.
    pub(crate) fn new(on: bool) -> Trace {
        Trace {
            on,
            events: Vec::new(),
        }
    }

    /// Records an event at simulated time `time_ns` (when tracing).
    #[inline]
    pub(crate) fn record(
        &mut self,
        time_ns: u64,
        dev: usize,
        qpn: u32,
        kind: TraceKind,
        psn: Option<u32>,
        wr_id: Option<u64>,
    ) {
        if self.on {
            self.events.push(TraceEvent {
                time_ns,
                device: dev as u32,
                qpn,
                psn,
                wr_id,
                kind,
            });
        }
    }
}

/// Writes `s` as a JSON string literal.
fn json_str(out: &mut dyn Write, s: &str) -> io::Result<()> {
    out.write_all(b"\"")?;
    for c in s.chars() {
        match c {
            '"' => out.write_all(b"\\\"")?,
            '\\' => out.write_all(b"\\\\")?,
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32)?,
            c => write!(out, "{c}")?,
        }
    }
    out.write_all(b"\"")
}

// The trace spells statuses, opcodes and states as the simulator's own enums did before it
// took zverbs-types' (`Rts`, `CompSwap`, `Err`, ...), so the Chrome trace keeps its bytes:
// opcodes and states are mapped explicitly here, not taken from `Debug`, whose names are
// now zverbs's (`ReadyToSend`, `CompareSwap`, `Error`). Statuses keep their `Debug` name,
// the same as before for every named status (the test below pins them).

/// A completion opcode's name in the trace.
fn opcode_name(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::Send => "Send",
        WcOpcode::RdmaWrite => "RdmaWrite",
        WcOpcode::RdmaRead => "RdmaRead",
        WcOpcode::CompareSwap => "CompSwap",
        WcOpcode::FetchAdd => "FetchAdd",
        WcOpcode::Recv => "Recv",
        WcOpcode::RecvRdmaWithImm => "RecvRdmaWithImm",
    }
}

/// A queue pair state's name in the trace.
fn state_name(st: QpState) -> &'static str {
    match st {
        QpState::Reset => "Reset",
        QpState::Init => "Init",
        QpState::ReadyToReceive => "Rtr",
        QpState::ReadyToSend => "Rts",
        QpState::SendQueueDrained => "Sqd",
        QpState::SendQueueError => "Sqe",
        QpState::Error => "Err",
    }
}

/// A completion status's name in the trace, as a JSON string.
fn status_json(st: WcStatus) -> String {
    format!("\"{st:?}\"")
}

/// The event's name and its detail arguments (`"key":value` pairs, JSON-ready).
fn describe(k: &TraceKind, args: &mut Vec<(&'static str, String)>) -> &'static str {
    let q = |s: &str| format!("\"{s}\"");
    match *k {
        TraceKind::PostSend(op) => {
            args.push(("opcode", q(opcode_name(op))));
            "post_send"
        }
        TraceKind::PostRecv => "post_recv",
        TraceKind::Send(p) => {
            args.push(("packet", q(p.name())));
            packet_args(p, args);
            "packet_send"
        }
        TraceKind::Retransmit => "retransmit",
        TraceKind::Drop(p, why) => {
            args.push(("packet", q(p.name())));
            args.push(("reason", q(why.name())));
            "drop"
        }
        TraceKind::Duplicate(p) => {
            args.push(("packet", q(p.name())));
            "duplicate"
        }
        TraceKind::Delay(p, ns) => {
            args.push(("packet", q(p.name())));
            args.push(("extra_ns", ns.to_string()));
            "delay"
        }
        TraceKind::Deliver(p) => {
            args.push(("packet", q(p.name())));
            packet_args(p, args);
            "deliver"
        }
        TraceKind::Execute { dup } => {
            args.push(("duplicate", dup.to_string()));
            "execute"
        }
        TraceKind::RnrNak(code) => {
            args.push(("timer", code.to_string()));
            "rnr_nak"
        }
        TraceKind::Timeout => "timeout",
        TraceKind::RnrWait(ns) => {
            args.push(("wait_ns", ns.to_string()));
            "rnr_wait"
        }
        TraceKind::Complete(st, op) => {
            args.push(("status", status_json(st)));
            args.push(("opcode", q(opcode_name(op))));
            "completion"
        }
        TraceKind::State(from, to) => {
            args.push(("from", q(state_name(from))));
            args.push(("to", q(state_name(to))));
            "qp_state"
        }
    }
}

fn packet_args(p: PacketKind, args: &mut Vec<(&'static str, String)>) {
    match p {
        PacketKind::Rnr(code) => args.push(("timer", code.to_string())),
        PacketKind::Nak(st) => args.push(("status", status_json(st))),
        _ => {}
    }
}

/// Writes `events` as Chrome trace-event JSON; `names[i]` names device `i`.
pub(crate) fn write_chrome(
    out: &mut dyn Write,
    names: &[String],
    events: &[TraceEvent],
) -> io::Result<()> {
    out.write_all(b"{\"traceEvents\":[\n")?;
    let mut first = true;
    let mut sep = |out: &mut dyn Write| -> io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        Ok(())
    };
    for (pid, name) in names.iter().enumerate() {
        sep(out)?;
        write!(
            out,
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":"
        )?;
        json_str(out, name)?;
        out.write_all(b"}}")?;
    }
    let mut threads: Vec<(u32, u32)> = events.iter().map(|e| (e.device, e.qpn)).collect();
    threads.sort_unstable();
    threads.dedup();
    for (pid, tid) in threads {
        sep(out)?;
        write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\
             \"args\":{{\"name\":\"QP {tid:#x}\"}}}}"
        )?;
    }
    let mut args = Vec::new();
    for e in events {
        args.clear();
        let name = describe(&e.kind, &mut args);
        if let Some(psn) = e.psn {
            args.push(("psn", psn.to_string()));
        }
        if let Some(id) = e.wr_id {
            args.push(("wr_id", id.to_string()));
        }
        sep(out)?;
        write!(
            out,
            "{{\"name\":\"{name}\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{}.{:03},\"pid\":{},\"tid\":{},\
             \"args\":{{",
            e.time_ns / 1000,
            e.time_ns % 1000,
            e.device,
            e.qpn
        )?;
        for (i, (k, v)) in args.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            write!(out, "{comma}\"{k}\":{v}")?;
        }
        out.write_all(b"}}")?;
    }
    out.write_all(b"\n]}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_json_is_escaped_and_integer_timed() {
        let ev = TraceEvent {
            time_ns: 1_234_567,
            device: 1,
            qpn: 0x11,
            psn: Some(3),
            wr_id: Some(9),
            kind: TraceKind::Drop(PacketKind::Request, DropReason::LinkDown),
        };
        let mut out = Vec::new();
        write_chrome(&mut out, &["a\"b".into(), "c".into()], &[ev]).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("{\"traceEvents\":["), "{s}");
        assert!(s.contains("\"args\":{\"name\":\"a\\\"b\"}"), "{s}");
        assert!(s.contains("\"name\":\"QP 0x11\""), "{s}");
        assert!(s.contains("\"ts\":1234.567,"), "{s}");
        assert!(
            s.contains("\"reason\":\"link down\",\"psn\":3,\"wr_id\":9"),
            "{s}"
        );
        assert!(s.trim_end().ends_with("]}"));
    }

    #[test]
    fn names_are_the_traces_of_before() {
        const STATUSES: [&str; 22] = [
            "Success",
            "LocLenErr",
            "LocQpOpErr",
            "LocEecOpErr",
            "LocProtErr",
            "WrFlushErr",
            "MwBindErr",
            "BadRespErr",
            "LocAccessErr",
            "RemInvReqErr",
            "RemAccessErr",
            "RemOpErr",
            "RetryExcErr",
            "RnrRetryExcErr",
            "LocRddViolErr",
            "RemInvRdReqErr",
            "RemAbortErr",
            "InvEecnErr",
            "InvEecStateErr",
            "FatalErr",
            "RespTimeoutErr",
            "GeneralErr",
        ];
        for (v, name) in (0..).zip(STATUSES) {
            assert_eq!(status_json(WcStatus::from_raw(v)), format!("\"{name}\""));
        }
        assert_eq!(opcode_name(WcOpcode::CompareSwap), "CompSwap");
        assert_eq!(state_name(QpState::ReadyToSend), "Rts");
        assert_eq!(state_name(QpState::Error), "Err");
    }
}
