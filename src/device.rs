//! Devices and protection domains: the first two objects of every program.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::{provider::sim::Sim, Context};
//! let sim = Sim::with_devices(1);
//! let ctx = Context::open(&sim, "sim0").unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let mut buf = [0u8; 64];
//! let mr = pd.register(&mut buf).unwrap();
//! assert_eq!(mr.len(), 64);
//! # }
//! ```

use crate::error::{verb, Error};
use crate::provider::Provider;
use crate::types::{AsyncEvent, DeviceAttr, Gid, PortAttr};

/// An open RDMA device.
pub struct Context<P: Provider> {
    pub(crate) raw: P::Context,
    /// The device's attributes, read when it was opened (they do not change).
    attr: DeviceAttr,
}

impl<P: Provider> Context<P> {
    /// Opens the device called `name`.
    pub fn open(provider: &P, name: &str) -> Result<Self, Error<P::Error>> {
        let raw = verb("ibv_open_device", provider.open_device(name))?;
        let attr = verb("ibv_query_device", P::query_device(&raw))?;
        Ok(Context { raw, attr })
    }

    /// The device's limits and capabilities (`ibv_query_device`, read when the context
    /// was opened: they do not change while it is open). Queue pairs and completion queues
    /// are checked against them where they are made.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// use zverbs::{provider::sim::Sim, AtomicCap, Context};
    /// let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
    /// assert_eq!(ctx.query_device().unwrap().atomic_cap, AtomicCap::Hca);
    /// # }
    /// ```
    pub fn query_device(&self) -> Result<DeviceAttr, Error<P::Error>> {
        Ok(self.attr)
    }

    /// Queries port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, Error<P::Error>> {
        verb("ibv_query_port", P::query_port(&self.raw, port))
    }

    /// Reads GID table entry `index` of port `port`. GID indices are `u8` throughout, as in
    /// the address vector (`ibv_global_route.sgid_index`): an entry past 255 cannot be used
    /// for a path.
    pub fn query_gid(&self, port: u8, index: u8) -> Result<Gid, Error<P::Error>> {
        verb("ibv_query_gid", P::query_gid(&self.raw, port, index))
    }

    /// The oldest of the device's asynchronous events queued for this context
    /// (`ibv_get_async_event`, acknowledged at once), without waiting; `None` when there is
    /// none. What they report is outside any work request: a port going down or up
    /// (`PortErr`, `PortActive`), the device dying (`DeviceFatal`), a completion queue
    /// overflowing (`CqErr`, naming it by [`CompletionQueue::key`](crate::CompletionQueue::key)).
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::{AsyncEventKind, Context, EventElement};
    /// let sim = Sim::with_devices(1);
    /// let ctx = Context::open(&sim, "sim0").unwrap();
    /// assert_eq!(ctx.next_async_event().unwrap(), None);
    /// sim.fabric().link_down(0).unwrap();
    /// let ev = ctx.wait_async_event(None).unwrap().unwrap();
    /// assert_eq!((ev.kind, ev.element), (AsyncEventKind::PortErr, EventElement::Port(1)));
    /// # }
    /// ```
    ///
    /// The simulator queues a context's events from the first time they are asked for
    /// (this call, [`wait_async_event`](Self::wait_async_event) or
    /// [`async_event_fd`](Self::async_event_fd)); the verbs library from the device's
    /// opening.
    pub fn next_async_event(&self) -> Result<Option<AsyncEvent>, Error<P::Error>> {
        verb("ibv_get_async_event", P::get_async_event(&self.raw))
    }

    /// The next asynchronous event, sleeping on the descriptor until one comes or
    /// `timeout` passes (`None`: no bound; `Some(Duration::ZERO)` only looks).
    #[cfg(all(feature = "std", unix))]
    pub fn wait_async_event(
        &self,
        timeout: Option<std::time::Duration>,
    ) -> Result<Option<AsyncEvent>, Error<P::Error>> {
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        loop {
            if let Some(ev) = self.next_async_event()? {
                return Ok(Some(ev));
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left == Some(std::time::Duration::ZERO) {
                return Ok(None);
            }
            // An error of poll(2) ends this sleep only: the deadline bounds the loop.
            let _ = crate::event::wait_fd(self.async_event_fd(), left.or(timeout));
        }
    }

    /// The descriptor of the device's asynchronous events, readable while events are
    /// queued for this context: for an event loop of your own.
    #[cfg(all(feature = "std", unix))]
    pub fn async_event_fd(&self) -> std::os::fd::RawFd {
        P::async_event_fd(&self.raw)
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain<P>, Error<P::Error>> {
        Ok(ProtectionDomain {
            raw: verb("ibv_alloc_pd", P::alloc_pd(&self.raw))?,
        })
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Context {
        &self.raw
    }
}

/// A protection domain: memory regions and queue pairs of one domain may be used together.
pub struct ProtectionDomain<P: Provider> {
    pub(crate) raw: P::Pd,
}

impl<P: Provider> ProtectionDomain<P> {
    /// The backend's handle.
    pub fn raw(&self) -> &P::Pd {
        &self.raw
    }
}
