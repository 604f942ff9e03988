//! What every HCA block shares besides the object tables: the configuration, simulated
//! time and its events, the wire, and the trace.
//!
//! [`Net`] is borrowed apart from the tables, so a block holding a queue pair can still
//! send a packet ([`Net::send`]), arm its timer (`sched`) and trace ([`Net::trace`]).

use crate::config::FabricConfig;
use crate::sched::Sched;
use crate::trace::{Trace, TraceKind};
use crate::wire::{Datagrams, Packet, Transit, Wire};

/// The configuration, time and events, the wire, the trace.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) cfg: FabricConfig,
    /// `cfg` is untimed: requests may complete on the direct path (`direct.rs`).
    pub(crate) untimed: bool,
    /// Simulated time, packets in flight and timers.
    pub(crate) sched: Sched,
    /// Ports, partitions and the fault generator.
    pub(crate) wire: Wire,
    pub(crate) trace: Trace,
    /// The messages of datagrams on the wire (`ud.rs`).
    pub(crate) datagrams: Datagrams,
}

impl Net {
    pub(crate) fn new(cfg: FabricConfig) -> Net {
        Net {
            cfg,
            untimed: cfg.untimed(),
            sched: Sched::new(),
            wire: Wire::new(cfg.seed),
            trace: Trace::new(cfg.trace),
            datagrams: Datagrams::default(),
        }
    }

    /// Simulated time, ns.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.sched.now
    }

    /// Records a trace event at the current time (when tracing).
    #[inline]
    pub(crate) fn trace(
        &mut self,
        dev: usize,
        qpn: u32,
        kind: TraceKind,
        psn: Option<u32>,
        wr_id: Option<u64>,
    ) {
        let now = self.sched.now;
        self.trace.record(now, dev, qpn, kind, psn, wr_id);
    }

    /// Puts `pkt` (`bytes` on the wire) on the link: schedules its arrival (twice when
    /// duplicated), or traces its loss. Returns how many arrivals it scheduled.
    pub(crate) fn send(&mut self, mut pkt: Packet, bytes: u64) -> u8 {
        let (src, qpn, psn) = (pkt.src_dev as usize, pkt.src_qpn, Some(pkt.psn));
        match self
            .wire
            .transmit(&mut pkt, bytes, self.sched.now, &self.cfg)
        {
            Transit::Lost(why) => {
                self.trace(src, qpn, TraceKind::Drop(pkt.kind, why), psn, None);
                0
            }
            Transit::Arrives { at, delay, twice } => {
                if let Some(extra) = delay {
                    self.trace(src, qpn, TraceKind::Delay(pkt.kind, extra), psn, None);
                }
                self.sched.events.push_packet(at, pkt);
                if twice {
                    self.trace(src, qpn, TraceKind::Duplicate(pkt.kind), psn, None);
                    self.sched.events.push_packet(at, pkt);
                }
                1 + u8::from(twice)
            }
        }
    }
}
