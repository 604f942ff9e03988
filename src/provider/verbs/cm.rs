//! The connection manager through librdmacm (`<rdma/rdma_cma.h>`), for
//! [`ConnectionManager`].
//!
//! Bindings of our own: the twenty calls zverbs makes and the three structures it reads,
//! declared from `rdma_cma.h` of rdma-core (librdmacm's ABI, `librdmacm.so.1`, has kept
//! these layouts since its first version). A `-sys` crate such as `rdma-mummy-sys` would
//! build all of rdma-core with cmake and run bindgen over it for these few declarations.
//! Only the leading fields of `rdma_cm_id` that precede its `route` are declared; the
//! rest is never read.
//!
//! Every event taken is copied out and acknowledged at once (`rdma_ack_cm_event`), so no
//! event is ever outstanding when an id is destroyed (`rdma_destroy_id` waits for that).
//! A connect request's id is the caller's from then on, inside the event it returns.

use core::ffi::{c_int, c_void};
use core::ptr::{self, NonNull};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

use ibverbs_sys as ffi;

use super::error::{check, VerbsError};
use super::{non_null, Context, Verbs};
use crate::provider::cm::{
    CmEvent, CmEventKind, CmPath, ConnParam, ConnectionManager, PortSpace, PrivateData, UdPeer,
    MAX_PRIVATE_DATA,
};
use crate::provider::AhAttr;
use crate::types::{Gid, Mtu};

#[repr(C)]
struct RawChannel {
    fd: c_int,
}

/// The leading fields of `struct rdma_cm_id` (the rest is never read).
#[repr(C)]
struct RawId {
    verbs: *mut ffi::ibv_context,
    channel: *mut RawChannel,
    context: *mut c_void,
    qp: *mut ffi::ibv_qp,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RawConnParam {
    private_data: *const c_void,
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RawUdParam {
    private_data: *const c_void,
    private_data_len: u8,
    ah_attr: ffi::ibv_ah_attr,
    qp_num: u32,
    qkey: u32,
}

#[repr(C)]
union RawParam {
    conn: RawConnParam,
    ud: RawUdParam,
}

#[repr(C)]
struct RawEvent {
    id: *mut RawId,
    listen_id: *mut RawId,
    event: c_int,
    status: c_int,
    param: RawParam,
}

const RDMA_PS_TCP: c_int = 0x0106;
const RDMA_PS_UDP: c_int = 0x0111;

#[link(name = "rdmacm")]
extern "C" {
    fn rdma_create_event_channel() -> *mut RawChannel;
    fn rdma_destroy_event_channel(ch: *mut RawChannel);
    fn rdma_create_id(
        ch: *mut RawChannel,
        id: *mut *mut RawId,
        ctx: *mut c_void,
        ps: c_int,
    ) -> c_int;
    fn rdma_destroy_id(id: *mut RawId) -> c_int;
    fn rdma_bind_addr(id: *mut RawId, addr: *mut libc::sockaddr) -> c_int;
    fn rdma_listen(id: *mut RawId, backlog: c_int) -> c_int;
    fn rdma_resolve_addr(
        id: *mut RawId,
        src: *mut libc::sockaddr,
        dst: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int;
    fn rdma_resolve_route(id: *mut RawId, timeout_ms: c_int) -> c_int;
    fn rdma_connect(id: *mut RawId, param: *mut RawConnParam) -> c_int;
    fn rdma_accept(id: *mut RawId, param: *mut RawConnParam) -> c_int;
    fn rdma_reject(id: *mut RawId, data: *const c_void, len: u8) -> c_int;
    fn rdma_establish(id: *mut RawId) -> c_int;
    fn rdma_disconnect(id: *mut RawId) -> c_int;
    fn rdma_get_cm_event(ch: *mut RawChannel, ev: *mut *mut RawEvent) -> c_int;
    fn rdma_ack_cm_event(ev: *mut RawEvent) -> c_int;
    fn rdma_init_qp_attr(id: *mut RawId, attr: *mut ffi::ibv_qp_attr, mask: *mut c_int) -> c_int;
    fn rdma_migrate_id(id: *mut RawId, ch: *mut RawChannel) -> c_int;
    fn rdma_get_src_port(id: *mut RawId) -> u16;
}

/// An event channel (`rdma_event_channel`) with a non-blocking descriptor.
pub struct CmChannel(NonNull<RawChannel>);

// SAFETY: the channel is a descriptor; librdmacm serialises the calls on it.
unsafe impl Send for CmChannel {}
// SAFETY: as for `Send`: shared use only reads the descriptor and takes events.
unsafe impl Sync for CmChannel {}

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: created by `rdma_create_event_channel`, destroyed once. Ids still on it
        // hold no pointer to it that is used after this (their events are acknowledged).
        unsafe { rdma_destroy_event_channel(self.0.as_ptr()) };
    }
}

/// An id (`rdma_cm_id`), destroyed on drop.
pub struct CmId {
    id: NonNull<RawId>,
    key: u64,
}

// SAFETY: librdmacm calls on one id may come from any thread; zverbs makes them from one
// at a time (the id is owned by one connection or listener).
unsafe impl Send for CmId {}
// SAFETY: shared use reads `verbs` and calls librdmacm, which locks its own state.
unsafe impl Sync for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: created by `rdma_create_id` (or handed over by a connect request),
        // destroyed once; every event of it was acknowledged when taken.
        unsafe { rdma_destroy_id(self.id.as_ptr()) };
    }
}

impl CmId {
    fn raw(&self) -> *mut RawId {
        self.id.as_ptr()
    }
}

/// `addr` as a `sockaddr_storage` for librdmacm.
fn sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut ss: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a `sockaddr_in` fits in a `sockaddr_storage`, which is aligned for it.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for `sockaddr_in6`.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast(), sin6) };
        }
    }
    ss
}

fn kind_of(event: c_int) -> Option<CmEventKind> {
    Some(match event {
        0 => CmEventKind::AddrResolved,
        1 => CmEventKind::AddrError,
        2 => CmEventKind::RouteResolved,
        3 => CmEventKind::RouteError,
        4 => CmEventKind::ConnectRequest,
        5 => CmEventKind::ConnectResponse,
        6 => CmEventKind::ConnectError,
        7 => CmEventKind::Unreachable,
        8 => CmEventKind::Rejected,
        9 => CmEventKind::Established,
        10 => CmEventKind::Disconnected,
        11 => CmEventKind::DeviceRemoval,
        // Multicast, address change, timewait exit: not ours.
        _ => return None,
    })
}

/// A copy of `len` bytes at `data` (at most [`MAX_PRIVATE_DATA`]).
///
/// # Safety
/// `data` is null or points to `len` readable bytes.
unsafe fn copied(data: *const c_void, len: u8) -> PrivateData {
    let len = usize::from(len).min(MAX_PRIVATE_DATA);
    if data.is_null() || len == 0 {
        return PrivateData::EMPTY;
    }
    // SAFETY: the caller's contract.
    let bytes = unsafe { core::slice::from_raw_parts(data.cast::<u8>(), len) };
    PrivateData::new(bytes, len).unwrap_or(PrivateData::EMPTY)
}

fn param(p: &ConnParam, data: &[u8]) -> Result<RawConnParam, VerbsError> {
    let len =
        u8::try_from(data.len()).map_err(|_| VerbsError::Invalid("private data past 255 bytes"))?;
    Ok(RawConnParam {
        private_data: if data.is_empty() {
            ptr::null()
        } else {
            data.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: 1,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: 0,
        qp_num: p.qp_num,
    })
}

/// `rdma_init_qp_attr` for `state`.
fn qp_attr(id: &CmId, state: ffi::ibv_qp_state::Type) -> Result<ffi::ibv_qp_attr, VerbsError> {
    // SAFETY: all-zero is a valid `ibv_qp_attr`.
    let mut attr: ffi::ibv_qp_attr = unsafe { core::mem::zeroed() };
    attr.qp_state = state;
    let mut mask: c_int = 0;
    // SAFETY: `id` is live; `attr` and `mask` are valid for writes for the call.
    check("rdma_init_qp_attr", unsafe {
        rdma_init_qp_attr(id.raw(), &mut attr, &mut mask)
    })?;
    Ok(attr)
}

impl ConnectionManager for Verbs {
    type CmChannel = CmChannel;
    type CmId = CmId;

    fn create_cm_channel(&self) -> Result<CmChannel, VerbsError> {
        // SAFETY: no arguments; a null return sets errno.
        let ch = non_null(
            unsafe { rdma_create_event_channel() },
            "rdma_create_event_channel",
        )?;
        let ch = CmChannel(ch);
        // SAFETY: a created channel; `fd` is a plain field set by the library and fixed.
        super::event::nonblocking(unsafe { (*ch.0.as_ptr()).fd })?;
        Ok(ch)
    }

    fn cm_channel_fd(ch: &CmChannel) -> RawFd {
        // SAFETY: the channel is live; `fd` is written once by librdmacm at creation.
        unsafe { (*ch.0.as_ptr()).fd }
    }

    fn get_cm_event(ch: &CmChannel) -> Result<Option<CmEvent<Verbs>>, VerbsError> {
        loop {
            let mut ev: *mut RawEvent = ptr::null_mut();
            // SAFETY: the channel is live; `ev` is valid for the write.
            let r = unsafe { rdma_get_cm_event(ch.0.as_ptr(), &mut ev) };
            if r != 0 {
                let e = VerbsError::last_os("rdma_get_cm_event");
                if e.errno() == Some(libc::EAGAIN) {
                    return Ok(None);
                }
                return Err(e);
            }
            // SAFETY: `ev` is the event librdmacm returned, valid until acknowledged below;
            // its ids are live (a request's listener too); its private data (conn or ud,
            // by the port space, which the keys' low bit holds) lies in it.
            let out = unsafe {
                let e = &*ev;
                let key_of = |id: *mut RawId| {
                    if id.is_null() {
                        0
                    } else {
                        (*id).context as u64
                    }
                };
                let (key, listener) = (key_of(e.id), key_of(e.listen_id));
                let ud = (if e.listen_id.is_null() { key } else { listener }) & UD_KEY != 0;
                let data = if ud {
                    copied(e.param.ud.private_data, e.param.ud.private_data_len)
                } else {
                    copied(e.param.conn.private_data, e.param.conn.private_data_len)
                };
                let peer = (ud && kind_of(e.event) == Some(CmEventKind::Established))
                    .then(|| ud_peer(&e.param.ud));
                (kind_of(e.event), e.id, e.status, data, key, ud, peer)
            };
            // SAFETY: acknowledged once, after the copy above.
            unsafe { rdma_ack_cm_event(ev) };
            let (kind, id, status, private_data, key, ud, peer) = out;
            let Some(kind) = kind else {
                continue;
            };
            let request = if kind == CmEventKind::ConnectRequest {
                let id = NonNull::new(id)
                    .ok_or(VerbsError::Invalid("a connect request without an id"))?;
                let key = new_key(ud);
                // SAFETY: the request's id is ours from now on; `context` is a plain
                // pointer-sized field librdmacm hands back in its events.
                unsafe { (*id.as_ptr()).context = key as *mut c_void };
                Some(CmId { id, key })
            } else {
                None
            };
            let key = request.as_ref().map_or(key, |r| r.key);
            return Ok(Some(CmEvent {
                kind,
                id: key,
                status,
                private_data,
                request,
                ud: peer,
            }));
        }
    }

    fn create_cm_id(ch: &CmChannel, ps: PortSpace) -> Result<CmId, VerbsError> {
        let key = new_key(ps == PortSpace::Ud);
        let mut id: *mut RawId = ptr::null_mut();
        let ps = match ps {
            PortSpace::Rc => RDMA_PS_TCP,
            PortSpace::Ud => RDMA_PS_UDP,
        };
        // SAFETY: the channel is live; `id` is valid for the write; the context is the
        // key, never dereferenced.
        check("rdma_create_id", unsafe {
            rdma_create_id(ch.0.as_ptr(), &mut id, key as *mut c_void, ps)
        })?;
        let id = non_null(id, "rdma_create_id")?;
        Ok(CmId { id, key })
    }

    fn cm_id_key(id: &CmId) -> u64 {
        id.key
    }

    fn cm_migrate(id: &CmId, ch: &CmChannel) -> Result<(), VerbsError> {
        // SAFETY: both live; migration moves the id's pending events with it.
        check("rdma_migrate_id", unsafe {
            rdma_migrate_id(id.raw(), ch.0.as_ptr())
        })
    }

    fn cm_on_device(id: &CmId, ctx: &Context) -> bool {
        // SAFETY: the id is live; `verbs` is set by librdmacm once bound or resolved.
        let verbs = unsafe { (*id.raw()).verbs };
        if verbs.is_null() {
            return false;
        }
        // SAFETY: `verbs` is an open context of librdmacm's; its `device` is valid.
        let name = unsafe { super::device_name(&(*verbs).device) };
        name == ctx.name()
    }

    fn cm_bind(id: &CmId, addr: SocketAddr) -> Result<SocketAddr, VerbsError> {
        let mut ss = sockaddr(addr);
        // SAFETY: the id is live; `ss` holds a sockaddr of its family for the call.
        check("rdma_bind_addr", unsafe {
            rdma_bind_addr(id.raw(), ptr::addr_of_mut!(ss).cast())
        })?;
        // SAFETY: the id is live and bound.
        let port = u16::from_be(unsafe { rdma_get_src_port(id.raw()) });
        Ok(SocketAddr::new(addr.ip(), port))
    }

    fn cm_listen(id: &CmId, backlog: u32) -> Result<(), VerbsError> {
        let backlog = c_int::try_from(backlog).unwrap_or(c_int::MAX);
        // SAFETY: the id is live and bound.
        check("rdma_listen", unsafe { rdma_listen(id.raw(), backlog) })
    }

    fn cm_resolve_addr(
        id: &CmId,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout_ms: u32,
    ) -> Result<(), VerbsError> {
        let mut d = sockaddr(dst);
        let mut s = src.map(|ip| sockaddr(SocketAddr::new(ip, 0)));
        let sp = s
            .as_mut()
            .map_or(ptr::null_mut(), |s| ptr::addr_of_mut!(*s).cast());
        let ms = c_int::try_from(timeout_ms).unwrap_or(c_int::MAX);
        // SAFETY: the id is live; the addresses live across the call.
        check("rdma_resolve_addr", unsafe {
            rdma_resolve_addr(id.raw(), sp, ptr::addr_of_mut!(d).cast(), ms)
        })
    }

    fn cm_resolve_route(id: &CmId, timeout_ms: u32) -> Result<(), VerbsError> {
        let ms = c_int::try_from(timeout_ms).unwrap_or(c_int::MAX);
        // SAFETY: the id is live.
        check("rdma_resolve_route", unsafe {
            rdma_resolve_route(id.raw(), ms)
        })
    }

    fn cm_connect(id: &CmId, p: &ConnParam, data: &[u8]) -> Result<(), VerbsError> {
        let mut raw = param(p, data)?;
        // SAFETY: the id is live; `raw` and `data` live across the call (librdmacm copies).
        check("rdma_connect", unsafe { rdma_connect(id.raw(), &mut raw) })
    }

    fn cm_accept(id: &CmId, p: &ConnParam, data: &[u8]) -> Result<(), VerbsError> {
        let mut raw = param(p, data)?;
        // SAFETY: as for `cm_connect`.
        check("rdma_accept", unsafe { rdma_accept(id.raw(), &mut raw) })
    }

    fn cm_reject(id: &CmId, data: &[u8]) -> Result<(), VerbsError> {
        let len = u8::try_from(data.len())
            .map_err(|_| VerbsError::Invalid("private data past 255 bytes"))?;
        // SAFETY: the id is live; `data` lives across the call.
        check("rdma_reject", unsafe {
            rdma_reject(id.raw(), data.as_ptr().cast(), len)
        })
    }

    fn cm_establish(id: &CmId) -> Result<(), VerbsError> {
        // SAFETY: the id is live.
        check("rdma_establish", unsafe { rdma_establish(id.raw()) })
    }

    fn cm_disconnect(id: &CmId) -> Result<(), VerbsError> {
        // SAFETY: the id is live.
        check("rdma_disconnect", unsafe { rdma_disconnect(id.raw()) })
    }

    fn cm_path(id: &CmId) -> Result<CmPath, VerbsError> {
        let init = qp_attr(id, ffi::ibv_qp_state::IBV_QPS_INIT)?;
        let rtr = qp_attr(id, ffi::ibv_qp_state::IBV_QPS_RTR)?;
        let rts = qp_attr(id, ffi::ibv_qp_state::IBV_QPS_RTS)?;
        let ah = rtr.ah_attr;
        Ok(CmPath {
            port: init.port_num,
            sgid_index: ah.grh.sgid_index,
            local_psn: rts.sq_psn,
            remote_qp_num: rtr.dest_qp_num,
            remote_psn: rtr.rq_psn,
            remote_lid: ah.dlid,
            // SAFETY: `raw` is the plain 16-byte view of the GID union.
            remote_gid: Gid(unsafe { ah.grh.dgid.raw }),
            mtu: u8::try_from(rtr.path_mtu)
                .ok()
                .and_then(Mtu::from_raw)
                .unwrap_or_default(),
            remote_qkey: init.qkey,
            responder_resources: rts.max_rd_atomic,
            initiator_depth: rtr.max_dest_rd_atomic,
        })
    }
}

/// The peer a datagram service reply describes.
fn ud_peer(p: &RawUdParam) -> UdPeer {
    let a = &p.ah_attr;
    UdPeer {
        qp_num: p.qp_num,
        qkey: p.qkey,
        ah: AhAttr {
            port: a.port_num,
            // SAFETY: `raw` is the plain 16-byte view of the GID union.
            dgid: (a.is_global != 0).then_some(Gid(unsafe { a.grh.dgid.raw })),
            sgid_index: a.grh.sgid_index,
            dlid: a.dlid,
            sl: a.sl,
            static_rate: a.static_rate,
            traffic_class: a.grh.traffic_class,
            flow_label: a.grh.flow_label,
            hop_limit: a.grh.hop_limit,
        },
    }
}

/// The low bit of an id's key: set for a datagram id (its events carry `rdma_ud_param`).
const UD_KEY: u64 = 1;

/// A key for a new id (`rdma_cm_id.context`): unique in the process, its low bit saying
/// whether the id is a datagram one.
fn new_key(ud: bool) -> u64 {
    (super::event::next_key() << 1) | u64::from(ud)
}
