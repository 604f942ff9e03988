//! GID table inspection and the choice of a GID index for RoCE.
//!
//! On RoCE every IP address of the netdev gets GID entries; RoCE v2 entries route over
//! UDP/IP. The usual choice, and the default here, is the RoCE v2 entry of an IPv4 address
//! (`::ffff:a.b.c.d`), which is what rdma_cm picks for IPv4 and what works across subnets.

use ibverbs_sys as ffi;

use super::error::{errno, VerbsError};
use super::{Context, Verbs};
use crate::types::Gid;

/// The kind of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet frames, no IP).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
    /// A type this library does not know.
    Other(u32),
}

/// One populated GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table (what `QpConfig::gid_index` takes). `u8` like the
    /// address vector's `sgid_index`: entries past 255 cannot carry a path.
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
}

impl GidEntry {
    /// Whether the GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid.0[..10] == [0; 10] && self.gid.0[10..12] == [0xff, 0xff]
    }
}

/// Which GID [`Verbs::select_gid`] picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GidSelect {
    /// The RoCE v2 entry of an IPv4 address; else the first RoCE v2 entry; else the first
    /// populated entry (InfiniBand ports: index 0).
    #[default]
    PreferRoceV2Ipv4,
    /// Exactly this index (it must be populated).
    Index(u8),
}

fn gid_type(t: u32) -> GidType {
    match t {
        ffi::IBV_GID_TYPE_IB => GidType::Ib,
        ffi::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
        ffi::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
        other => GidType::Other(other),
    }
}

impl Verbs {
    /// Reads GID table entry `index` of `port` with its type; `Ok(None)` for an empty slot.
    pub fn query_gid_entry(
        ctx: &Context,
        port: u8,
        index: u8,
    ) -> Result<Option<GidEntry>, VerbsError> {
        let mut e = ffi::ibv_gid_entry::default();
        // SAFETY: `ctx` is an open context; `e` is a valid, writable `ibv_gid_entry` of the
        // size we pass. The function writes only `e`.
        let ret = unsafe {
            ffi::_ibv_query_gid_ex(
                ctx.as_ptr(),
                port.into(),
                index.into(),
                &mut e,
                0,
                core::mem::size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if ret != 0 {
            let err = VerbsError::from_ret("ibv_query_gid_ex", ret);
            // An unpopulated slot reads as ENODATA (or EINVAL on some kernels).
            return match err.errno() {
                Some(errno::ENODATA) | Some(errno::EINVAL) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: `raw` is the byte view of the 16-byte GID union; every bit pattern is valid.
        let raw = unsafe { e.gid.raw };
        if raw == [0; 16] {
            return Ok(None);
        }
        Ok(Some(GidEntry {
            index,
            gid: Gid(raw),
            gid_type: gid_type(e.gid_type),
        }))
    }

    /// The populated entries of `port`'s GID table that a path can use (indices 0..=255:
    /// the address vector's `sgid_index` is a `u8`).
    pub fn gid_table(ctx: &Context, port: u8) -> Result<Vec<GidEntry>, VerbsError> {
        use crate::provider::Provider;
        let len = Verbs::query_port(ctx, port)?.gid_table_len;
        let mut out = Vec::new();
        for i in (0..=u8::MAX).take_while(|&i| u16::from(i) < len) {
            if let Some(e) = Verbs::query_gid_entry(ctx, port, i)? {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Chooses a GID of `port` as `how` says.
    ///
    /// ```no_run
    /// use zverbs::provider::verbs::{GidSelect, Verbs};
    /// use zverbs::qp::QpConfig;
    /// use zverbs::Context;
    /// let ctx = Context::open(&Verbs, "rxe0")?;
    /// let gid = Verbs::select_gid(ctx.raw(), 1, GidSelect::default())?;
    /// let config = QpConfig { gid_index: gid.index, ..QpConfig::default() };
    /// # let _ = config;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn select_gid(ctx: &Context, port: u8, how: GidSelect) -> Result<GidEntry, VerbsError> {
        match how {
            GidSelect::Index(i) => {
                Verbs::query_gid_entry(ctx, port, i)?.ok_or(VerbsError::NoGid { port })
            }
            GidSelect::PreferRoceV2Ipv4 => {
                let table = Verbs::gid_table(ctx, port)?;
                let v2 = |e: &&GidEntry| e.gid_type == GidType::RoceV2;
                table
                    .iter()
                    .filter(v2)
                    .find(|e| e.is_ipv4_mapped())
                    .or_else(|| table.iter().find(v2))
                    .or_else(|| table.first())
                    .copied()
                    .ok_or(VerbsError::NoGid { port })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_detection() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[169, 254, 77, 1]);
        let e = GidEntry {
            index: 1,
            gid: Gid(g),
            gid_type: GidType::RoceV2,
        };
        assert!(e.is_ipv4_mapped());
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        let e = GidEntry {
            gid: Gid(link_local),
            ..e
        };
        assert!(!e.is_ipv4_mapped());
        assert_eq!(gid_type(2), GidType::RoceV2);
        assert_eq!(gid_type(9), GidType::Other(9));
    }
}
