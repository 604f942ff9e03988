//! Fabric-wide controls: simulated time, faults, and the trace.

use std::io;
use std::time::Duration;

use super::{enter, lock, Fabric};
use crate::config::{FabricConfig, Faults, Mode};
use crate::counters::QpCounters;
use crate::trace::{write_chrome, TraceEvent};
use crate::types::{AsyncEvent, AsyncEventKind, EventElement, SimError};

impl Fabric {
    /// The configuration the fabric was created with (faults as last set).
    pub fn config(&self) -> FabricConfig {
        lock(&self.world).net.cfg
    }

    /// Index of the device called `name` (devices are numbered from 0 in order of
    /// addition), as the fault controls take it.
    pub fn device_index(&self, name: &str) -> Option<usize> {
        lock(&self.world).tables.device_named(name)
    }

    /// The IP address device `dev` answers to for the connection manager (the IPv4 of its
    /// IPv4-mapped GID: device `i` is `10.0.0.<i + 1>`).
    pub fn device_ip(&self, dev: usize) -> Option<std::net::IpAddr> {
        let w = lock(&self.world);
        let gids = w.tables.devices.get(dev)?.gids;
        let v6 = std::net::Ipv6Addr::from(gids[1].0);
        Some(
            v6.to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        )
    }

    /// Connection manager ids alive (made, or brought by connect requests, and not yet
    /// destroyed).
    pub fn cm_ids(&self) -> usize {
        lock(&self.world).cm.live_ids()
    }

    /// Current simulated time (threaded mode: wall-clock time since creation).
    pub fn now(&self) -> Duration {
        let mut w = enter(&self.world);
        if w.net.cfg.mode == Mode::Threaded {
            w.net.sched.now = w.net.sched.now.max(w.net.sched.wall());
        }
        Duration::from_nanos(w.net.sched.now)
    }

    /// How many send work requests have completed on the untimed fabric's direct path
    /// (executed inside their post, without packets; see [`FabricConfig::instant`]). A
    /// diagnostic: the outcome is the same either way, only the cost differs. It stays 0
    /// on timed or stepped fabrics, with random faults, or with the trace on.
    ///
    /// ```
    /// use zverbs_sim::*;
    /// assert_eq!(Fabric::with_devices(2).direct_executions(), 0);
    /// ```
    pub fn direct_executions(&self) -> u64 {
        let w = lock(&self.world);
        w.tables.direct_retired + w.tables.qps.iter().map(|qp| *qp.direct_count).sum::<u64>()
    }

    /// The counters of the live queue pair numbered `qp_num` (as [`Qp::counters`] gives
    /// them), for a test that knows a queue pair by number only.
    ///
    /// [`Qp::counters`]: crate::Qp::counters
    pub fn qp_counters(&self, qp_num: u32) -> Option<QpCounters> {
        let w = enter(&self.world);
        let q = w.tables.qp_index(qp_num)?;
        w.tables.qps.get(q).map(|qp| qp.rq.counted(*qp.counters))
    }

    /// Events scheduled and not yet processed.
    pub fn pending_events(&self) -> usize {
        enter(&self.world).net.sched.events.len()
    }

    /// Unreliable datagrams on the wire: sent, and neither delivered nor lost yet. Their
    /// messages are held by the fabric until then (and only until then).
    pub fn datagrams_in_flight(&self) -> usize {
        enter(&self.world).net.datagrams.in_flight()
    }

    /// Simulated time of the next scheduled event, if any. With
    /// [`run_for`](Fabric::run_for)`(next - now)` a driver processes exactly the events due
    /// at that instant, so it can observe completions at the time they happen.
    ///
    /// ```
    /// use zverbs_sim::*;
    /// let f = Fabric::with_config(FabricConfig::stepped(1), 1);
    /// assert_eq!(f.next_event_at(), None);
    /// ```
    pub fn next_event_at(&self) -> Option<Duration> {
        enter(&self.world)
            .net
            .sched
            .events
            .next_time()
            .map(Duration::from_nanos)
    }

    /// Processes the next event, advancing simulated time to it; false if there is none.
    /// In threaded mode only an event that is already due is processed.
    ///
    /// ```
    /// use zverbs_sim::*;
    /// let f = Fabric::with_config(FabricConfig::stepped(1), 1);
    /// assert!(!f.step());
    /// assert_eq!(f.run_until_idle(), 0);
    /// ```
    pub fn step(&self) -> bool {
        let mut w = lock(&self.world);
        match w.net.cfg.mode {
            Mode::Stepped => w.step(),
            Mode::Threaded => w.run_due_one(),
        }
    }

    /// Processes events until none remain; returns how many ran. In threaded mode, runs
    /// the events due now. Never returns while a requester retries RNR forever
    /// (`rnr_retry = 7` with no receive coming): use [`Fabric::run_until_idle_max`].
    pub fn run_until_idle(&self) -> usize {
        self.run_until_idle_max(usize::MAX)
    }

    /// Like [`Fabric::run_until_idle`], but stops after `max_events`.
    pub fn run_until_idle_max(&self, max_events: usize) -> usize {
        let mut w = lock(&self.world);
        let mut n = 0;
        while n < max_events {
            let more = match w.net.cfg.mode {
                Mode::Stepped => w.step(),
                Mode::Threaded => w.run_due_one(),
            };
            if !more {
                break;
            }
            n += 1;
        }
        n
    }

    /// Advances simulated time by `d`, processing the events that fall due on the way;
    /// returns how many ran. In threaded mode, sleeps `d` and then runs the due events.
    pub fn run_for(&self, d: Duration) -> usize {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if lock(&self.world).net.cfg.mode == Mode::Threaded {
            std::thread::sleep(d);
            return lock(&self.world).run_due();
        }
        let mut w = lock(&self.world);
        let end = w.net.sched.now.saturating_add(ns);
        let mut n = 0;
        while w.net.sched.events.next_time().is_some_and(|t| t <= end) {
            w.step();
            n += 1;
        }
        w.net.sched.now = end;
        n
    }

    /// Replaces the random packet faults from now on.
    pub fn set_faults(&self, faults: Faults) {
        let mut w = enter(&self.world);
        w.net.cfg.faults = faults;
        w.net.untimed = w.net.cfg.untimed();
        // Delays make events fall due between calls.
        super::comp_channel::start_clock(&self.world, &mut w);
    }

    fn with_dev(&self, dev: usize, f: impl FnOnce(&mut crate::hca::World)) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        if dev >= w.tables.devices.len() {
            return Err(SimError::NotFound);
        }
        f(&mut w);
        Ok(())
    }

    /// Drops the next `n` packets leaving device `dev` (requests and responses alike).
    /// Calls add up, saturating at `u32::MAX` packets.
    ///
    /// # Errors
    /// [`SimError::NotFound`] if there is no device `dev`.
    pub fn drop_next(&self, dev: usize, n: u32) -> Result<(), SimError> {
        self.with_dev(dev, |w| {
            let port = &mut w.net.wire.ports[dev];
            port.drop_next = port.drop_next.saturating_add(n);
        })
    }

    /// Corrupts the next response (ACK, NAK or read/atomic response) leaving device `dev`
    /// into an opcode the requester does not expect: that requester's work request
    /// completes with `BadRespErr` (with [`Personality::Rxe`](crate::Personality::Rxe),
    /// `FatalErr` for anything but a read, as rxe reports it) and its QP moves to ERR.
    /// Calls add up (saturating).
    ///
    /// # Errors
    /// [`SimError::NotFound`] if there is no device `dev`.
    pub fn corrupt_next_response(&self, dev: usize) -> Result<(), SimError> {
        self.with_dev(dev, |w| {
            let port = &mut w.net.wire.ports[dev];
            port.corrupt_next = port.corrupt_next.saturating_add(1);
        })
    }

    /// Takes device `dev`'s link down: packets to or from it are lost (also those already
    /// in flight towards it) and its port reads [`PortState::Down`](crate::PortState).
    ///
    /// # Errors
    /// [`SimError::NotFound`] if there is no device `dev`.
    pub fn link_down(&self, dev: usize) -> Result<(), SimError> {
        self.with_dev(dev, |w| {
            if std::mem::replace(&mut w.net.wire.ports[dev].link_up, false) {
                w.tables
                    .async_events
                    .raise(dev, port_event(AsyncEventKind::PortErr));
            }
            w.wake_unreachable();
        })
    }

    /// Brings device `dev`'s link back up.
    ///
    /// # Errors
    /// [`SimError::NotFound`] if there is no device `dev`.
    pub fn link_up(&self, dev: usize) -> Result<(), SimError> {
        self.with_dev(dev, |w| {
            let port = &mut w.net.wire.ports[dev];
            if !std::mem::replace(&mut port.link_up, true) && !port.crashed {
                w.tables
                    .async_events
                    .raise(dev, port_event(AsyncEventKind::PortActive));
            }
        })
    }

    /// Cuts devices `a` and `b` off from each other (both directions) until
    /// [`Fabric::heal`].
    ///
    /// # Errors
    /// [`SimError::NotFound`] if a device does not exist.
    pub fn partition(&self, a: usize, b: usize) -> Result<(), SimError> {
        self.with_dev(a.max(b), |w| {
            w.net.wire.partition(a, b);
            w.wake_unreachable();
        })
    }

    /// Undoes [`Fabric::partition`] of `a` and `b`.
    ///
    /// # Errors
    /// [`SimError::NotFound`] if a device does not exist.
    pub fn heal(&self, a: usize, b: usize) -> Result<(), SimError> {
        self.with_dev(a.max(b), |w| w.net.wire.heal(a, b))
    }

    /// Crashes device `dev` for good: its queue pairs vanish (they stop answering, their
    /// queued work is gone without completions, posts and state changes on their handles
    /// fail with [`SimError::DeviceFatal`] (`EIO`) and they read as ERR), its CQs empty and
    /// fail every later poll with `DeviceFatal` (a wait on one ends at once; a sleeper on
    /// its completion channel is woken), its contexts get the asynchronous event
    /// `DeviceFatal`, its port reads Down and packets to or from it are lost. Peers find
    /// out by timeouts (`RetryExcErr`).
    ///
    /// # Errors
    /// [`SimError::NotFound`] if there is no device `dev`.
    pub fn crash(&self, dev: usize) -> Result<(), SimError> {
        self.with_dev(dev, |w| w.crash(dev))
    }

    /// Number of trace records (0 unless [`FabricConfig::trace`]).
    pub fn trace_len(&self) -> usize {
        lock(&self.world).net.trace.events.len()
    }

    /// A copy of the trace recorded so far, oldest first (empty unless
    /// [`FabricConfig::trace`]).
    ///
    /// ```
    /// use zverbs_sim::*;
    /// let f = Fabric::with_config(FabricConfig { trace: true, ..FabricConfig::stepped(0) }, 1);
    /// assert!(f.trace_events().is_empty());
    /// ```
    pub fn trace_events(&self) -> Vec<TraceEvent> {
        lock(&self.world).net.trace.events.clone()
    }

    /// Forgets the trace recorded so far.
    pub fn clear_trace(&self) {
        lock(&self.world).net.trace.events.clear();
    }

    /// Writes the trace as Chrome trace-event JSON (`{"traceEvents":[...]}`), loadable in
    /// Perfetto or `chrome://tracing`: one process per device (`pid` = device index,
    /// named after the device), one thread per queue pair (`tid` = QPN, named
    /// `QP 0x11`), instant events with `ts` in microseconds and their details in `args`.
    /// The same trace always gives the same bytes.
    ///
    /// # Errors
    /// Whatever `out` returns.
    ///
    /// ```
    /// use zverbs_sim::*;
    /// let f = Fabric::with_config(FabricConfig { trace: true, ..FabricConfig::stepped(0) }, 1);
    /// let mut json = Vec::new();
    /// f.write_chrome_trace(&mut json).unwrap();
    /// assert!(String::from_utf8(json).unwrap().contains("\"sim0\""));
    /// ```
    pub fn write_chrome_trace(&self, out: &mut impl io::Write) -> io::Result<()> {
        let w = lock(&self.world);
        let names: Vec<String> = w.tables.devices.iter().map(|d| d.name.clone()).collect();
        write_chrome(out, &names, &w.net.trace.events)
    }
}

/// An event of port 1, the simulated devices' one port.
fn port_event(kind: AsyncEventKind) -> AsyncEvent {
    AsyncEvent {
        kind,
        element: EventElement::Port(1),
    }
}
