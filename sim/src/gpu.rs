//! A GPU behind the simulator's device memory (feature `cuda`): CUDA managed memory
//! (`cuMemAllocManaged`), which the host and the GPU address at the same pointer and the
//! driver keeps coherent, moving pages between them with the copy engine. The simulator's
//! data path writes and reads it as it does any device block (atomic accesses through the
//! host pointer), so a peer's RDMA write lands in GPU memory, and a CUDA read (a kernel,
//! a `cuMemcpyDtoH`) sees the bytes. cudarc loads the driver at run time; on a machine
//! without one the allocation fails with `NotFound`.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use crate::types::SimError;

/// One managed allocation on a GPU, freed on drop.
#[derive(Debug)]
pub(crate) struct Managed {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

// SAFETY: the allocation is a plain range of memory, reachable from any thread (the host
// side of managed memory is ordinary memory); the context is Send + Sync.
unsafe impl Send for Managed {}
// SAFETY: shared use only reads the pointer; the bytes are accessed atomically (`mem.rs`).
unsafe impl Sync for Managed {}

impl Managed {
    /// `len` bytes (at least one) on GPU `ordinal`, zeroed. [`SimError::NotFound`] when
    /// there is no such GPU (or no driver), [`SimError::QueueFull`] when it has no room.
    pub(crate) fn alloc(ordinal: usize, len: usize) -> Result<Managed, SimError> {
        // SAFETY: only tries to load the driver library (cudarc panics on a call without it).
        if !unsafe { sys::is_culib_present() } {
            return Err(SimError::NotFound);
        }
        let ctx = CudaContext::new(ordinal).map_err(|_| SimError::NotFound)?;
        ctx.bind_to_thread().map_err(|_| SimError::NotFound)?;
        let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL;
        // SAFETY: a current context; the bytes are zeroed below before anyone reads them.
        let ptr = unsafe { result::malloc_managed(len.max(1), flags) }
            .map_err(|_| SimError::QueueFull)?;
        let managed = Managed { ctx, ptr };
        // SAFETY: the allocation just made, `len` bytes; nothing else uses it yet.
        unsafe { result::memset_d8_sync(ptr, 0, len) }.map_err(|_| SimError::QueueFull)?;
        Ok(managed)
    }

    /// The host's pointer to the memory (the same address as the GPU's).
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }

    /// The GPU's pointer to the memory (`CUdeviceptr`).
    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        // Freed once: the last region holding the block is gone (`DeviceBlock`).
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated in `alloc`, freed once, nothing refers to it any more.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
