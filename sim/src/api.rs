//! The public handles: thin wrappers that lock the fabric's world and call into it.
//!
//! One mutex guards the whole fabric. Every call locks it once. In threaded mode every
//! call first processes the events that are due by the wall clock, and posts process the
//! events they make due before unlocking (with the instant link model of
//! [`Fabric::with_devices`] that is all the work they enable). In stepped mode handle calls
//! never advance time, except an auto-stepping [`Cq::poll`]. Dropping a handle destroys
//! its object; a PD or CQ still used by other objects lingers (unreachable) until they
//! are gone.

use core::fmt;
#[cfg(loom)]
use loom::sync::{Arc, Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::PoisonError;
#[cfg(not(loom))]
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::{FabricConfig, Mode};
use crate::mem::{RawInline, Region};
use crate::state::World;
use crate::types::*;

pub(crate) type Shared = Arc<Mutex<World>>;

/// Events an auto-stepping poll runs at most per call.
const AUTO_STEP_BUDGET: usize = 1 << 16;

/// Locks the world; a panic elsewhere does not poison it for the other handles.
pub(crate) fn lock(w: &Mutex<World>) -> MutexGuard<'_, World> {
    w.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks the world and, in threaded mode, processes the events that are due.
pub(crate) fn enter(w: &Mutex<World>) -> MutexGuard<'_, World> {
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
            world: Arc::new(Mutex::new(World::new(cfg))),
        };
        for i in 0..n {
            f.add_device(&format!("sim{i}")).expect("fresh device name");
        }
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
            let Some(name) = enter(&self.world).devices.get(i).map(|d| d.name.clone()) else {
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
        let dev = w.devices.iter().position(|d| d.name == name);
        Ok(Context {
            world: self.world.clone(),
            dev: dev.ok_or(SimError::NotFound)?,
        })
    }
}

/// An open device (`ibv_context`).
#[derive(Debug)]
pub struct Context {
    pub(crate) world: Shared,
    pub(crate) dev: usize,
}

impl Context {
    /// The device's index in the fabric (its position in order of addition, from 0), as
    /// taken by the fault controls of [`Fabric`].
    pub fn device_index(&self) -> usize {
        self.dev
    }

    /// The device's name.
    pub fn name(&self) -> String {
        enter(&self.world).devices[self.dev].name.clone()
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
        let dev = &w.devices[self.dev];
        let up = dev.link_up && !dev.crashed;
        Ok(PortAttr {
            state: if up {
                PortState::Active
            } else {
                PortState::Down
            },
            lid: w.devices[self.dev].lid,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_table_len: w.devices[self.dev].gids.len() as u16,
        })
    }

    /// GID `index` of `port`.
    ///
    /// # Errors
    /// [`SimError::NotFound`] for a port other than 1 or an index past the table.
    pub fn query_gid(&self, port: u8, index: u8) -> Result<Gid, SimError> {
        let w = enter(&self.world);
        let gids = &w.devices[self.dev].gids;
        let gid = gids.get(usize::from(index)).filter(|_| port == 1);
        gid.copied().ok_or(SimError::NotFound)
    }

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// None today; the `Result` mirrors `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd, SimError> {
        let id = enter(&self.world).alloc_pd(self.dev);
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
        let id = w.create_cq(self.dev, depth)?;
        let ready = w.cqs.get(id).expect("new CQ").ready.clone();
        Ok(Cq {
            world: self.world.clone(),
            id,
            depth,
            ready,
            pending: w.events.pending_flag(),
        })
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct Pd {
    world: Shared,
    id: usize,
}

impl Drop for Pd {
    fn drop(&mut self) {
        enter(&self.world).release_pd(self.id, true);
    }
}

/// Attributes of a new queue pair (`ibv_qp_init_attr`, RC only).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// Completion queue of send work requests.
    pub send_cq: &'a Cq,
    /// Completion queue of receive work requests.
    pub recv_cq: &'a Cq,
    /// Queue capacities.
    pub cap: QpCap,
    /// Whether every send work request is signaled.
    pub sq_sig_all: bool,
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
        access: Access,
    ) -> Result<Mr, SimError> {
        let writable = access.contains(Access::LOCAL_WRITE);
        // SAFETY: the caller keeps the range valid (writable when LOCAL_WRITE) until the Mr
        // is dropped; `Mr::drop` removes the region from the world before returning.
        let region = unsafe { Region::new(addr, len, writable) };
        let (idx, lkey, rkey) = enter(&self.world).register_mr(self.id, region, access)?;
        Ok(Mr {
            world: self.world.clone(),
            idx,
            lkey,
            rkey,
            addr: addr as u64,
            len,
        })
    }

    /// Creates a reliable-connected queue pair in the RESET state.
    ///
    /// # Errors
    /// [`SimError::Invalid`] if a capacity is out of range (see [`QpCap`]) or a CQ belongs
    /// to another device or fabric; [`SimError::QueueFull`] when out of QP numbers.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Qp, SimError> {
        let same = |cq: &Cq| Arc::ptr_eq(&cq.world, &self.world);
        if !same(attr.send_cq) || !same(attr.recv_cq) {
            return Err(SimError::Invalid("CQ of another fabric"));
        }
        let cqs = (attr.send_cq.id, attr.recv_cq.id);
        let (id, qpn) = enter(&self.world).create_qp(self.id, cqs, attr.cap, attr.sq_sig_all)?;
        Ok(Qp {
            world: self.world.clone(),
            id,
            qpn,
            cap: attr.cap,
        })
    }
}

/// A registered memory region (`ibv_mr`); dropping it deregisters the memory.
#[derive(Debug)]
pub struct Mr {
    world: Shared,
    idx: usize,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
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
        enter(&self.world).deregister_mr(self.idx);
    }
}

/// A completion queue (`ibv_cq`).
#[derive(Debug)]
pub struct Cq {
    pub(crate) world: Shared,
    pub(crate) id: usize,
    depth: u32,
    /// The world's `CqObj::ready`: false lets an empty poll return without the lock...
    ready: std::sync::Arc<crate::padded::Padded<AtomicBool>>,
    /// ... unless events are scheduled (`Events::pending_flag`).
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
    /// # Errors
    /// [`SimError::CqOverflow`] once the queue has overflowed (for good).
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize, SimError> {
        self.poll_map(out, |wc| *wc)
    }

    /// Like [`Cq::poll`], but stores `f(completion)` into `out`: an adapter converts
    /// completions into its own type in place, with no intermediate buffer.
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// # let f = Fabric::with_devices(1);
    /// # let cq = f.open_device("sim0").unwrap().create_cq(4).unwrap();
    /// let mut ids = [0u64; 4];
    /// assert_eq!(cq.poll_map(&mut ids, |wc| wc.wr_id), Ok(0));
    /// ```
    ///
    /// # Errors
    /// As [`Cq::poll`].
    pub fn poll_map<T>(
        &self,
        out: &mut [T],
        mut f: impl FnMut(&Wc) -> T,
    ) -> Result<usize, SimError> {
        // Untimed fabric, nothing queued and nothing scheduled: no need to take the lock,
        // which a thread spinning on an empty CQ would otherwise hold against the thread
        // posting the work it waits for. `ready` is cleared only under the lock with the
        // CQ and the event queue empty, and set by every push; `pending` is read first:
        // if no event was scheduled then and `ready` is still clear, there was an instant
        // with nothing queued and nothing to run. (Under loom every poll locks.)
        #[cfg(not(loom))]
        if !self.pending.load(Ordering::Acquire) && !self.ready.load(Ordering::Acquire) {
            return Ok(0);
        }
        let mut w = enter(&self.world);
        if w.cfg.mode == Mode::Stepped && w.cfg.auto_step {
            let waiting = |w: &World| {
                let cq = w.cqs.get(self.id).expect("live CQ");
                cq.entries.is_empty() && !cq.overflowed
            };
            let mut budget = AUTO_STEP_BUDGET;
            while budget > 0 && waiting(&w) && w.step() {
                budget -= 1;
            }
        }
        let cq = w.cqs.get_mut(self.id).expect("live CQ");
        if cq.overflowed {
            return Err(SimError::CqOverflow);
        }
        let n = out.len().min(cq.entries.len());
        for (slot, wc) in out.iter_mut().zip(cq.entries.drain(..n)) {
            *slot = f(&wc);
        }
        // Cleared under the lock, which every push takes before setting it again: a poll
        // that sees it clear is ordered before the next push.
        if cq.entries.is_empty() && w.untimed && w.events.is_empty() {
            self.ready.store(false, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Number of completions the queue holds.
    pub fn depth(&self) -> u32 {
        self.depth
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let mut w = enter(&self.world);
        w.detach_cq(self.id);
        w.release_cq(self.id, true);
    }
}

/// A synchronous posting error (`bad_wr` plus `errno`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Position of the first work request NOT posted; the earlier ones were posted.
    pub index: usize,
    /// Why it was refused.
    pub error: SimError,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} not posted: {}", self.index, self.error)
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A reliable-connected queue pair (`ibv_qp`); dropping it destroys it, discarding
/// outstanding work without completions.
#[derive(Debug)]
pub struct Qp {
    world: Shared,
    id: usize,
    qpn: u32,
    cap: QpCap,
}

impl Qp {
    /// The queue pair number, unique in the fabric.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        enter(&self.world).qps.get(self.id).expect("live QP").state
    }

    /// Capacities granted (exactly those asked).
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// What the queue pair did so far: doorbells, posts, send completions (see
    /// [`QpCounters`](crate::QpCounters)).
    pub fn counters(&self) -> crate::QpCounters {
        enter(&self.world)
            .qps
            .get(self.id)
            .expect("live QP")
            .counters
    }

    /// The queue pair's attributes (`ibv_query_qp`): the state, the attributes of the RTR
    /// and RTS transitions as applied, and the PSNs in use now.
    pub fn query(&self) -> QpAttr {
        let w = enter(&self.world);
        let qp = w.qps.get(self.id).expect("live QP");
        QpAttr {
            state: qp.state,
            rtr: qp.rtr,
            rts: qp.rts,
            sq_psn: qp.req.next_psn,
            rq_psn: qp.resp.epsn,
        }
    }

    /// Moves the queue pair to another state (see [`Modify`] for the legal transitions).
    ///
    /// # Errors
    /// [`SimError::Invalid`] for an illegal transition or attribute; the state is unchanged.
    pub fn modify(&self, m: &Modify) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        let res = w.modify(self.id, m);
        w.run_due();
        res
    }

    /// Posts send work requests in order; each goes on the wire at once. INLINE entries are copied
    /// now; their SGEs must lie in memory registered in this QP's PD (their lkeys are not
    /// checked). See [`Qp::post_send_raw`] for inline data from unregistered memory.
    ///
    /// In ERR the requests are accepted and complete at once with `WrFlushErr`.
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] outside RTS/ERR or once
    /// the device crashed, for too
    /// many SGEs, or for bad inline data; [`SimError::QueueFull`] when all `max_send_wr`
    /// slots are held (an unsignaled request holds its slot until a later one completes
    /// with a completion).
    pub fn post_send<I: IntoIterator<Item = SendWr>>(&self, wrs: I) -> Result<(), PostError> {
        self.post_sends(wrs, None)
    }

    /// Like [`Qp::post_send`], but INLINE SGEs are read straight from their addresses, as
    /// a real driver does, and need not be registered.
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// For every request with [`SendFlags::INLINE`], each SGE's `addr..addr + length` must
    /// be valid for reads during this call.
    pub unsafe fn post_send_raw<I: IntoIterator<Item = SendWr>>(
        &self,
        wrs: I,
    ) -> Result<(), PostError> {
        // SAFETY: the caller vouches for the inline SGE ranges, which are read only inside
        // this call.
        let raw = unsafe { RawInline::new() };
        self.post_sends(wrs, Some(&raw))
    }

    fn post_sends<I: IntoIterator<Item = SendWr>>(
        &self,
        wrs: I,
        raw: Option<&RawInline>,
    ) -> Result<(), PostError> {
        let mut wrs = wrs.into_iter();
        let next = |slot: &mut SendWr| wrs.next().map(|wr| *slot = wr).is_some();
        self.post_send_list(next, raw)
    }

    /// Posts send work requests built in place: `fill(i, wr)` writes request `i` (of `n`)
    /// into a scratch request whose gather entries past the `num_sge` it sets are left over
    /// from earlier requests (only the first `num_sge` are read). INLINE entries are read
    /// straight from their addresses, as with [`Qp::post_send_raw`]. This is the form
    /// without copies of whole requests: an adapter converting its own request type fills
    /// only the fields and entries it uses.
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// # let f = Fabric::with_devices(1);
    /// # let ctx = f.open_device("sim0").unwrap();
    /// # let pd = ctx.alloc_pd().unwrap();
    /// # let cq = ctx.create_cq(8).unwrap();
    /// # let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    /// # let qp = pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false }).unwrap();
    /// // In RESET a post is refused; the error names request 0.
    /// let res = unsafe {
    ///     qp.post_send_raw_with(2, |i, wr| {
    ///         (wr.wr_id, wr.op, wr.flags, wr.num_sge) = (i as u64, SendOp::Send, SendFlags::SIGNALED, 0);
    ///     })
    /// };
    /// assert_eq!(res.unwrap_err().index, 0);
    /// ```
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// As [`Qp::post_send_raw`].
    pub unsafe fn post_send_raw_with(
        &self,
        n: usize,
        mut fill: impl FnMut(usize, &mut SendWr),
    ) -> Result<(), PostError> {
        // SAFETY: the caller vouches for the inline SGE ranges, which are read only inside
        // this call.
        let raw = unsafe { RawInline::new() };
        let mut i = 0;
        let next = |slot: &mut SendWr| {
            let more = i < n;
            if more {
                fill(i, slot);
                i += 1;
            }
            more
        };
        self.post_send_list(next, Some(&raw))
    }

    fn post_send_list(
        &self,
        next: impl FnMut(&mut SendWr) -> bool,
        raw: Option<&RawInline>,
    ) -> Result<(), PostError> {
        let mut w = enter(&self.world);
        let res = w.post_send_list(self.id, next, raw);
        w.run_due();
        res.map_err(|(index, error)| PostError { index, error })
    }

    /// Posts receive work requests in order.
    ///
    /// In ERR the requests are accepted and complete at once with `WrFlushErr`.
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] in RESET or for too many
    /// SGEs; [`SimError::QueueFull`] when `max_recv_wr` requests are queued.
    pub fn post_recv<I: IntoIterator<Item = RecvWr>>(&self, wrs: I) -> Result<(), PostError> {
        let mut wrs = wrs.into_iter();
        self.post_recv_list(|slot| wrs.next().map(|wr| *slot = wr).is_some())
    }

    /// Posts receive work requests built in place, as [`Qp::post_send_raw_with`] does
    /// for sends: `fill(i, wr)` writes request `i` (of `n`) into a scratch request whose
    /// scatter entries past the `num_sge` it sets are left over from earlier requests.
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// # let f = Fabric::with_devices(1);
    /// # let ctx = f.open_device("sim0").unwrap();
    /// # let pd = ctx.alloc_pd().unwrap();
    /// # let cq = ctx.create_cq(8).unwrap();
    /// # let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    /// # let qp = pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false }).unwrap();
    /// // In RESET a receive is refused; the error names request 0.
    /// let res = qp.post_recv_with(3, |i, wr| (wr.wr_id, wr.num_sge) = (i as u64, 0));
    /// assert_eq!(res.unwrap_err().index, 0);
    /// ```
    ///
    /// # Errors
    /// As [`Qp::post_recv`].
    pub fn post_recv_with(
        &self,
        n: usize,
        mut fill: impl FnMut(usize, &mut RecvWr),
    ) -> Result<(), PostError> {
        let mut i = 0;
        self.post_recv_list(|slot| {
            let more = i < n;
            if more {
                fill(i, slot);
                i += 1;
            }
            more
        })
    }

    fn post_recv_list(&self, mut next: impl FnMut(&mut RecvWr) -> bool) -> Result<(), PostError> {
        let mut wr = RecvWr {
            wr_id: 0,
            sg_list: [Sge::default(); MAX_SGE],
            num_sge: 0,
        };
        let mut w = enter(&self.world);
        let mut res = Ok(());
        let mut posted = 0;
        for index in 0.. {
            if !next(&mut wr) {
                break;
            }
            if let Err(error) = w.post_recv(self.id, &wr) {
                res = Err(PostError { index, error });
                break;
            }
            posted += 1;
        }
        w.count_posts(self.id, false, posted);
        w.run_due();
        res
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        enter(&self.world).destroy_qp(self.id);
    }
}
