//! Where the manager's addresses lead: the devices behind IP addresses, and the path
//! attributes and datagram peers that ids learn once their peer answered.

use std::net::IpAddr;

use zverbs_types::cm::{CmPath, PortSpace, UdPeer};
use zverbs_types::AhAttr;
use zverbs_types::{Gid, Mtu};

use super::tables::CmTables;
use crate::types::SimError;

/// What the manager needs of the fabric: each device's GIDs, LID, MTU and whether its
/// port is up.
pub(crate) trait Devices {
    fn count(&self) -> usize;
    fn gids(&self, dev: usize) -> [Gid; 2];
    fn lid(&self, dev: usize) -> u16;
    fn mtu(&self, dev: usize) -> Mtu;
    fn port_up(&self, dev: usize) -> bool;
}

/// The device whose GIDs hold `ip` (IPv4 as its IPv4-mapped GID).
pub(crate) fn device_of(devs: &dyn Devices, ip: IpAddr) -> Option<usize> {
    let gid = match ip {
        IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => Gid(v6.octets()),
    };
    (0..devs.count()).find(|&d| devs.gids(d).contains(&gid))
}

/// The IPv4 address of `dev`: its IPv4-mapped GID.
pub(crate) fn ip_of(devs: &dyn Devices, dev: usize) -> IpAddr {
    let gid = devs.gids(dev)[1];
    match std::net::Ipv6Addr::from(gid.0).to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(gid.0.into()),
    }
}

impl CmTables {
    /// The queue pair attributes of id `i`'s connection (`rdma_init_qp_attr`).
    pub(crate) fn path(&self, devs: &dyn Devices, i: usize) -> Result<CmPath, SimError> {
        let id = self.id(i);
        let (Some(dev), Some(theirs)) = (id.dev, id.theirs) else {
            return Err(SimError::Invalid("rdma_init_qp_attr: no peer yet"));
        };
        Ok(CmPath {
            port: 1,
            sgid_index: 1,
            local_psn: id.mine.map_or_else(|| psn_of(id.key), |m| m.psn),
            remote_qp_num: theirs.param.qp_num,
            remote_psn: theirs.psn,
            remote_lid: devs.lid(theirs.dev),
            remote_gid: devs.gids(theirs.dev)[1],
            mtu: devs.mtu(dev).min(devs.mtu(theirs.dev)),
            remote_qkey: theirs.param.qkey,
            responder_resources: theirs.param.responder_resources,
            initiator_depth: theirs.param.initiator_depth,
        })
    }
}

impl CmTables {
    /// The datagram peer a datagram id `i` was answered by, if it is one and was.
    pub(crate) fn ud_peer(&self, devs: &dyn Devices, i: usize) -> Option<UdPeer> {
        let id = self.ids.get(i)?.as_ref()?;
        if id.ps != PortSpace::Ud {
            return None;
        }
        let path = self.path(devs, i).ok()?;
        Some(UdPeer {
            qp_num: path.remote_qp_num,
            qkey: path.remote_qkey,
            ah: AhAttr::new(path.port, path.remote_gid, path.sgid_index, path.remote_lid),
        })
    }
}

/// Id `key`'s first packet sequence number: fixed by the key, so a run repeats.
pub(crate) fn psn_of(key: u64) -> u32 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) & 0xff_ffff) as u32
}
