//! The verbs backend's devices: the device list, opening a device, and what it and its
//! ports report.

use core::ffi::CStr;
use core::mem::MaybeUninit;
use core::ptr;
use std::sync::Arc;

use ibverbs_sys as ffi;

use super::error::{self, check, VerbsError};
use super::{async_event, non_null, Context, ContextInner};
use crate::types::{AccessFlags, AtomicCap, DeviceAttr, Gid, Mtu, PortAttr, PortState};

/// Calls `f` with each device of a fresh device list; the list is freed afterwards.
pub(super) fn with_device_list<R>(
    f: impl FnOnce(&[*mut ffi::ibv_device]) -> R,
) -> Result<R, VerbsError> {
    let mut n = 0i32;
    // SAFETY: `n` is a valid out-pointer; the call allocates and returns the list or NULL.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::last_os("ibv_get_device_list"));
    }
    // SAFETY: on success `list` holds `n` device pointers (NULL-terminated after them).
    let devices = unsafe { core::slice::from_raw_parts(list, usize::try_from(n).unwrap_or(0)) };
    let r = f(devices);
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once; devices opened from
    // it stay valid after the free (libibverbs keeps opened devices referenced).
    unsafe { ffi::ibv_free_device_list(list) };
    Ok(r)
}

/// The name of a device of a live device list; the borrow of the list's element keeps the
/// name from outliving the list.
pub(super) fn device_name(dev: &*mut ffi::ibv_device) -> &str {
    // SAFETY: `*dev` is an element of a live device list; the name is a NUL-terminated
    // array inside the device struct, valid while the list is.
    let name = unsafe { ffi::ibv_get_device_name(*dev) };
    if name.is_null() {
        return "";
    }
    // SAFETY: `name` is non-null and NUL-terminated, inside the device struct of a live
    // list, which outlives the `&str` (tied to `dev`'s borrow).
    unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("")
}

/// Opens the device named `name`; the names present if there is none.
pub(super) fn open(name: &str) -> Result<Context, VerbsError> {
    let mut present = Vec::new();
    let opened = with_device_list(|l| {
        for d in l {
            if device_name(d) == name {
                // SAFETY: `d` is an element of the live device list.
                return Some(non_null(
                    unsafe { ffi::ibv_open_device(*d) },
                    "ibv_open_device",
                ));
            }
            present.push(device_name(d).to_owned());
        }
        None
    })?;
    match opened {
        Some(ctx) => {
            let ctx = ctx?;
            // SAFETY: an open context; `async_fd` is a plain field set by the library
            // and fixed.
            let events = async_event::Events::new(unsafe { (*ctx.as_ptr()).async_fd });
            match events {
                Ok(events) => Ok(Context(Arc::new(ContextInner {
                    ctx,
                    name: name.to_owned(),
                    events,
                }))),
                Err(e) => {
                    // SAFETY: opened above and owned by nothing else yet.
                    unsafe { ffi::ibv_close_device(ctx.as_ptr()) };
                    Err(e)
                }
            }
        }
        None => Err(VerbsError::NoSuchDevice(Box::new(error::NoSuchDevice {
            name: name.to_owned(),
            present,
        }))),
    }
}

/// The device's attributes, and whether its provider registers dmabufs.
pub(super) fn query(ctx: &Context) -> Result<DeviceAttr, VerbsError> {
    let mut a = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
    // SAFETY: open context; `a` is a writable `ibv_device_attr` the call fills.
    let ret = unsafe { ffi::ibv_query_device(ctx.as_ptr(), a.as_mut_ptr()) };
    check("ibv_query_device", ret)?;
    // SAFETY: zero-initialised plain C data (integers and byte arrays), filled above.
    let a = unsafe { a.assume_init() };
    let count = |n: i32| u32::try_from(n).unwrap_or(0);
    Ok(DeviceAttr {
        max_qp_wr: count(a.max_qp_wr),
        max_sge: count(a.max_sge),
        max_cqe: count(a.max_cqe),
        max_qp_rd_atom: count(a.max_qp_rd_atom),
        max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
        max_mr_size: a.max_mr_size,
        atomic_cap: match a.atomic_cap {
            ffi::IBV_ATOMIC_HCA => AtomicCap::Hca,
            ffi::IBV_ATOMIC_GLOB => AtomicCap::Glob,
            _ => AtomicCap::None,
        },
        max_srq: count(a.max_srq),
        max_srq_wr: count(a.max_srq_wr),
        max_srq_sge: count(a.max_srq_sge),
        dmabuf: dmabuf_supported(ctx)?,
    })
}

/// Port `port`'s state, LID, MTUs and GID table length.
pub(super) fn query_port(ctx: &Context, port: u8) -> Result<PortAttr, VerbsError> {
    let mut a = ffi::ibv_port_attr::default();
    // SAFETY: open context; `a` is a full `ibv_port_attr`, larger than the compat
    // struct the exported symbol fills, so every write lands inside it.
    let ret = unsafe { ffi::ibv_query_port(ctx.as_ptr(), port, ptr::addr_of_mut!(a).cast()) };
    check("ibv_query_port", ret)?;
    Ok(PortAttr {
        state: if a.state == ffi::ibv_port_state::IBV_PORT_ACTIVE {
            PortState::Active
        } else {
            PortState::Down
        },
        lid: a.lid,
        max_mtu: mtu(a.max_mtu),
        active_mtu: mtu(a.active_mtu),
        gid_table_len: u16::try_from(a.gid_tbl_len).unwrap_or(u16::MAX),
    })
}

/// Entry `index` of port `port`'s GID table.
pub(super) fn query_gid(ctx: &Context, port: u8, index: u8) -> Result<Gid, VerbsError> {
    let mut g = ffi::ibv_gid::default();
    // SAFETY: open context; `g` is a valid out-pointer to a 16-byte GID.
    let ret = unsafe { ffi::ibv_query_gid(ctx.as_ptr(), port, index.into(), &mut g) };
    check("ibv_query_gid", ret)?;
    // SAFETY: `raw` is the byte view of the GID union; every bit pattern is valid.
    Ok(Gid(unsafe { g.raw }))
}

pub(super) fn mtu(v: ffi::ibv_mtu) -> Mtu {
    Mtu::from_raw(u8::try_from(v).unwrap_or(0)).unwrap_or(Mtu::Mtu256)
}

/// Whether `ctx`'s provider library registers dmabufs: verbs has no attribute for it, so
/// this asks with a descriptor that cannot be one (-1). A provider without the verb fails
/// at once with `EOPNOTSUPP` (rdma-core's dummy op; rxe, siw); one with it passes the call
/// to the kernel, which refuses the descriptor (`EBADF`).
fn dmabuf_supported(ctx: &Context) -> Result<bool, VerbsError> {
    // SAFETY: open context.
    let pd = non_null(unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) }, "ibv_alloc_pd")?;
    let access = AccessFlags::LOCAL_WRITE.bits() as i32;
    // SAFETY: live PD; the descriptor -1 names no memory, so nothing is registered.
    let mr = unsafe { ffi::ibv_reg_dmabuf_mr(pd.as_ptr(), 0, 4096, 0, -1, access) };
    let unsupported = mr.is_null() && {
        use crate::error::{ErrorKind, ProviderError};
        VerbsError::last_os("ibv_reg_dmabuf_mr").kind() == ErrorKind::Unsupported
    };
    if !mr.is_null() {
        // SAFETY: registered just now (which no provider does for -1), deregistered once.
        unsafe { ffi::ibv_dereg_mr(mr) };
    }
    // SAFETY: allocated above, nothing on it any more.
    unsafe { ffi::ibv_dealloc_pd(pd.as_ptr()) };
    Ok(!unsupported)
}
