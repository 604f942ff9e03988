//! Device memory: an accelerator's memory (a GPU's) beside a simulated HCA, exported as a
//! dmabuf and registered with [`Pd::register_dmabuf_mr`] (`ibv_reg_dmabuf_mr`), so that
//! peers' RDMA writes, reads and atomics land in it and leave from it. The host reaches it
//! only through explicit copies ([`DeviceMemory::copy_in`], [`DeviceMemory::copy_out`]),
//! as a program reaches GPU memory through the CUDA copy engine.
//!
//! A device of the [`Rxe`](crate::Personality::Rxe) personality refuses dmabuf
//! registrations ([`SimError::Unsupported`]), as soft-RoCE does.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use super::{enter, Context, Mr, Pd, Shared};
use crate::config::Personality;
use crate::hca::mem::DeviceBlock;
use crate::types::*;

/// Pages of dmabuf registrations: an I/O virtual address shares its page offset with the
/// offset into the dmabuf.
pub const DMABUF_PAGE: u64 = 4096;

/// Memory of an accelerator on the machine of a simulated device, exported as a dmabuf
/// (its descriptor: [`dmabuf_fd`](Self::dmabuf_fd)). Dropping it closes the descriptor;
/// the memory lives on while a registration holds it.
#[derive(Debug)]
pub struct DeviceMemory {
    world: Shared,
    block: Arc<DeviceBlock>,
    fd: OwnedFd,
}

impl Context {
    /// Allocates `len` bytes of device memory (zeroed) on this device's machine and
    /// exports it as a dmabuf.
    ///
    /// ```
    /// use zverbs_sim::{AccessFlags, Fabric};
    /// let f = Fabric::with_devices(1);
    /// let ctx = f.open_device("sim0").unwrap();
    /// let gpu = ctx.alloc_device_memory(1 << 16).unwrap();
    /// gpu.copy_in(8, b"tensor").unwrap();
    /// let pd = ctx.alloc_pd().unwrap();
    /// let mr = pd
    ///     .register_dmabuf_mr(0, 1 << 16, 0x7000_0000, gpu.dmabuf_fd(), AccessFlags::LOCAL_WRITE)
    ///     .unwrap();
    /// assert_eq!((mr.addr(), mr.len()), (0x7000_0000, 1 << 16));
    /// let mut out = [0u8; 6];
    /// gpu.copy_out(8, &mut out).unwrap();
    /// assert_eq!(&out, b"tensor");
    /// ```
    ///
    /// # Errors
    /// [`SimError::QueueFull`] when no descriptor can be made.
    pub fn alloc_device_memory(&self, len: usize) -> Result<DeviceMemory, SimError> {
        self.export(DeviceBlock::new(len))
    }

    /// Allocates `len` bytes of GPU `ordinal`'s memory (CUDA managed memory, zeroed) as
    /// this device's machine's device memory (feature `cuda`): a peer's RDMA write lands
    /// in the GPU's memory, and a CUDA read of [`DeviceMemory::gpu_ptr`] sees the bytes.
    ///
    /// # Errors
    /// [`SimError::NotFound`] without such a GPU (or a CUDA driver);
    /// [`SimError::QueueFull`] when it has no room or no descriptor can be made.
    #[cfg(feature = "cuda")]
    pub fn alloc_gpu_memory(&self, ordinal: usize, len: usize) -> Result<DeviceMemory, SimError> {
        self.export(DeviceBlock::gpu(ordinal, len)?)
    }

    /// Exports `block` as a dmabuf of this device's machine.
    fn export(&self, block: DeviceBlock) -> Result<DeviceMemory, SimError> {
        let (_, end) = std::os::unix::net::UnixStream::pair().map_err(|_| SimError::QueueFull)?;
        let fd = OwnedFd::from(end);
        let id = file_id(fd.as_fd()).ok_or(SimError::QueueFull)?;
        let block = Arc::new(block);
        let entry = (self.dev, block.clone());
        enter(&self.world).tables.dmabufs.insert(id, entry);
        Ok(DeviceMemory {
            world: self.world.clone(),
            block,
            fd,
        })
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if let Some(id) = file_id(self.fd.as_fd()) {
            enter(&self.world).tables.dmabufs.remove(&id);
        }
    }
}

impl AsFd for DeviceMemory {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.dmabuf_fd()
    }
}

impl DeviceMemory {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.block.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GPU's pointer to the memory (`CUdeviceptr`), if it is a GPU's
    /// ([`Context::alloc_gpu_memory`]).
    #[cfg(feature = "cuda")]
    pub fn gpu_ptr(&self) -> Option<u64> {
        self.block.device_ptr()
    }

    /// The dmabuf's descriptor, to register.
    pub fn dmabuf_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Copies `data` into the memory at `offset` (a host-to-device copy).
    ///
    /// # Errors
    /// [`SimError::Invalid`] past the end.
    pub fn copy_in(&self, offset: usize, data: &[u8]) -> Result<(), SimError> {
        match self.block.copy_in(offset, data) {
            true => Ok(()),
            false => Err(SimError::Invalid("past the end of the device memory")),
        }
    }

    /// Copies the memory at `offset` into `out` (a device-to-host copy).
    ///
    /// # Errors
    /// [`SimError::Invalid`] past the end.
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) -> Result<(), SimError> {
        match self.block.copy_out(offset, out) {
            true => Ok(()),
            false => Err(SimError::Invalid("past the end of the device memory")),
        }
    }
}

impl Pd {
    /// Registers `len` bytes at `offset` of the dmabuf `fd`, named by the I/O virtual
    /// addresses `iova..iova + len` in work requests and by peers (`ibv_reg_dmabuf_mr`).
    ///
    /// # Errors
    /// [`SimError::Unsupported`] on a device of the rxe personality;
    /// [`SimError::Invalid`] for a descriptor that is no dmabuf of this device's machine,
    /// a range past its end, an `iova` whose page offset differs from `offset`'s, an
    /// address range that wraps, or REMOTE_WRITE/REMOTE_ATOMIC without LOCAL_WRITE;
    /// [`SimError::QueueFull`] when out of memory keys.
    pub fn register_dmabuf_mr(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: BorrowedFd<'_>,
        access: AccessFlags,
    ) -> Result<Mr, SimError> {
        let mut w = enter(&self.world);
        if w.net.cfg.personality == Personality::Rxe {
            return Err(SimError::Unsupported);
        }
        let dev = w.tables.pds.get(self.id).map(|p| p.dev);
        let known = file_id(fd).and_then(|id| w.tables.dmabufs.get(&id));
        let Some((owner, block)) = known.cloned() else {
            return Err(SimError::Invalid("not a dmabuf descriptor"));
        };
        if dev != Some(owner) {
            return Err(SimError::Invalid("a dmabuf of another machine"));
        }
        if iova % DMABUF_PAGE != offset % DMABUF_PAGE {
            return Err(SimError::Invalid("iova and offset differ in page offset"));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(SimError::Invalid("iova + len wraps"));
        }
        let writable = access.contains(AccessFlags::LOCAL_WRITE);
        let region = usize::try_from(offset)
            .ok()
            .and_then(|off| block.region(off, len, iova, writable))
            .ok_or(SimError::Invalid("past the end of the dmabuf"))?;
        let (idx, lkey, rkey) = w.tables.register_mr(self.id, region, access)?;
        Ok(Mr {
            world: self.world.clone(),
            idx,
            lkey,
            rkey,
            addr: iova,
            len,
        })
    }
}

/// What names the open file behind a descriptor, as the kernel's dmabuf lookup does: its
/// device and inode, the same for every duplicate of the descriptor.
fn file_id(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
    let meta = file.metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}
