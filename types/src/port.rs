//! Ports: their addresses, MTUs and state.

use core::fmt;

/// A 128-bit global identifier (port address on RoCE, subnet-scoped name on InfiniBand).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// Path MTU (`ibv_mtu`; the discriminant is the verbs value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes (the RoCE default over a 1500-byte Ethernet MTU).
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU for a verbs value, if valid.
    pub const fn from_raw(v: u8) -> Option<Mtu> {
        use Mtu::*;
        const BY_RAW: [Mtu; 5] = [Mtu256, Mtu512, Mtu1024, Mtu2048, Mtu4096];
        match v {
            1..=5 => Some(BY_RAW[v as usize - 1]),
            _ => None,
        }
    }

    /// Size in bytes.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// Link state of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    /// The link is down.
    Down,
    /// The link is up and usable.
    Active,
}

/// Port attributes (`ibv_port_attr`, the fields zverbs uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Link state.
    pub state: PortState,
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use on the link.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_table_len: u16,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn mtu_values_match_verbs() {
        assert_eq!(Mtu::from_raw(5), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(Mtu::from_raw(6), None);
    }

    #[test]
    fn gid_displays_as_eight_groups() {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 1;
        assert_eq!(
            format!("{}", Gid(g)),
            "fe80:0000:0000:0000:0000:0000:0000:0001"
        );
    }
}
