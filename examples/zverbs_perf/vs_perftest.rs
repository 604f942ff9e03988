//! `--vs-perftest`: perftest's `ib_send_lat`, `ib_write_lat` and `ib_write_bw` and this
//! tool's equivalents on the same device, interleaved, and a ratio table zverbs/perftest.
//!
//! perftest runs as two processes (server, then client on 127.0.0.1, a fresh TCP port per
//! run) with `-d DEVICE -i 1 -x GID -s SIZE -n ITERS -F`; its client's result row is
//! parsed. zverbs runs in this process on one pair of channels set up once. Each round
//! runs both, alternating which goes first, so a drift of the machine's speed during the
//! run hits both alike. The figure of each side is the median over the rounds of
//! `t_typical` (latency) or `BW average` (bandwidth).

use std::io::Read as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use zverbs::provider::verbs::Verbs;
use zverbs::Context;

use crate::backend::VerbsBackend;
use crate::cli::{Kind, Op, Opts};
use crate::report::LINE;
use crate::tests::{self, Rig};
use crate::Res;

/// One comparison: perftest's binary and our test.
struct Case {
    bin: &'static str,
    kind: Kind,
    op: Op,
}

const CASES: [Case; 3] = [
    Case {
        bin: "ib_send_lat",
        kind: Kind::Lat,
        op: Op::Send,
    },
    Case {
        bin: "ib_write_lat",
        kind: Kind::Lat,
        op: Op::Write,
    },
    Case {
        bin: "ib_write_bw",
        kind: Kind::Bw,
        op: Op::Write,
    },
];

/// Bandwidth window of both sides (perftest's default tx depth).
const TX_DEPTH: usize = 128;

struct Row {
    bin: &'static str,
    kind: Kind,
    size: usize,
    iters: usize,
    perftest: Vec<f64>,
    zverbs: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the comparison and prints the table.
pub fn run(backend: &VerbsBackend, opts: &Opts) -> Res<()> {
    let dev = backend.device.clone();
    let gid = VerbsBackend::gid_index(&Context::open(&Verbs, &dev)?)?;
    let lat_sizes = opts.sizes.clone().unwrap_or_else(|| vec![2, 64, 4096]);
    let bw_sizes = opts.sizes.clone().unwrap_or_else(|| vec![4096, 65536]);
    let mut port = 18515u16;
    let t0 = Instant::now();
    let rows = tests::with_rig(backend, |rig| {
        let mut rows = Vec::new();
        for case in &CASES {
            let (sizes, iters) = match case.kind {
                Kind::Lat => (&lat_sizes, opts.iters.unwrap_or(1000)),
                Kind::Bw => (&bw_sizes, opts.iters.unwrap_or(2000)),
            };
            for &size in sizes {
                let mut row = Row {
                    bin: case.bin,
                    kind: case.kind,
                    size,
                    iters,
                    perftest: Vec::new(),
                    zverbs: Vec::new(),
                };
                for round in 0..opts.rounds {
                    for perftest_turn in [round % 2 == 0, round % 2 != 0] {
                        if perftest_turn {
                            port = port.wrapping_add(1).max(18516);
                            let v = perftest(case, &dev, gid, size, iters, port)?;
                            row.perftest.push(v);
                        } else {
                            row.zverbs.push(ours(rig, case, size, iters)?);
                        }
                    }
                }
                eprintln!(
                    "vs-perftest: {} {size} B: perftest {:?} zverbs {:?} ({:.0} s)",
                    case.bin,
                    row.perftest,
                    row.zverbs,
                    t0.elapsed().as_secs_f64()
                );
                rows.push(row);
            }
        }
        Ok(rows)
    })?;
    print_table(&backend.device, opts.rounds, &rows);
    Ok(())
}

/// Our figure for `case`: t_typical in usec, or BW average in MB/s.
fn ours(rig: &mut Rig<'_, Verbs>, case: &Case, size: usize, iters: usize) -> Res<f64> {
    Ok(match (case.kind, case.op) {
        (Kind::Lat, op) => {
            let s = match op {
                Op::Send => tests::send_lat(rig, size, iters)?,
                Op::Write => tests::write_lat(rig, size, iters)?,
                Op::Read => tests::read_lat(rig, size, iters)?,
            };
            crate::report::LatStats::new(&crate::report::histogram(&s)).median
        }
        (Kind::Bw, op) => tests::bw(rig, op, size, iters, TX_DEPTH, 1)?.average_mb(),
    })
}

/// perftest's figure for `case`: server and client on 127.0.0.1.
fn perftest(case: &Case, dev: &str, gid: u8, size: usize, iters: usize, port: u16) -> Res<f64> {
    let args = |c: &mut Command| {
        c.args(["-d", dev, "-i", "1", "-F"])
            .args(["-x", &gid.to_string()])
            .args(["-s", &size.to_string()])
            .args(["-n", &iters.to_string()])
            .args(["-p", &port.to_string()]);
        if case.kind == Kind::Bw {
            c.args(["-t", &TX_DEPTH.to_string()]);
        }
    };
    let mut server = Command::new(case.bin);
    args(&mut server);
    let mut server = server
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {} (is perftest installed?): {e}", case.bin))?;
    // The server needs a moment to listen; the client is retried while it does not.
    std::thread::sleep(Duration::from_millis(300));
    let mut out: Option<Output> = None;
    for attempt in 0..20 {
        let mut client = Command::new(case.bin);
        args(&mut client);
        let o = client.arg("127.0.0.1").output()?;
        let ok = o.status.success();
        out = Some(o);
        if ok || server.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200 * (attempt + 1)));
    }
    let server_out = finish(&mut server, Duration::from_secs(60));
    let out = out.expect("the client ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} client failed ({}):\n{stdout}{}\nserver:\n{server_out}",
            case.bin,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    parse_row(&stdout, case.kind, size).ok_or_else(|| {
        format!(
            "{}: no result row for {size} bytes in its output:\n{stdout}",
            case.bin
        )
        .into()
    })
}

/// Waits for the server (killing it after `limit`); returns its output.
fn finish(server: &mut Child, limit: Duration) -> String {
    let t0 = Instant::now();
    while matches!(server.try_wait(), Ok(None)) && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(20));
    }
    if matches!(server.try_wait(), Ok(None)) {
        let _ = server.kill();
        let _ = server.wait();
    }
    let mut s = String::new();
    if let Some(o) = server.stdout.as_mut() {
        let _ = o.read_to_string(&mut s);
    }
    if let Some(e) = server.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// The result row of perftest's report for `size`: `t_typical` (usec) for latency tests,
/// `BW average` (MB/s) for bandwidth tests.
fn parse_row(stdout: &str, kind: Kind, size: usize) -> Option<f64> {
    stdout.lines().find_map(|line| {
        let f: Vec<f64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        if f.first() != Some(&(size as f64)) {
            return None;
        }
        match kind {
            Kind::Lat if f.len() >= 6 => Some(f[4]),
            Kind::Bw if f.len() >= 5 => Some(f[3]),
            _ => None,
        }
    })
}

/// How far the rounds of one side are apart: (max - min) / median, in percent.
fn spread(v: &[f64]) -> String {
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    format!("±{:.0} %", 50.0 * (hi - lo) / median(v))
}

fn print_table(dev: &str, rounds: usize, rows: &[Row]) {
    println!("{}", "-".repeat(LINE));
    println!(
        " zverbs vs perftest on {dev}: median of {rounds} interleaved round(s); \
         latency = t_typical [usec], bandwidth = BW average [MB/sec]; spread = half the \
         range of the rounds over the median"
    );
    println!("{}", "-".repeat(LINE));
    println!(
        " {:<13} {:>7} {:>6}  {:>9} {:>9}  {:>15}  {:>19}  target (within 5 %)",
        "test", "#bytes", "#iters", "perftest", "zverbs", "zverbs/perftest", "spread pt / zv"
    );
    for r in rows {
        let (p, z) = (median(&r.perftest), median(&r.zverbs));
        let ratio = z / p;
        // Latency: lower is better; bandwidth: higher is better.
        let met = match r.kind {
            Kind::Lat => ratio <= 1.05,
            Kind::Bw => ratio >= 0.95,
        };
        println!(
            " {:<13} {:>7} {:>6}  {:>9.2} {:>9.2}  {:>15.3}  {:>8} / {:>8}  {}",
            r.bin,
            r.size,
            r.iters,
            p,
            z,
            ratio,
            spread(&r.perftest),
            spread(&r.zverbs),
            if met { "met" } else { "MISSED" }
        );
    }
    println!("{}", "-".repeat(LINE));
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn parses_perftest_rows() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       1000          30.10          250.3        35.20             36.00          4.1             50.2                   200.1\n";
        assert_eq!(parse_row(lat, Kind::Lat, 2), Some(35.2));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      2000             120.50             110.25               0.001764\n";
        assert_eq!(parse_row(bw, Kind::Bw, 65536), Some(110.25));
        assert_eq!(parse_row(bw, Kind::Bw, 4096), None);
    }
}
