//! perftest's report format: headers, latency statistics, bandwidth rows.

use hdrhistogram::Histogram;

use crate::cli::{Kind, Op};
use crate::tests::BwResult;

/// Width of perftest's separator lines.
pub const LINE: usize = 103;

/// One megabyte in perftest's units (2^20 bytes).
const MB: f64 = (1 << 20) as f64;

/// Prints the header of one test, as perftest does.
pub fn header(describe: &str, op: Op, kind: Kind, tx_depth: usize, iters: usize) {
    let what = match kind {
        Kind::Lat => "Latency",
        Kind::Bw => "BW",
    };
    println!("{}", "-".repeat(LINE));
    println!("                    {} {what} Test", op.title());
    println!(" Backend         : {describe}");
    println!(" Connection type : RC          Using SRQ : OFF");
    match kind {
        Kind::Lat => println!(" Iterations      : {iters}"),
        Kind::Bw => println!(" TX depth        : {tx_depth}   Iterations: {iters}"),
    }
    println!("{}", "-".repeat(LINE));
    match kind {
        Kind::Lat => println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
             t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        ),
        Kind::Bw => println!(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        ),
    }
}

/// Latency statistics in microseconds, read from a histogram of nanoseconds (three
/// significant digits: each figure within 0.1 % of the sample it stands for).
pub struct LatStats {
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

/// The histogram of latency samples, nanoseconds.
pub fn histogram(samples: &[u64]) -> Histogram<u64> {
    // Three significant digits, resizing to the largest sample: recording cannot fail.
    let mut h = Histogram::<u64>::new(3).expect("3 significant digits are supported");
    for &s in samples {
        h.record(s)
            .expect("an auto-resizing histogram takes any value");
    }
    h
}

impl LatStats {
    /// The statistics of `h` (at least one sample).
    pub fn new(h: &Histogram<u64>) -> LatStats {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatStats {
            min: us(h.min()),
            max: us(h.max()),
            median: us(h.value_at_quantile(0.5)),
            avg: h.mean() / 1000.0,
            stdev: h.stdev() / 1000.0,
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
        }
    }

    /// The row as one JSON object (`--json`).
    pub fn json(&self, op: Op, size: usize, iters: usize, backend: &str) -> serde_json::Value {
        serde_json::json!({
            "test": op.name(), "kind": Kind::Lat.name(), "backend": backend,
            "bytes": size, "iterations": iters,
            "t_min_us": self.min, "t_max_us": self.max, "t_typical_us": self.median,
            "t_avg_us": self.avg, "t_stdev_us": self.stdev,
            "p99_us": self.p99, "p99_9_us": self.p999,
        })
    }

    pub fn print_row(&self, size: usize, iters: usize) {
        println!(
            " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        \
             {:<7.2}         {:<7.2}                {:<7.2}",
            size, iters, self.min, self.max, self.median, self.avg, self.stdev, self.p99, self.p999
        );
    }
}

impl BwResult {
    /// Average bandwidth, MB/s (2^20 bytes).
    pub fn average_mb(&self) -> f64 {
        self.bytes as f64 / self.total.as_secs_f64().max(f64::MIN_POSITIVE) / MB
    }

    /// Messages per second, in millions.
    pub fn mpps(&self) -> f64 {
        (self.bytes / self.size as u64) as f64
            / self.total.as_secs_f64().max(f64::MIN_POSITIVE)
            / 1e6
    }

    /// The row as one JSON object (`--json`).
    pub fn json(&self, op: Op, iters: usize, tx_depth: usize, backend: &str) -> serde_json::Value {
        let avg = self.average_mb();
        serde_json::json!({
            "test": op.name(), "kind": Kind::Bw.name(), "backend": backend,
            "bytes": self.size, "iterations": iters, "tx_depth": tx_depth,
            "bw_peak_mb_s": (self.best_window / MB).max(avg), "bw_average_mb_s": avg,
            "msg_rate_mpps": self.mpps(),
        })
    }

    pub fn print_row(&self, iters: usize) {
        let avg = self.average_mb();
        println!(
            " {:<10} {:<10}       {:<10.2}         {:<10.2}           {:<.6}",
            self.size,
            iters,
            (self.best_window / MB).max(avg),
            avg,
            self.mpps()
        );
    }
}
