//! The command line of `zverbs_perf` (clap: `--help` documents every flag).

use clap::{Parser, ValueEnum};

use crate::{MAX_SIZE, RING};

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

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Lat => "lat",
            Kind::Bw => "bw",
        }
    }
}

/// The provider the tests run on.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum Backend {
    /// The in-process simulator (untimed: the figures are software cost).
    Sim,
    /// A verbs device (a NIC or soft-RoCE), both ends on it in loopback.
    Verbs,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Verbs => "verbs",
        }
    }
}

/// `--test`: an operation, or all three.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
enum TestArg {
    Send,
    Write,
    Read,
    /// send, write and read
    All,
}

/// `--kind`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
enum KindArg {
    /// ping-pong latency (read: one read and its completion)
    Lat,
    /// messages kept in flight `--tx-depth` at a time
    Bw,
    /// latency, then bandwidth
    Both,
}

/// perftest-style latency and bandwidth tests over zverbs channels, with perftest's
/// columns (ib_send_lat, ib_write_lat, ib_read_lat, ib_*_bw).
#[derive(Parser, Debug)]
#[command(
    name = "zverbs_perf",
    after_help = "Latency columns: #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] \
t_avg[usec] t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec] (t_typical is the \
median). Bandwidth columns: #bytes #iterations BW peak[MB/sec] BW average[MB/sec] \
MsgRate[Mpps] (MB = 2^20 bytes)."
)]
struct Args {
    /// Operations, a comma list
    #[arg(
        short = 't',
        long = "test",
        value_enum,
        value_delimiter = ',',
        default_value = "send"
    )]
    test: Vec<TestArg>,
    /// Latency or bandwidth test
    #[arg(short, long, value_enum, default_value = "lat")]
    kind: KindArg,
    /// One message size in bytes [default: 2 for lat, 65536 for bw]
    #[arg(short, long, value_name = "BYTES", value_parser = size, conflicts_with_all = ["sizes", "all"])]
    size: Option<usize>,
    /// A comma list of message sizes in bytes
    #[arg(long, value_name = "A,B,..", value_delimiter = ',', value_parser = size, conflicts_with = "all")]
    sizes: Option<Vec<usize>>,
    /// Every power of two from 2 B to 1 MiB (perftest's -a)
    #[arg(short, long)]
    all: bool,
    /// Iterations per size [default: 1000 for lat, 5000 for bw]
    #[arg(short = 'n', long, value_name = "N", value_parser = count)]
    iters: Option<usize>,
    /// Bandwidth window: messages in flight, at most 128
    #[arg(long, value_name = "N", default_value_t = RING, value_parser = tx_depth)]
    tx_depth: usize,
    /// Bandwidth: post lists of N requests built once, one doorbell each, the last
    /// signaled (perftest's --post_list); sends and writes, at most 128
    #[arg(short = 'l', long, value_name = "N", default_value_t = 1, value_parser = tx_depth)]
    post_list: usize,
    /// Write each latency histogram as SVG: to PATH for one test of one size, else to
    /// STEM-OP-SIZE.svg
    #[arg(long, value_name = "PATH.svg")]
    histogram: Option<String>,
    /// One JSON object per result row on stdout, instead of perftest's tables
    #[arg(long)]
    json: bool,
    /// Provider
    #[arg(long, value_enum, default_value = "sim")]
    backend: Backend,
    /// Verbs device [default: ZVERBS_DEVICE, else the first one]
    #[arg(short, long, value_name = "NAME")]
    device: Option<String>,
    /// Verbs only: perftest's ib_send_lat, ib_write_lat and ib_write_bw and this tool's
    /// equivalents, interleaved, with the ratios
    #[arg(long)]
    vs_perftest: bool,
    /// Rounds of --vs-perftest (each runs both once, alternating which goes first)
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = count)]
    rounds: usize,
}

/// What to run, with the defaults applied.
#[derive(Debug)]
pub struct Opts {
    pub ops: Vec<Op>,
    pub kinds: Vec<Kind>,
    pub sizes: Option<Vec<usize>>,
    pub iters: Option<usize>,
    pub tx_depth: usize,
    /// Requests per posted list in the bandwidth tests (1: one post per request).
    pub post_list: usize,
    pub histogram: Option<String>,
    pub json: bool,
    pub backend: Backend,
    /// Verbs only, as `rounds`.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub device: Option<String>,
    /// `--vs-perftest`: the side-by-side comparison against perftest's binaries.
    pub vs_perftest: bool,
    /// Rounds of the comparison (each runs perftest and zverbs once, alternating order).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub rounds: usize,
}

fn size(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("not a size: {s:?}"))?;
    if !(1..=MAX_SIZE).contains(&n) {
        return Err(format!("{n} is out of range 1..={MAX_SIZE}"));
    }
    Ok(n)
}

fn count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("needs a number of at least 1, not {s:?}")),
    }
}

fn tx_depth(s: &str) -> Result<usize, String> {
    match count(s)? {
        n if n <= RING => Ok(n),
        n => Err(format!("{n} is past the ring of {RING}")),
    }
}

/// Parses the process arguments; on a bad one, clap prints it with the usage and exits.
pub fn parse_args() -> Opts {
    Args::parse().into()
}

/// Parses `args` (the program name first).
#[cfg(test)]
pub fn parse_from<I: Into<std::ffi::OsString> + Clone>(
    args: impl IntoIterator<Item = I>,
) -> Result<Opts, clap::Error> {
    Args::try_parse_from(args).map(Opts::from)
}

impl From<Args> for Opts {
    fn from(a: Args) -> Opts {
        let mut ops = Vec::new();
        for t in a.test {
            let more: &[Op] = match t {
                TestArg::Send => &[Op::Send],
                TestArg::Write => &[Op::Write],
                TestArg::Read => &[Op::Read],
                TestArg::All => &[Op::Send, Op::Write, Op::Read],
            };
            for &op in more {
                if !ops.contains(&op) {
                    ops.push(op);
                }
            }
        }
        let kinds = match a.kind {
            KindArg::Lat => vec![Kind::Lat],
            KindArg::Bw => vec![Kind::Bw],
            KindArg::Both => vec![Kind::Lat, Kind::Bw],
        };
        let sizes = match (a.size, a.sizes, a.all) {
            (Some(s), _, _) => Some(vec![s]),
            (_, Some(list), _) => Some(list),
            (_, _, true) => Some((1..=20).map(|p| 1usize << p).collect()),
            _ => None,
        };
        Opts {
            ops,
            kinds,
            sizes,
            iters: a.iters,
            tx_depth: a.tx_depth,
            post_list: a.post_list,
            histogram: a.histogram,
            json: a.json,
            backend: a.backend,
            device: a.device,
            vs_perftest: a.vs_perftest,
            rounds: a.rounds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_lists_and_refusals() {
        let o = parse_from(["zverbs_perf"]).unwrap();
        assert_eq!(
            (o.ops, o.kinds, o.sizes, o.tx_depth, o.post_list),
            (vec![Op::Send], vec![Kind::Lat], None, RING, 1)
        );
        assert_eq!(parse_from(["p", "-l", "32"]).unwrap().post_list, 32);
        let o = parse_from([
            "p",
            "-t",
            "write,all",
            "--kind",
            "both",
            "--sizes",
            "2,4096",
            "--json",
        ])
        .unwrap();
        assert_eq!(o.ops, [Op::Write, Op::Send, Op::Read]);
        assert_eq!(
            (o.kinds, o.sizes, o.json),
            (vec![Kind::Lat, Kind::Bw], Some(vec![2, 4096]), true)
        );
        let o = parse_from(["p", "--all"]).unwrap();
        assert_eq!(
            o.sizes.map(|s| (s.len(), s[0], s[19])),
            Some((20, 2, 1 << 20))
        );
        for bad in [
            &["p", "--size", "0"][..],
            &["p", "--size", "2097152"],
            &["p", "--tx-depth", "129"],
            &["p", "--post-list", "0"],
            &["p", "--post-list", "129"],
            &["p", "--iters", "0"],
            &["p", "--size", "2", "--all"],
            &["p", "--test", "atomic"],
            &["p", "--backend", "tcp"],
        ] {
            assert!(parse_from(bad.iter().copied()).is_err(), "{bad:?}");
        }
    }
}
