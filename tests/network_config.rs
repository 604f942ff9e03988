//! The JSON network configuration: what `parse_config` accepts, and the entry every
//! refusal names.
#![cfg(feature = "std")]

use zverbs::bootstrap::{parse_config, ConfigError, NetworkConfig};

fn node(rank: u32, address: &str, port: u32) -> String {
    format!(r#"{{"rank":{rank},"address":"{address}","port":{port}}}"#)
}

fn nodes(entries: &[String]) -> String {
    format!(r#"{{"nodes":[{}]}}"#, entries.join(","))
}

#[test]
fn config_valid_in_any_order_v4_and_v6() {
    let cfg = parse_config(&nodes(&[
        node(2, "10.0.0.3", 7000),
        node(0, "10.0.0.1", 7000),
        node(1, "fe80::1", 7001),
    ]))
    .unwrap();
    assert_eq!(cfg.len(), 3);
    assert!(!cfg.is_empty());
    assert_eq!(cfg.get(0), Some("10.0.0.1:7000".parse().unwrap()));
    assert_eq!(cfg.get(1), Some("[fe80::1]:7001".parse().unwrap()));
    assert_eq!(cfg.get(2), Some("10.0.0.3:7000".parse().unwrap()));
    assert_eq!(cfg.get(3), None);
    assert_eq!(parse_config(&cfg.to_json()).unwrap(), cfg);
    // Same address, different ports: fine.
    assert!(parse_config(&nodes(&[node(0, "::1", 1), node(1, "::1", 2)])).is_ok());
}

/// Why `entries` are refused; the message must name each of `names`.
fn refusal(entries: &[String], names: &[&str]) -> ConfigError {
    let e = parse_config(&nodes(entries)).unwrap_err();
    let msg = e.to_string();
    for name in names {
        assert!(msg.contains(name), "{name:?} not in {msg:?}");
    }
    e
}

/// Ranks given twice, a rank missing: each refusal names the entries and is the right
/// error.
#[test]
fn config_duplicate_rank_and_gap() {
    let dup = [
        node(0, "10.0.0.1", 1),
        node(1, "10.0.0.2", 1),
        node(1, "10.0.0.3", 1),
    ];
    let e = refusal(&dup, &["entries 1 and 2", "rank 1"]);
    let (rank, first_index, second_index) = (1, 1, 2);
    let want = ConfigError::DuplicateRank {
        rank,
        first_index,
        second_index,
    };
    assert_eq!(format!("{e:?}"), format!("{want:?}"));
    let gap = [
        node(0, "10.0.0.1", 1),
        node(3, "10.0.0.2", 1),
        node(1, "10.0.0.3", 1),
    ];
    let e = refusal(&gap, &["rank 2", "entry 1 has rank 3"]);
    let (missing_rank, index, rank, len) = (2, 1, 3, 3);
    let want = ConfigError::Gap {
        missing_rank,
        index,
        rank,
        len,
    };
    assert_eq!(format!("{e:?}"), format!("{want:?}"));
}

#[test]
fn config_bad_port() {
    for (port, shown) in [(0u32, "port 0"), (70000, "port 70000")] {
        let two = [node(0, "10.0.0.1", 1), node(1, "10.0.0.2", port)];
        let e = refusal(&two, &["entry 1 (rank 1)", shown]);
        assert!(
            matches!(e, ConfigError::BadPort { index: 1, rank: 1, port: p } if u64::from(port) == p),
            "{e:?}"
        );
    }
}

#[test]
fn config_bad_address() {
    for bad in ["example.com", "10.0.0", "0.0.0.0", "::", "224.0.0.1", ""] {
        let two = [node(5, bad, 1), node(0, "10.0.0.1", 1)];
        let e = refusal(&two, &["entry 0 (rank 5)", &format!("{bad:?}")]);
        assert!(
            matches!(&e, ConfigError::BadAddress { index: 0, rank: 5, address } if address == bad),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn config_duplicate_address() {
    let three = [
        node(0, "10.0.0.1", 7000),
        node(1, "10.0.0.2", 7000),
        node(2, "10.0.0.1", 7000),
    ];
    let e = refusal(
        &three,
        &["entries 0 (rank 0) and 2 (rank 2)", "10.0.0.1:7000"],
    );
    let want = |e: &_| {
        matches!(
            e,
            ConfigError::DuplicateAddress {
                first_index: 0,
                first_rank: 0,
                second_index: 2,
                second_rank: 2,
                ..
            }
        )
    };
    assert!(want(&e), "{e:?}");
    // The same IPv6 address written two ways is still one address.
    let e = refusal(&[node(0, "::1", 9), node(1, "0:0::1", 9)], &[]);
    assert!(matches!(e, ConfigError::DuplicateAddress { .. }), "{e:?}");
}

#[test]
fn config_json_errors_have_positions() {
    let e = parse_config("{\"nodes\": [\n  {\"rank\": 0,, }\n]}").unwrap_err();
    assert!(
        matches!(e, ConfigError::Json { line: 2, column, .. } if column > 0),
        "{e:?}"
    );
    assert!(e.to_string().contains("line 2"), "{e}");

    let unknown = r#"{"nodes":[{"rank":0,"address":"10.0.0.1","port":1,"weight":3}]}"#;
    let e = parse_config(unknown).unwrap_err();
    assert!(matches!(e, ConfigError::Json { .. }), "{e:?}");
    assert!(e.to_string().contains("weight"), "{e}");

    let e = parse_config(r#"{"nodes":[], "extra": 1}"#).unwrap_err();
    assert!(matches!(e, ConfigError::Json { .. }), "{e:?}");
    let e = parse_config(r#"{"nodes":[{"rank":-1,"address":"10.0.0.1","port":1}]}"#).unwrap_err();
    assert!(matches!(e, ConfigError::Json { .. }), "{e:?}");
}

#[test]
fn config_empty() {
    let e = parse_config(r#"{"nodes":[]}"#).unwrap_err();
    assert!(matches!(e, ConfigError::Empty), "{e:?}");
    assert!(e.to_string().contains("no nodes"));
}

#[test]
fn config_from_file_and_io_error() {
    let path = std::env::temp_dir().join(format!("zverbs-exchange-{}.json", std::process::id()));
    std::fs::write(&path, nodes(&[node(0, "127.0.0.1", 7000)])).unwrap();
    let cfg = NetworkConfig::from_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(cfg, NetworkConfig::localhost(1, 7000).unwrap());

    let e = NetworkConfig::from_file(&path).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Io { path: p, .. } if p == &path),
        "{e:?}"
    );
    assert!(std::error::Error::source(&e).is_some());
    assert!(e.to_string().contains("zverbs-exchange-"), "{e}");
}

#[test]
fn config_localhost_and_from_str() {
    let cfg = NetworkConfig::localhost(4, 9000).unwrap();
    assert_eq!(cfg.len(), 4);
    assert_eq!(cfg.get(3), Some("127.0.0.1:9003".parse().unwrap()));
    let again: NetworkConfig = cfg.to_json().parse().unwrap();
    assert_eq!(again, cfg);
    assert!(matches!(
        NetworkConfig::localhost(3, u16::MAX - 1),
        Err(ConfigError::PortRange { .. })
    ));
}
