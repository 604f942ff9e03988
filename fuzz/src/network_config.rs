//! Target `network_config`: the JSON network configuration (`zverbs::bootstrap`:
//! `parse_config`, `NetworkConfig::from_json`, `FromStr`).
//!
//! Input: any bytes (invalid UTF-8 is replaced, so every input reaches the parser).
//!
//! Invariants, for any input:
//! - the three entry points do not panic and agree (the same configuration, or errors that
//!   display alike);
//! - an accepted configuration satisfies its invariants, checked against the document read
//!   independently as a `serde_json::Value`: the list is `{"nodes": [...]}` with entries of
//!   exactly `rank` (u32), `address` (string) and `port` (integer), the document and every
//!   entry JSON objects (never a sequence of field values); there is at least one
//!   entry; the ranks are exactly `0..n`, each once; ports are in `1..=65535`; addresses are
//!   unicast IPs; no two entries share an (address, port); and rank `r` maps to its entry's
//!   socket address, nothing beyond `n`;
//! - an accepted configuration round-trips through `to_json` and `from_addrs`;
//! - the document's canonical form (the `Value` written back, which drops duplicate keys)
//!   is accepted exactly when the reference says it is valid, and a rejection is the
//!   documented kind of error and names an entry that really has the named problem
//!   (`BadPort`, `BadAddress`, `DuplicateRank`, `DuplicateAddress`, `Gap`, `Empty`, `Json`);
//! - every error displays without panicking.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use zverbs::bootstrap::{parse_config, ConfigError, NetworkConfig};

/// One entry as the reference reads it.
#[derive(Debug)]
struct Entry {
    rank: u32,
    address: String,
    port: u64,
}

/// The document's shape per the format: `None` if it is not `{"nodes": [entries]}` with
/// entries of exactly `rank` (a u32), `address` (a string) and `port` (a u64).
fn shape(v: &Value) -> Option<Vec<Entry>> {
    let top = v.as_object()?;
    if top.len() != 1 {
        return None;
    }
    let mut out = Vec::new();
    for e in top.get("nodes")?.as_array()? {
        let e = e.as_object()?;
        if e.len() != 3 {
            return None;
        }
        out.push(Entry {
            rank: u32::try_from(e.get("rank")?.as_u64()?).ok()?,
            address: e.get("address")?.as_str()?.to_owned(),
            port: e.get("port")?.as_u64()?,
        });
    }
    Some(out)
}

fn ip_ok(address: &str) -> Option<IpAddr> {
    let ip: IpAddr = address.parse().ok()?;
    (!ip.is_unspecified() && !ip.is_multicast()).then_some(ip)
}

fn port_ok(port: u64) -> Option<u16> {
    u16::try_from(port).ok().filter(|&p| p != 0)
}

fn addr_of(e: &Entry) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip_ok(&e.address)?, port_ok(e.port)?))
}

/// Whether the entries make a valid configuration, by the documented invariants.
fn valid(entries: &[Entry]) -> bool {
    let n = entries.len();
    let ranks: HashSet<u32> = entries.iter().map(|e| e.rank).collect();
    let addrs: Option<HashSet<SocketAddr>> = entries.iter().map(addr_of).collect();
    n > 0
        && ranks.len() == n
        && entries.iter().all(|e| (e.rank as usize) < n)
        && addrs.is_some_and(|a| a.len() == n)
}

/// An accepted configuration against its document.
fn check_accepted(cfg: &NetworkConfig, entries: &[Entry]) {
    let n = entries.len();
    assert!(
        valid(entries),
        "accepted an invalid configuration: {entries:?}"
    );
    assert_eq!(cfg.len(), n, "rank count");
    assert!(!cfg.is_empty());
    assert_eq!(cfg.addrs().len(), n);
    for e in entries {
        assert_eq!(cfg.get(e.rank), addr_of(e), "rank {} address", e.rank);
    }
    assert_eq!(cfg.get(n as u32), None, "a rank beyond n");
    let distinct: HashSet<&SocketAddr> = cfg.addrs().iter().collect();
    assert_eq!(distinct.len(), n, "duplicate addresses accepted");
    for a in cfg.addrs() {
        assert!(a.port() != 0 && ip_ok(&a.ip().to_string()).is_some(), "{a}");
    }
    let json = cfg.to_json();
    assert_eq!(
        parse_config(&json).as_ref().ok(),
        Some(cfg),
        "to_json does not round-trip: {json}"
    );
    assert_eq!(
        NetworkConfig::from_addrs(cfg.addrs().to_vec())
            .ok()
            .as_ref(),
        Some(cfg),
        "from_addrs disagrees"
    );
}

/// A rejection of a well-shaped document names an entry that has the named problem.
fn check_rejection(e: &ConfigError, entries: &[Entry]) {
    let n = entries.len();
    let at = |i: usize| -> &Entry {
        entries
            .get(i)
            .unwrap_or_else(|| panic!("{e:?} names entry {i} of {n}"))
    };
    match *e {
        ConfigError::Empty => assert_eq!(n, 0),
        ConfigError::BadPort { index, rank, port } => {
            let x = at(index);
            assert_eq!((x.rank, x.port), (rank, port), "{e:?}");
            assert!(port_ok(port).is_none(), "{e:?}: the port is fine");
        }
        ConfigError::BadAddress {
            index,
            rank,
            ref address,
        } => {
            let x = at(index);
            assert_eq!((x.rank, &x.address), (rank, address), "{e:?}");
            assert!(ip_ok(address).is_none(), "{e:?}: the address is fine");
        }
        ConfigError::DuplicateRank {
            rank,
            first_index,
            second_index,
        } => {
            assert!(first_index < second_index, "{e:?}");
            assert_eq!((at(first_index).rank, at(second_index).rank), (rank, rank));
        }
        ConfigError::DuplicateAddress {
            addr,
            first_index,
            first_rank,
            second_index,
            second_rank,
        } => {
            assert!(first_index < second_index, "{e:?}");
            let (a, b) = (at(first_index), at(second_index));
            assert_eq!((a.rank, b.rank), (first_rank, second_rank), "{e:?}");
            assert_eq!((addr_of(a), addr_of(b)), (Some(addr), Some(addr)), "{e:?}");
        }
        ConfigError::Gap {
            missing_rank,
            index,
            rank,
            len,
        } => {
            assert_eq!(len, n, "{e:?}");
            assert_eq!(at(index).rank, rank, "{e:?}");
            assert!(rank as usize >= n, "{e:?}: rank {rank} is in 0..{n}");
            assert!((missing_rank as usize) < n, "{e:?}");
            assert!(
                entries.iter().all(|x| x.rank != missing_rank),
                "{e:?}: rank {missing_rank} has an entry"
            );
        }
        ref other => panic!("a well-shaped document rejected with {other:?}"),
    }
}

/// Runs one input.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let s: &str = &text;
    let parsed = parse_config(s);
    let via_json = NetworkConfig::from_json(s);
    let via_str = s.parse::<NetworkConfig>();
    let (a, b, c) = (
        parsed.as_ref().map_err(|e| e.to_string()),
        via_json.as_ref().map_err(|e| e.to_string()),
        via_str.as_ref().map_err(|e| e.to_string()),
    );
    assert!(
        a == b && b == c,
        "entry points disagree: {a:?} / {b:?} / {c:?}"
    );

    let value: Option<Value> = serde_json::from_str(s).ok();
    match &parsed {
        Ok(cfg) => {
            let v = value.expect("accepted a document that is not JSON");
            let entries = shape(&v).expect("accepted a document of the wrong shape");
            check_accepted(cfg, &entries);
        }
        Err(ConfigError::Json { message, .. }) => assert!(!message.is_empty()),
        Err(e) => {
            // Past the JSON stage: the document is well-shaped.
            let v = value.expect("a non-JSON document passed the JSON stage");
            let entries = shape(&v).expect("a document of the wrong shape passed the JSON stage");
            check_rejection(e, &entries);
        }
    }

    // The canonical form: accepted exactly when the reference says it is valid.
    if let Some(v) = serde_json::from_str::<Value>(s).ok().as_ref() {
        let canonical = serde_json::to_string(v).expect("write a JSON value");
        let got = parse_config(&canonical);
        match (shape(v), &got) {
            (None, Err(ConfigError::Json { .. })) => {}
            (None, r) => panic!("wrong shape, but not a JSON error: {r:?} for {canonical}"),
            (Some(entries), Ok(cfg)) => check_accepted(cfg, &entries),
            (Some(entries), Err(e)) => {
                assert!(
                    !valid(&entries),
                    "rejected a valid configuration ({e}): {canonical}"
                );
                check_rejection(e, &entries);
            }
        }
    }
}

/// Bytes of a configuration document, for seeds: `(rank, address, port)` entries.
pub fn document(nodes: &[(u32, &str, u64)]) -> String {
    let entries: Vec<String> = nodes
        .iter()
        .map(|(r, a, p)| format!(r#"{{"rank":{r},"address":"{a}","port":{p}}}"#))
        .collect();
    format!(r#"{{"nodes":[{}]}}"#, entries.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_agrees_on_simple_documents() {
        for nodes in [
            &[(0, "127.0.0.1", 7000)][..],
            &[(1, "::1", 1), (0, "10.0.0.1", 65535)],
            &[(0, "127.0.0.1", 0)],
            &[(0, "224.0.0.1", 5)],
            &[(0, "1.2.3.4", 5), (0, "1.2.3.5", 5)],
            &[(0, "1.2.3.4", 5), (1, "1.2.3.4", 5)],
            &[(0, "1.2.3.4", 5), (2, "1.2.3.5", 5)],
            &[],
        ] {
            check(document(nodes).as_bytes());
        }
        // Unknown and duplicate keys, wrong types.
        check(br#"{"nodes":[],"x":1}"#);
        check(br#"{"nodes":[{"rank":0,"rank":0,"address":"::1","port":1}]}"#);
        check(br#"{"nodes":[{"rank":-1,"address":"::1","port":1}]}"#);
        check(br#"{"nodes":[{"rank":0,"address":"::1","port":1.0}]}"#);
        // Sequences where the format has objects (serde's derive reads a struct from one).
        check(b"[[]]");
        check(br#"{"nodes":[[0,"127.0.0.1",7000]]}"#);
        check(br#"[[{"rank":0,"address":"127.0.0.1","port":7000}]]"#);
    }
}
