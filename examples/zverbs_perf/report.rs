//! perftest's report format: headers, latency statistics, bandwidth rows.

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

/// Latency statistics in microseconds.
pub struct LatStats {
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

impl LatStats {
    /// Sorts `samples` (nanoseconds, at least one).
    pub fn new(samples: &mut [u64]) -> LatStats {
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0;
        let n = samples.len();
        let pct = |p: f64| us(samples[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1]);
        let avg = samples.iter().map(|&s| us(s)).sum::<f64>() / n as f64;
        let var = samples.iter().map(|&s| (us(s) - avg).powi(2)).sum::<f64>() / n as f64;
        LatStats {
            min: us(samples[0]),
            max: us(samples[n - 1]),
            median: us(samples[n / 2]),
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        }
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
