//! Completion queues, polled into caller-owned arrays.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::{provider::sim::Sim, CompletionQueue, Context, WorkCompletion};
//! let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
//! let cq = CompletionQueue::create(&ctx, 16).unwrap();
//! let mut wcs = [WorkCompletion::EMPTY; 8];
//! assert_eq!(cq.poll(&mut wcs).unwrap(), 0);
//! # }
//! ```

use crate::device::Context;
use crate::error::{verb, Error};
use crate::provider::Provider;
use crate::types::WorkCompletion;

/// A completion queue of fixed depth.
pub struct CompletionQueue<P: Provider> {
    pub(crate) raw: P::Cq,
    depth: u32,
}

impl<P: Provider> CompletionQueue<P> {
    /// Creates a queue with room for `depth` completions.
    pub fn create(ctx: &Context<P>, depth: u32) -> Result<Self, Error<P::Error>> {
        if depth == 0 {
            return Err(Error::InvalidAttribute(
                "completion queue depth must be at least 1",
            ));
        }
        Ok(CompletionQueue {
            raw: verb("ibv_create_cq", P::create_cq(&ctx.raw, depth))?,
            depth,
        })
    }

    /// Polls up to `out.len()` completions into `out`, oldest first; returns how many.
    /// Never blocks, never allocates.
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Error<P::Error>> {
        verb("ibv_poll_cq", P::poll_cq(&self.raw, out))
    }

    /// The depth asked at creation.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Cq {
        &self.raw
    }
}
