//! The public handles: thin wrappers that lock the fabric's world and call into it.
//!
//! One gate guards the whole fabric (`gate.rs`). Every call takes it exclusively once,
//! except a poll with no events scheduled, which reads the CQ's ring alone
//! (`hca/cq_buf.rs`), a receive post on an open queue (`hca/rq.rs`), and a send list the
//! untimed fabric's direct path takes on the queue pair's own lane (`hca/direct.rs`). In threaded mode every
//! call first processes the events that are due by the wall clock, and posts process the
//! events they make due before unlocking (with the instant link model of
//! [`Fabric::with_devices`] that is all the work they enable). In stepped mode handle calls
//! never advance time, except an auto-stepping [`Cq::poll`]. Dropping a handle destroys
//! its object; a PD or CQ still used by other objects lingers (unreachable) until they
//! are gone.

#[cfg(loom)]
use loom::sync::Arc;
use std::sync::atomic::AtomicBool;
#[cfg(not(loom))]
use std::sync::Arc;

use crate::config::{FabricConfig, Mode};
use crate::gate::{Exclusive, Gate};
use crate::hca::mem::{RawInline, Region};
use crate::hca::World;
use crate::types::*;

pub(crate) mod comp_channel;
pub(crate) mod device_mem;
mod fabric;
pub(crate) mod qp;
pub(crate) mod srq;

pub(crate) type Shared = Arc<Gate<World>>;

/// Events an auto-stepping poll runs at most per call.
const AUTO_STEP_BUDGET: usize = 1 << 16;

/// Takes the world exclusively (`gate.rs`); a panic elsewhere does not poison it for the
/// other handles.
pub(crate) fn lock(w: &Gate<World>) -> Exclusive<'_, World> {
    w.lock()
}

/// Takes the world exclusively and, in threaded mode, processes the events that are due.
pub(crate) fn enter(w: &Gate<World>) -> Exclusive<'_, World> {
    let mut g = lock(w);
    g.run_due();
    g
}

/// A simulated fabric: a set of devices (HCAs) that can reach each other.
///
/// Clones share the same fabric.
#[derive(Clone, Debug)]
pub struct Fabric {
    pub(crate) world: Shared,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new()
    }
}

impl Fabric {
    /// An empty fabric with no devices, configured by [`FabricConfig::instant`]: threaded,
    /// zero latency, infinite bandwidth, instant timers.
    pub fn new() -> Fabric {
        Fabric::with_config(FabricConfig::instant(), 0)
    }

    /// A fabric with `n` devices named `sim0` .. `sim{n-1}`, configured like
    /// [`Fabric::new`].
    ///
    /// # Panics
    /// If `n` exceeds the 49,151 unicast LIDs a subnet has.
    pub fn with_devices(n: usize) -> Fabric {
        Fabric::with_config(FabricConfig::instant(), n)
    }

    /// A fabric configured by `cfg` with `n` devices named `sim0` .. `sim{n-1}`.
    ///
    /// # Panics
    /// If `n` exceeds the 49,151 unicast LIDs a subnet has.
    ///
    /// ```
    /// use zverbs_sim::*;
    /// let f = Fabric::with_config(FabricConfig::stepped(7), 3);
    /// assert_eq!(f.device_index("sim2"), Some(2));
    /// assert!(!f.step()); // nothing to do yet
    /// ```
    pub fn with_config(cfg: FabricConfig, n: usize) -> Fabric {
        let f = Fabric {
            world: Arc::new(Gate::new(
                World::new(cfg),
                cfg.mode == Mode::Threaded && cfg.send_lanes,
            )),
        };
        for i in 0..n {
            f.add_device(&format!("sim{i}")).expect("fresh device name");
        }
        comp_channel::start_clock(&f.world, &mut lock(&f.world));
        f
    }

    /// Adds a device. Device `i` (in order of addition, from 0) gets LID `i + 1` and GIDs
    /// `fe80::<lid>` and `::ffff:10.0.0.<i + 1>`.
    ///
    /// # Errors
    /// [`SimError::Invalid`] if `name` is empty or taken; [`SimError::QueueFull`] past the
    /// last unicast LID.
    pub fn add_device(&self, name: &str) -> Result<(), SimError> {
        enter(&self.world).add_device(name)
    }

    /// Calls `f` with each device's name, in order of addition. `f` may use the fabric.
    pub fn for_each_device(&self, f: &mut dyn FnMut(&str)) {
        for i in 0.. {
            let Some(name) = enter(&self.world)
                .tables
                .devices
                .get(i)
                .map(|d| d.name.clone())
            else {
                break;
            };
            f(&name);
        }
    }

    /// Opens a device by name.
    ///
    /// # Errors
    /// [`SimError::NotFound`] if no device has that name.
    pub fn open_device(&self, name: &str) -> Result<Context, SimError> {
        let w = enter(&self.world);
        let dev = w.tables.device_named(name);
        Ok(Context {
            world: self.world.clone(),
            dev: dev.ok_or(SimError::NotFound)?,
            events: std::sync::OnceLock::new(),
        })
    }
}

/// An open device (`ibv_context`).
#[derive(Debug)]
pub struct Context {
    pub(crate) world: Shared,
    pub(crate) dev: usize,
    /// Its asynchronous event queue, from the first time it is asked for.
    events: std::sync::OnceLock<usize>,
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(&q) = self.events.get() {
            enter(&self.world).tables.async_events.close(q);
        }
    }
}

impl Context {
    /// The descriptor of this context's asynchronous events (`async_fd`): readable while
    /// events are queued. The queue exists from the first call of this or
    /// [`get_async_event`](Self::get_async_event); what happened before is not in it.
    ///
    /// # Errors
    /// [`SimError::QueueFull`] when no descriptor can be made (out of descriptors).
    pub fn async_fd(&self) -> Result<std::os::fd::RawFd, SimError> {
        let q = self.async_queue()?;
        let w = enter(&self.world);
        w.tables.async_events.fd(q).ok_or(SimError::NotFound)
    }

    /// This context's oldest asynchronous event, without waiting (`ibv_get_async_event`
    /// on a non-blocking descriptor, with its `ibv_ack_async_event`).
    ///
    /// ```
    /// use zverbs_sim::{AsyncEventKind, EventElement, Fabric};
    /// let f = Fabric::with_devices(1);
    /// let ctx = f.open_device("sim0").unwrap();
    /// assert_eq!(ctx.get_async_event().unwrap(), None);
    /// f.link_down(0).unwrap();
    /// let ev = ctx.get_async_event().unwrap().unwrap();
    /// assert_eq!((ev.kind, ev.element), (AsyncEventKind::PortErr, EventElement::Port(1)));
    /// ```
    ///
    /// # Errors
    /// As [`async_fd`](Self::async_fd).
    pub fn get_async_event(&self) -> Result<Option<AsyncEvent>, SimError> {
        let q = self.async_queue()?;
        Ok(enter(&self.world).tables.async_events.take(q))
    }

    fn async_queue(&self) -> Result<usize, SimError> {
        if let Some(&q) = self.events.get() {
            return Ok(q);
        }
        let mut w = enter(&self.world);
        // Under the world's lock: one queue, whoever asks first.
        if let Some(&q) = self.events.get() {
            return Ok(q);
        }
        let q = w.tables.async_events.open(self.dev)?;
        let _ = self.events.set(q);
        Ok(q)
    }

    /// The device's index in the fabric (its position in order of addition, from 0), as
    /// taken by the fault controls of [`Fabric`].
    pub fn device_index(&self) -> usize {
        self.dev
    }

    /// The device's name.
    pub fn name(&self) -> String {
        enter(&self.world).tables.devices[self.dev].name.clone()
    }

    /// Attributes of `port` (only port 1 exists).
    ///
    /// # Errors
    /// [`SimError::NotFound`] for any other port.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, SimError> {
        if port != 1 {
            return Err(SimError::NotFound);
        }
        let w = enter(&self.world);
        let port = &w.net.wire.ports[self.dev];
        let up = port.link_up && !port.crashed;
        Ok(PortAttr {
            state: if up {
                PortState::Active
            } else {
                PortState::Down
            },
            lid: w.tables.devices[self.dev].lid,
            max_mtu: crate::config::PORT_MTU,
            active_mtu: crate::config::PORT_MTU,
            gid_table_len: w.tables.devices[self.dev].gids.len() as u16,
        })
    }

    /// The device's limits and capabilities (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        let cfg = enter(&self.world).net.cfg;
        let atomic_cap = cfg.atomic_cap;
        DeviceAttr {
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE as u32,
            max_cqe: MAX_CQE,
            max_qp_rd_atom: MAX_QP_RD_ATOM.into(),
            max_qp_init_rd_atom: MAX_QP_RD_ATOM.into(),
            max_mr_size: usize::MAX as u64,
            atomic_cap,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_SRQ_WR,
            max_srq_sge: MAX_SGE as u32,
            dmabuf: cfg.personality != crate::config::Personality::Rxe,
        }
    }

    /// GID `index` of `port`.
    ///
    /// # Errors
    /// [`SimError::NotFound`] for a port other than 1 or an index past the table.
    pub fn query_gid(&self, port: u8, index: u8) -> Result<Gid, SimError> {
        let w = enter(&self.world);
        let gids = &w.tables.devices[self.dev].gids;
        let gid = gids.get(usize::from(index)).filter(|_| port == 1);
        gid.copied().ok_or(SimError::NotFound)
    }

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// None today; the `Result` mirrors `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd, SimError> {
        let id = enter(&self.world).tables.alloc_pd(self.dev);
        Ok(Pd {
            world: self.world.clone(),
            id,
        })
    }

    /// Creates a completion queue holding up to `depth` completions.
    ///
    /// # Errors
    /// [`SimError::Invalid`] unless `1 <= depth <= MAX_CQE`.
    pub fn create_cq(&self, depth: u32) -> Result<Cq, SimError> {
        let mut w = enter(&self.world);
        let lazy = w.net.cfg.lazy_queues;
        let id = w.tables.create_cq(self.dev, depth, lazy)?;
        let buf = w.tables.cqs.get(id).expect("new CQ").buf.reader();
        // A poll locks to run what is due (threaded) or to step (auto-step); stepped
        // without auto-step it would lock for nothing.
        let manual = w.net.cfg.mode == Mode::Stepped && !w.net.cfg.auto_step;
        let events = &w.net.sched.events;
        Ok(Cq {
            world: self.world.clone(),
            id,
            depth,
            buf,
            pending: if manual {
                events.quiet_flag()
            } else {
                events.pending_flag()
            },
        })
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct Pd {
    pub(super) world: Shared,
    pub(super) id: usize,
}

impl Drop for Pd {
    fn drop(&mut self) {
        enter(&self.world).tables.release_pd(self.id, true);
    }
}

impl Pd {
    /// Registers `addr..addr + len` (any length, including 0) with `access`.
    ///
    /// # Errors
    /// [`SimError::Invalid`] if `access` has REMOTE_WRITE or REMOTE_ATOMIC without
    /// LOCAL_WRITE; [`SimError::QueueFull`] when out of memory keys.
    ///
    /// # Safety
    /// `addr..addr + len` must stay valid for reads and writes (as the access flags allow)
    /// until the [`Mr`] is dropped, and must not be accessed through Rust references while
    /// work that touches it is outstanding.
    pub unsafe fn register_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr, SimError> {
        let writable = access.contains(AccessFlags::LOCAL_WRITE);
        // SAFETY: the caller keeps the range valid (writable when LOCAL_WRITE) until the Mr
        // is dropped; `Mr::drop` removes the region from the world before returning.
        let region = unsafe { Region::new(addr, len, writable) };
        let (idx, lkey, rkey) = enter(&self.world)
            .tables
            .register_mr(self.id, region, access)?;
        Ok(Mr {
            world: self.world.clone(),
            idx,
            lkey,
            rkey,
            addr: addr as u64,
            len,
        })
    }
}

/// A registered memory region (`ibv_mr`); dropping it deregisters the memory.
#[derive(Debug)]
pub struct Mr {
    pub(super) world: Shared,
    pub(super) idx: usize,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) addr: u64,
    pub(super) len: usize,
}

impl Mr {
    /// Local key, for SGEs of local work requests.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key, for peers' RDMA and atomic operations.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Start address of the region.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        enter(&self.world).tables.deregister_mr(self.idx);
    }
}

/// A completion queue (`ibv_cq`).
#[derive(Debug)]
pub struct Cq {
    pub(crate) world: Shared,
    pub(crate) id: usize,
    depth: u32,
    /// The CQ's completions, read without the world's lock...
    buf: std::sync::Arc<crate::hca::cq_buf::CqBuf>,
    /// ... unless events are scheduled (`Events::pending_flag`): then a poll locks to run
    /// those that are due.
    #[cfg_attr(loom, allow(dead_code))]
    pending: std::sync::Arc<crate::padded::Padded<AtomicBool>>,
}

impl Cq {
    /// Moves up to `out.len()` completions, oldest first, into `out`; returns how many.
    ///
    /// Threaded mode: first processes the events that are due. Stepped mode with
    /// [`FabricConfig::auto_step`]: if the queue is empty, first steps the engine until it
    /// is not, no events remain, or 65,536 events have run.
    ///
    /// For an error completion the simulator still reports the opcode of the work request
    /// (hardware leaves it undefined).
    ///
    /// # Errors
    /// [`SimError::CqOverflow`] once the queue has overflowed (for good).
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, SimError> {
        // Nothing scheduled: the buffer is all there is to read, without the world's lock,
        // which a thread spinning on its CQ would otherwise hold against the thread posting
        // the work it waits for. (Under loom every poll locks, as it did before the buffer
        // was read apart.)
        #[cfg(not(loom))]
        if !self.pending.load(std::sync::atomic::Ordering::Acquire) {
            return self.buf.poll(out);
        }
        let mut w = enter(&self.world);
        if w.net.cfg.mode == Mode::Stepped && w.net.cfg.auto_step {
            let mut budget = AUTO_STEP_BUDGET;
            while budget > 0 && self.buf.is_empty() && w.step() {
                budget -= 1;
            }
        }
        self.buf.poll(out)
    }

    /// Number of completions the queue holds.
    pub fn depth(&self) -> u32 {
        self.depth
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let mut w = enter(&self.world);
        w.tables.detach_cq(self.id);
        w.tables.release_cq(self.id, true);
    }
}
