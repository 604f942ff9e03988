//! The command line of `zverbs_perf`.

use crate::{Res, MAX_SIZE, RING};

/// A perftest operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Send,
    Write,
    Read,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Op::Send => "Send",
            Op::Write => "RDMA_Write",
            Op::Read => "RDMA_Read",
        }
    }
}

/// Latency or bandwidth.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Lat,
    Bw,
}

/// Parsed options.
pub struct Opts {
    pub ops: Vec<Op>,
    pub kinds: Vec<Kind>,
    pub sizes: Option<Vec<usize>>,
    pub iters: Option<usize>,
    pub tx_depth: usize,
    pub histogram: Option<String>,
    pub backend: String,
    pub device: Option<String>,
    /// `--vs-perftest`: the side-by-side comparison against perftest's binaries.
    pub vs_perftest: bool,
    /// Rounds of the comparison (each runs perftest and zverbs once, alternating order).
    pub rounds: usize,
}

pub const USAGE: &str = "usage: zverbs_perf [--test send|write|read|all] [--kind lat|bw|both] \
[--size BYTES | --sizes A,B,.. | --all] [--iters N] [--tx-depth N] [--histogram PATH.svg] \
[--backend sim|verbs] [--device NAME] [--vs-perftest [--rounds N]]";

fn parse_size(s: &str) -> Res<usize> {
    let n: usize = s.parse().map_err(|_| format!("bad size {s:?}"))?;
    if !(1..=MAX_SIZE).contains(&n) {
        return Err(format!("size {n} out of range 1..={MAX_SIZE}").into());
    }
    Ok(n)
}

fn parse_count(flag: &str, s: &str) -> Res<usize> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{flag} needs a number of at least 1, not {s:?}").into()),
    }
}

/// Parses the process arguments.
pub fn parse_args() -> Res<Opts> {
    parse_from(std::env::args().skip(1))
}

/// Parses `args` (without the program name).
pub fn parse_from(args: impl IntoIterator<Item = String>) -> Res<Opts> {
    let mut o = Opts {
        ops: vec![Op::Send],
        kinds: vec![Kind::Lat],
        sizes: None,
        iters: None,
        tx_depth: RING,
        histogram: None,
        backend: "sim".into(),
        device: None,
        vs_perftest: false,
        rounds: 2,
    };
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--test" | "-t" => {
                o.ops = Vec::new();
                for t in val()?.split(',') {
                    match t {
                        "send" => o.ops.push(Op::Send),
                        "write" => o.ops.push(Op::Write),
                        "read" => o.ops.push(Op::Read),
                        "all" => o.ops.extend([Op::Send, Op::Write, Op::Read]),
                        _ => return Err(format!("unknown test {t:?}\n{USAGE}").into()),
                    }
                }
            }
            "--kind" | "-k" => {
                o.kinds = match val()?.as_str() {
                    "lat" => vec![Kind::Lat],
                    "bw" => vec![Kind::Bw],
                    "both" => vec![Kind::Lat, Kind::Bw],
                    k => return Err(format!("unknown kind {k:?}\n{USAGE}").into()),
                }
            }
            "--size" | "-s" => o.sizes = Some(vec![parse_size(&val()?)?]),
            "--sizes" => {
                o.sizes = Some(val()?.split(',').map(parse_size).collect::<Res<Vec<_>>>()?)
            }
            "--all" | "-a" => o.sizes = Some((1..=20).map(|p| 1usize << p).collect()),
            "--iters" | "-n" => o.iters = Some(parse_count("--iters", &val()?)?),
            "--tx-depth" => {
                let n = parse_count("--tx-depth", &val()?)?;
                if n > RING {
                    return Err(format!("--tx-depth must be 1..={RING}").into());
                }
                o.tx_depth = n;
            }
            "--histogram" => o.histogram = Some(val()?),
            "--backend" => o.backend = val()?,
            "--device" | "-d" => o.device = Some(val()?),
            "--vs-perftest" => o.vs_perftest = true,
            "--rounds" => o.rounds = parse_count("--rounds", &val()?)?,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}").into()),
        }
    }
    Ok(o)
}
