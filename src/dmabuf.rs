//! Device memory: registrations of dmabufs (`ibv_reg_dmabuf_mr`), the way an accelerator's
//! memory (a GPU's tensors, a KV cache) is sent and received over RDMA without staging it
//! in host memory (GPUDirect RDMA).
//!
//! The accelerator's driver exports an allocation as a dmabuf file descriptor (CUDA:
//! `cuMemGetHandleForAddressRange(.., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ..)`), and
//! [`ProtectionDomain::register_dmabuf`] registers a range of it. The resulting
//! [`DeviceRegion`] is memory the host may not touch: it offers local slices for work
//! requests ([`slice`](DeviceRegion::slice), [`slice_mut`](DeviceRegion::slice_mut)) and a
//! [`RemoteRegion`] for peers, and no `&[u8]` / `&mut [u8]` of its bytes. The bytes are
//! reached only through the accelerator's own copies (on the simulator,
//! `zverbs_sim::DeviceMemory::copy_in` / `copy_out`).
//!
//! Because no Rust reference can alias the memory, registering it is safe, remote rights
//! included: a peer's writes race nothing the compiler assumes. The library never reads a
//! slice of it either: a blocking atomic whose result would land in device memory is
//! refused (post the operation in a scope, and copy the result out of the device).
//!
//! The descriptor: [`register_dmabuf`](ProtectionDomain::register_dmabuf) borrows it for
//! the region's life; [`register_dmabuf_owned`](ProtectionDomain::register_dmabuf_owned)
//! takes it, and closes it when the region is dropped. (The kernel holds the dmabuf for the
//! registration anyway; the borrow keeps the exporter's allocation from being freed under
//! the region.)
//!
//! Support: mlx5, irdma, bnxt_re and efa register dmabufs; soft-RoCE (rxe) and siw do not,
//! and fail with an error of kind [`Unsupported`](crate::error::ErrorKind::Unsupported);
//! [`DeviceAttr::dmabuf`](crate::DeviceAttr) says which before trying.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::{AccessFlags, Context};
//! let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
//! assert!(ctx.query_device().unwrap().dmabuf);
//! let gpu = ctx.raw().alloc_device_memory(1 << 20).unwrap(); // the simulator's "GPU"
//! let pd = ctx.alloc_pd().unwrap();
//! let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//! let region = pd.register_dmabuf(gpu.dmabuf_fd(), 0, 1 << 20, 0x10_0000, access).unwrap();
//! let theirs = region.remote(); // what a peer writes to
//! assert_eq!((theirs.addr, theirs.len), (0x10_0000, 1 << 20));
//! assert!(region.slice(..64).is_ok()); // what a local send reads
//! # }
//! ```

use core::marker::PhantomData;
use core::ops::RangeBounds;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::device::ProtectionDomain;
use crate::error::{verb, BoundsError, Error};
use crate::mr::{Extent, LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::types::AccessFlags;

/// Pages of a dmabuf registration: its I/O virtual address must share its page offset with
/// its offset into the dmabuf (`ibv_reg_dmabuf_mr(3)`).
pub const PAGE: u64 = 4096;

impl<P: Provider> ProtectionDomain<P> {
    /// Registers `len` bytes at `offset` of the dmabuf `fd`, named `iova..iova + len` in
    /// work requests and by peers; `fd` stays borrowed while the region lives.
    ///
    /// # Errors
    /// Checked before the call, as [`Error::InvalidAttribute`]: no bytes; `offset + len`
    /// or `iova + len` past `u64::MAX`; an `iova` whose page offset differs from
    /// `offset`'s; REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE. From the device: an
    /// error of kind [`Unsupported`](crate::error::ErrorKind::Unsupported) where it
    /// registers no dmabufs, and the kernel's refusal of the descriptor or the range.
    pub fn register_dmabuf<'fd>(
        &self,
        fd: BorrowedFd<'fd>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DeviceRegion<'fd, P>, Error<P::Error>> {
        check(offset, len, iova, access)?;
        let raw = verb(
            "ibv_reg_dmabuf_mr",
            P::register_dmabuf_mr(&self.raw, fd, offset, len, iova, access),
        )?;
        let (lkey, rkey) = P::mr_keys(&raw);
        Ok(DeviceRegion {
            raw,
            iova,
            len,
            lkey,
            rkey,
            access,
            _fd: None,
            _borrow: PhantomData,
        })
    }

    /// As [`register_dmabuf`](Self::register_dmabuf), taking the descriptor: it is
    /// closed when the region is dropped (after the deregistration).
    pub fn register_dmabuf_owned(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DeviceRegion<'static, P>, Error<P::Error>> {
        let region = self.register_dmabuf(fd.as_fd(), offset, len, iova, access)?;
        let DeviceRegion {
            raw,
            iova,
            len,
            lkey,
            rkey,
            access,
            ..
        } = region;
        Ok(DeviceRegion {
            raw,
            iova,
            len,
            lkey,
            rkey,
            access,
            _fd: Some(fd),
            _borrow: PhantomData,
        })
    }
}

/// What a dmabuf registration is refused for before it reaches the device.
fn check<E>(offset: u64, len: usize, iova: u64, access: AccessFlags) -> Result<(), Error<E>> {
    let bad = |why| Err(Error::InvalidAttribute(why));
    let len = len as u64;
    if len == 0 {
        return bad("a dmabuf registration of no bytes");
    }
    if offset.checked_add(len).is_none() || iova.checked_add(len).is_none() {
        return bad("a dmabuf range past the end of the address space");
    }
    if iova % PAGE != offset % PAGE {
        return bad("iova and offset must share their page offset");
    }
    let needs_local = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(needs_local) && !access.contains(AccessFlags::LOCAL_WRITE) {
        return bad("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE");
    }
    if !AccessFlags::all().contains(access) {
        return bad("an access flag a dmabuf registration does not take");
    }
    Ok(())
}

/// A registered range of device memory (a dmabuf). Dropping it deregisters the memory
/// (and closes the descriptor, if it was handed over). Its bytes are not the process's:
/// there is no `as_slice` (`tests/ui/device_region_bytes.rs` does not compile).
pub struct DeviceRegion<'fd, P: Provider> {
    raw: P::Mr,
    iova: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    /// The rights it was registered with.
    access: AccessFlags,
    /// The descriptor, if the region owns it (dropped after `raw`).
    _fd: Option<OwnedFd>,
    _borrow: PhantomData<BorrowedFd<'fd>>,
}

impl<P: Provider> DeviceRegion<'_, P> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never: a registration has some).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The I/O virtual address of its first byte, as work requests name it.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The whole region as a peer addresses it.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.iova,
            len: self.len as u64,
            rkey: self.rkey,
        }
    }

    /// A byte range the device may read (sends, writes).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice<'_>, BoundsError> {
        Ok(LocalSlice::from_sge(self.extent().range(range)?))
    }

    /// A byte range the device may write (receives, reads, atomics).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<LocalSliceMut<'_>, BoundsError> {
        Ok(LocalSliceMut::from_device_sge(self.extent().range(range)?))
    }

    fn extent(&self) -> Extent {
        Extent::new(self.iova, self.len, self.lkey)
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Mr {
        &self.raw
    }
}
