//! The network configuration: which address every rank listens on.
//!
//! ```
//! use zverbs::bootstrap::{parse_config, ConfigError};
//! let cfg = parse_config(r#"{"nodes":[
//!     {"rank":1,"address":"::1","port":7001},
//!     {"rank":0,"address":"127.0.0.1","port":7000}]}"#)?;
//! assert_eq!(cfg.len(), 2);
//! assert_eq!(cfg.get(0), Some("127.0.0.1:7000".parse()?));
//! assert_eq!(cfg.get(1), Some("[::1]:7001".parse()?));
//! assert_eq!(cfg.get(2), None);
//!
//! let err = parse_config(r#"{"nodes":[{"rank":0,"address":"127.0.0.1","port":0}]}"#);
//! assert!(matches!(err, Err(ConfigError::BadPort { index: 0, rank: 0, port: 0 })));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// The file format, as written: an object with only `nodes`, a list of entry objects.
/// Each level is read with [`Object`], so a sequence never stands in for an object.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(deserialize_with = "entry_objects")]
    nodes: Vec<RawNode>,
}

/// One `nodes` entry, as written. The port is read wide so that an out-of-range port is
/// reported as [`ConfigError::BadPort`] naming its entry, not as a bare JSON error.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    rank: u32,
    address: String,
    port: u64,
}

/// A `T` read from a JSON object only. serde's derived `Deserialize` also reads a struct
/// from a sequence of its field values (`[[]]`, `{"nodes":[[0,"::1",7]]}`); the documented
/// format has objects there, so anything but an object is a JSON error, at its position.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                // The derived impl reads the fields: unknown, duplicate and missing ones
                // are still refused.
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        d.deserialize_map(ObjectVisitor(std::marker::PhantomData))
            .map(Object)
    }
}

fn entry_objects<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RawNode>, D::Error> {
    let entries = Vec::<Object<RawNode>>::deserialize(d)?;
    Ok(entries.into_iter().map(|Object(e)| e).collect())
}

/// A checked network configuration: rank `r` listens on `addrs[r]`, for ranks `0..len()`.
///
/// Invariants: at least one rank, ports non-zero, addresses unicast IPs, no two ranks on
/// the same (address, port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkConfig {
    addrs: Vec<SocketAddr>,
}

/// Why a network configuration was rejected. Every variant about one entry names it by
/// its position in the `nodes` list (`index`, from 0) and its `rank`.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Not JSON of the expected shape (unknown fields are rejected too).
    Json {
        /// Line of the error, from 1 (0 if unknown).
        line: usize,
        /// Column of the error, from 1 (0 if unknown).
        column: usize,
        /// The parser's message, which includes the line and column.
        message: String,
    },
    /// The `nodes` list is empty.
    Empty,
    /// The port is 0 or above 65535.
    BadPort {
        /// Position of the entry.
        index: usize,
        /// Its rank.
        rank: u32,
        /// The port given.
        port: u64,
    },
    /// The address is not a unicast IPv4 or IPv6 address (host names, the unspecified
    /// address and multicast addresses are rejected).
    BadAddress {
        /// Position of the entry.
        index: usize,
        /// Its rank.
        rank: u32,
        /// The address given.
        address: String,
    },
    /// Two entries have the same rank.
    DuplicateRank {
        /// The rank.
        rank: u32,
        /// Position of the first entry with it.
        first_index: usize,
        /// Position of the second entry with it.
        second_index: usize,
    },
    /// Two entries have the same address and port.
    DuplicateAddress {
        /// The address and port.
        addr: SocketAddr,
        /// Position of the first entry with it.
        first_index: usize,
        /// Rank of the first entry.
        first_rank: u32,
        /// Position of the second entry with it.
        second_index: usize,
        /// Rank of the second entry.
        second_rank: u32,
    },
    /// The ranks are not exactly `0..n`: `missing_rank` has no entry, and the entry at
    /// `index` has a rank at or beyond `n` (the number of entries).
    Gap {
        /// The smallest rank in `0..n` with no entry.
        missing_rank: u32,
        /// Position of the first entry whose rank is `n` or more.
        index: usize,
        /// Its rank.
        rank: u32,
        /// Number of entries.
        len: usize,
    },
    /// [`NetworkConfig::localhost`]: the ports would run past 65535.
    PortRange {
        /// First port asked for.
        base_port: u16,
        /// Number of ranks asked for.
        len: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { path, source } => {
                write!(f, "cannot read network config {}: {source}", path.display())
            }
            ConfigError::Json { message, .. } => write!(f, "bad network config: {message}"),
            ConfigError::Empty => f.write_str("network config has no nodes"),
            ConfigError::BadPort { index, rank, port } => write!(
                f,
                "node entry {index} (rank {rank}): port {port} is not in 1..=65535"
            ),
            ConfigError::BadAddress {
                index,
                rank,
                address,
            } => write!(
                f,
                "node entry {index} (rank {rank}): address {address:?} is not a unicast IP address"
            ),
            ConfigError::DuplicateRank {
                rank,
                first_index,
                second_index,
            } => write!(
                f,
                "node entries {first_index} and {second_index} both have rank {rank}"
            ),
            ConfigError::DuplicateAddress {
                addr,
                first_index,
                first_rank,
                second_index,
                second_rank,
            } => write!(
                f,
                "node entries {first_index} (rank {first_rank}) and {second_index} \
                 (rank {second_rank}) both use {addr}"
            ),
            ConfigError::Gap {
                missing_rank,
                index,
                rank,
                len,
            } => write!(
                f,
                "rank {missing_rank} has no node entry: entry {index} has rank {rank}, \
                 but {len} entries must have ranks 0..{len}"
            ),
            ConfigError::PortRange { base_port, len } => {
                write!(f, "{len} ports from {base_port} run past 65535")
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Parses and checks a JSON network configuration.
pub fn parse_config(s: &str) -> Result<NetworkConfig, ConfigError> {
    let Object::<RawConfig>(raw) = serde_json::from_str(s).map_err(|e| ConfigError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    NetworkConfig::from_raw(&raw.nodes)
}

fn unicast(ip: IpAddr) -> bool {
    !ip.is_unspecified() && !ip.is_multicast()
}

impl NetworkConfig {
    /// Parses and checks a JSON network configuration (same as [`parse_config`]).
    pub fn from_json(s: &str) -> Result<NetworkConfig, ConfigError> {
        parse_config(s)
    }

    /// Reads, parses and checks a JSON network configuration file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<NetworkConfig, ConfigError> {
        let path = path.as_ref();
        let s = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        parse_config(&s)
    }

    /// Checks a list of addresses, rank `r` at `addrs[r]`.
    pub fn from_addrs(addrs: Vec<SocketAddr>) -> Result<NetworkConfig, ConfigError> {
        let nodes: Vec<RawNode> = addrs
            .iter()
            .zip(0u32..)
            .map(|(a, rank)| RawNode {
                rank,
                address: a.ip().to_string(),
                port: u64::from(a.port()),
            })
            .collect();
        if nodes.len() != addrs.len() {
            // More than 2^32 addresses: rank numbers ran out.
            return Err(ConfigError::Gap {
                missing_rank: u32::MAX,
                index: nodes.len(),
                rank: u32::MAX,
                len: addrs.len(),
            });
        }
        NetworkConfig::from_raw(&nodes)
    }

    /// `n` ranks on `127.0.0.1`, rank `r` on port `base_port + r` (for tests and examples).
    pub fn localhost(n: usize, base_port: u16) -> Result<NetworkConfig, ConfigError> {
        let range = || ConfigError::PortRange { base_port, len: n };
        let n16 = u16::try_from(n).map_err(|_| range())?;
        if n16 > 0 && base_port.checked_add(n16 - 1).is_none() {
            return Err(range());
        }
        let ip = IpAddr::from([127, 0, 0, 1]);
        NetworkConfig::from_addrs(
            (0..n16)
                .map(|r| SocketAddr::new(ip, base_port.wrapping_add(r)))
                .collect(),
        )
    }

    fn from_raw(nodes: &[RawNode]) -> Result<NetworkConfig, ConfigError> {
        if nodes.is_empty() {
            return Err(ConfigError::Empty);
        }
        let mut by_rank: HashMap<u32, usize> = HashMap::with_capacity(nodes.len());
        let mut by_addr: HashMap<SocketAddr, usize> = HashMap::with_capacity(nodes.len());
        let mut addrs = Vec::with_capacity(nodes.len());
        for (index, node) in nodes.iter().enumerate() {
            let rank = node.rank;
            let port = match u16::try_from(node.port) {
                Ok(p) if p != 0 => p,
                _ => {
                    return Err(ConfigError::BadPort {
                        index,
                        rank,
                        port: node.port,
                    })
                }
            };
            let ip = match node.address.parse::<IpAddr>() {
                Ok(ip) if unicast(ip) => ip,
                _ => {
                    return Err(ConfigError::BadAddress {
                        index,
                        rank,
                        address: node.address.clone(),
                    })
                }
            };
            if let Some(&first_index) = by_rank.get(&rank) {
                return Err(ConfigError::DuplicateRank {
                    rank,
                    first_index,
                    second_index: index,
                });
            }
            let addr = SocketAddr::new(ip, port);
            if let Some(&first_index) = by_addr.get(&addr) {
                return Err(ConfigError::DuplicateAddress {
                    addr,
                    first_index,
                    first_rank: nodes[first_index].rank,
                    second_index: index,
                    second_rank: rank,
                });
            }
            by_rank.insert(rank, index);
            by_addr.insert(addr, index);
            addrs.push((rank, addr));
        }
        // n distinct ranks, all below n, are exactly 0..n.
        let len = nodes.len();
        if let Some(index) = nodes.iter().position(|n| n.rank as usize >= len) {
            let missing_rank = (0u32..)
                .take(len)
                .find(|r| !by_rank.contains_key(r))
                .unwrap_or(0);
            return Err(ConfigError::Gap {
                missing_rank,
                index,
                rank: nodes[index].rank,
                len,
            });
        }
        addrs.sort_unstable_by_key(|&(rank, _)| rank);
        Ok(NetworkConfig {
            addrs: addrs.into_iter().map(|(_, a)| a).collect(),
        })
    }

    /// Number of ranks (at least 1).
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Always `false`: a checked configuration has at least one rank.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The address `rank` listens on, or `None` if there is no such rank.
    pub fn get(&self, rank: u32) -> Option<SocketAddr> {
        self.addrs.get(usize::try_from(rank).ok()?).copied()
    }

    /// All addresses, indexed by rank.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The configuration as JSON, in the format [`parse_config`] reads.
    pub fn to_json(&self) -> String {
        let raw = RawConfig {
            nodes: self
                .addrs
                .iter()
                .zip(0u32..)
                .map(|(a, rank)| RawNode {
                    rank,
                    address: a.ip().to_string(),
                    port: u64::from(a.port()),
                })
                .collect(),
        };
        // Serializing plain structs of strings and integers cannot fail.
        serde_json::to_string(&raw).unwrap_or_default()
    }
}

impl FromStr for NetworkConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<NetworkConfig, ConfigError> {
        parse_config(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips() {
        let cfg = NetworkConfig::localhost(3, 9000).unwrap();
        assert_eq!(parse_config(&cfg.to_json()).unwrap(), cfg);
        let v6 = NetworkConfig::from_addrs(vec!["[::1]:5".parse().unwrap()]).unwrap();
        assert_eq!(parse_config(&v6.to_json()).unwrap(), v6);
    }

    #[test]
    fn sequences_are_not_objects() {
        // serde's derive would read each of these as a struct from its field values.
        for doc in [
            "[[]]",
            r#"[[{"rank":0,"address":"127.0.0.1","port":7000}]]"#,
            r#"{"nodes":[[0,"127.0.0.1",7000]]}"#,
            r#"{"nodes":[{"rank":0,"address":"127.0.0.1","port":7000},[1,"::1",7000]]}"#,
        ] {
            let e = parse_config(doc).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Json { line: 1, .. }),
                "{doc}: {e:?}"
            );
            assert!(
                e.to_string().contains("expected a JSON object"),
                "{doc}: {e}"
            );
        }
        // Objects still read as before, with their own errors.
        assert!(parse_config(r#"{"nodes":[{"rank":0,"address":"::1","port":7}]}"#).is_ok());
        let e = parse_config(r#"{"nodes":[{"rank":0,"rank":0,"address":"::1","port":7}]}"#);
        assert!(matches!(e, Err(ConfigError::Json { .. })), "{e:?}");
        let e = parse_config(r#"{"nodes":[{"rank":0,"port":7}]}"#).unwrap_err();
        assert!(e.to_string().contains("address"), "{e}");
    }

    #[test]
    fn localhost_port_range() {
        assert!(NetworkConfig::localhost(2, 65534).is_ok());
        assert!(matches!(
            NetworkConfig::localhost(3, 65534),
            Err(ConfigError::PortRange { .. })
        ));
        assert!(matches!(
            NetworkConfig::localhost(0, 1),
            Err(ConfigError::Empty)
        ));
        assert!(matches!(
            NetworkConfig::localhost(1, 0),
            Err(ConfigError::BadPort { .. })
        ));
    }
}
