//! GPU memory exported as a dmabuf (feature `cuda`), for
//! [`ProtectionDomain::register_dmabuf`](crate::ProtectionDomain::register_dmabuf) on a
//! NIC that imports dmabufs (GPUDirect RDMA; see [`crate::dmabuf`]).
//!
//! [`GpuBuffer::alloc`] allocates with the CUDA driver (`cuMemAlloc`), and
//! [`export_dmabuf`](GpuBuffer::export_dmabuf) asks it for the allocation's dmabuf
//! descriptor (`cuMemGetHandleForAddressRange(.., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
//! ..)`, NVIDIA's open kernel modules r515 and CUDA 11.7 or later). cudarc loads the driver
//! at run time: the build needs no CUDA toolkit, and on a machine without a driver or a GPU
//! [`GpuBuffer::alloc`] fails with [`GpuError::NoDriver`] or a driver error.
//!
//! With the simulator (feature `sim`), `Context::raw().alloc_gpu_memory(..)` puts the
//! simulator's device memory on a GPU instead.

use core::fmt;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

/// Why GPU memory could not be had.
#[derive(Debug)]
pub enum GpuError {
    /// No CUDA driver library (`libcuda.so`) could be loaded.
    NoDriver,
    /// The driver refused (no such GPU, out of memory, an export it does not support).
    Driver(DriverError),
    /// The allocation is not aligned to the host's page, which a dmabuf export needs.
    Misaligned,
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoDriver => f.write_str("no CUDA driver library (libcuda.so) to load"),
            GpuError::Driver(e) => write!(f, "CUDA driver: {e:?}"),
            GpuError::Misaligned => f.write_str("the GPU allocation is not page-aligned"),
        }
    }
}

impl std::error::Error for GpuError {}

impl From<DriverError> for GpuError {
    fn from(e: DriverError) -> Self {
        GpuError::Driver(e)
    }
}

/// Granularity of GPU allocations made here: large allocations start on 2 MiB boundaries,
/// so the range a dmabuf export names is page-aligned at both ends.
const GRANULE: usize = 2 << 20;

/// Memory on one GPU, freed on drop.
pub struct GpuBuffer {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("gpu", &self.ctx.ordinal())
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl GpuBuffer {
    /// At least `len` bytes on GPU `ordinal` (rounded up to 2 MiB), zeroed.
    pub fn alloc(ordinal: usize, len: usize) -> Result<GpuBuffer, GpuError> {
        // SAFETY: only tries to load the library (cudarc panics on a call without it).
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        ctx.bind_to_thread()?;
        let len = len.max(1).div_ceil(GRANULE) * GRANULE;
        // SAFETY: a current context; the bytes are zeroed below before anyone reads them.
        let ptr = unsafe { result::malloc_sync(len) }?;
        let buf = GpuBuffer { ctx, ptr, len };
        // SAFETY: the allocation just made, `len` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, len) }?;
        if ptr % 4096 != 0 {
            return Err(GpuError::Misaligned);
        }
        Ok(buf)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU's pointer to its first byte (`CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Exports the whole allocation as a dmabuf: a new descriptor, closed when dropped.
    pub fn export_dmabuf(&self) -> Result<OwnedFd, GpuError> {
        self.ctx.bind_to_thread()?;
        let mut fd: core::ffi::c_int = -1;
        let kind = sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
        // SAFETY: `fd` is a valid out-pointer for the int the driver writes; the range is
        // this live allocation, page-aligned at both ends (`alloc`).
        let ret = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut core::ffi::c_int).cast(),
                self.ptr,
                self.len,
                kind,
                0,
            )
        };
        ret.result()?;
        if fd < 0 {
            return Err(GpuError::Driver(DriverError(
                sys::cudaError_enum::CUDA_ERROR_INVALID_HANDLE,
            )));
        }
        // SAFETY: a descriptor the driver just created for us, owned by no one else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Copies `data` to `offset` (host to device).
    pub fn copy_in(&self, offset: usize, data: &[u8]) -> Result<(), GpuError> {
        let end = offset.checked_add(data.len()).filter(|&e| e <= self.len);
        end.ok_or(GpuError::Driver(DriverError(
            sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
        )))?;
        self.ctx.bind_to_thread()?;
        // SAFETY: `offset..offset + data.len()` lies inside the live allocation.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, data) }?;
        Ok(())
    }

    /// Copies from `offset` into `out` (device to host).
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) -> Result<(), GpuError> {
        let end = offset.checked_add(out.len()).filter(|&e| e <= self.len);
        end.ok_or(GpuError::Driver(DriverError(
            sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
        )))?;
        self.ctx.bind_to_thread()?;
        // SAFETY: `offset..offset + out.len()` lies inside the live allocation.
        unsafe { result::memcpy_dtoh_sync(out, self.ptr + offset as u64) }?;
        Ok(())
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated in `alloc`, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
