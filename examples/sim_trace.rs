//! Runs a small RC scenario with faults on the stepped simulator and writes its event trace
//! as Chrome trace-event JSON (open it in <https://ui.perfetto.dev> or `chrome://tracing`).
//!
//! ```text
//! cargo run --release --features sim --example sim_trace -- --seed 7 --out trace.json
//! ```
//!
//! The scenario, through the public zverbs API on one thread (blocking calls step the
//! fabric): writes over a lossy, duplicating, reordering wire (drops cause
//! retransmissions), a send that meets no receive (RNR NAKs and waits until the peer
//! posts one), a link flap under a write (timeouts, lost retransmissions, recovery), then
//! a read and a fetch-and-add. One seed decides every fault: the same seed writes the same
//! bytes, another seed a different trace.

/// A faulty fabric's story as a Chrome trace: lost and duplicated packets, RNR, a link
/// flap, a read and an atomic, every fault decided by one seed.
#[derive(clap::Parser)]
#[command(name = "sim_trace")]
struct Cli {
    /// The seed that decides every fault
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the trace goes (chrome://tracing, Perfetto)
    #[arg(long, value_name = "PATH", default_value = "sim_trace.json")]
    out: String,
}

#[cfg(feature = "sim")]
fn main() {
    let Cli { seed, out } = clap::Parser::parse();
    if let Err(e) = scenario::run(seed, &out) {
        eprintln!("sim_trace: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(feature = "sim"))]
fn main() {
    eprintln!("sim_trace runs on the simulator: build it with `--features sim`");
    std::process::exit(2);
}

#[cfg(feature = "sim")]
mod scenario {
    use std::error::Error;
    use std::fs::File;
    use std::io::{BufWriter, Write};
    use std::time::Duration;

    use zverbs::provider::sim::{DropReason, FabricConfig, Faults, Sim, TraceKind};
    use zverbs::qp::{RtrOptions, RtsOptions};
    use zverbs::{AccessFlags, Channel, ChannelConfig, Context, SendFlags, SendOp};

    /// `--seed N` (default 1) and `--out PATH` (default `sim_trace.json`).
    pub fn run(seed: u64, out: &str) -> Result<(), Box<dyn Error>> {
        let cfg = FabricConfig {
            faults: Faults {
                drop: 0.15,
                duplicate: 0.05,
                delay: 0.1,
                max_extra_delay_ns: 4_000,
            },
            trace: true,
            ..FabricConfig::stepped(seed)
        };
        let sim = Sim::with_config(cfg, 2);
        let fabric = sim.fabric();
        let ch_cfg = ChannelConfig {
            // 0.01 ms RNR waits, 4.2 ms ACK timeouts: short, so the trace stays readable.
            rtr: RtrOptions {
                min_rnr_timer: 1,
                ..RtrOptions::default()
            },
            rts: RtsOptions {
                timeout: 10,
                ..RtsOptions::default()
            },
            ..ChannelConfig::default()
        };
        let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
        let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
        let a = Channel::<Sim, 16, 2>::prepare(&ca, &pa, &ch_cfg)?;
        let b = Channel::<Sim, 16, 2>::prepare(&cb, &pb, &ch_cfg)?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (mut a, mut b) = (a.connect(&eb)?, b.connect(&ea)?);

        let mut src: Vec<u8> = (0..256u32).map(|i| (i * 7) as u8).collect();
        let mut target = vec![0u8; 256];
        let mut inbox = vec![0u8; 64];
        let mut local = vec![0u8; 16];
        let src_mr = pa.register(&mut src)?;
        // SAFETY: `target` is read only after every operation on it has completed.
        let target_mr = unsafe { pb.register_with_access(&mut target, AccessFlags::all())? };
        let mut inbox_mr = pb.register(&mut inbox)?;
        let mut local_mr = pa.register(&mut local)?;
        let remote = target_mr.remote();

        // 1. Writes over the faulty wire.
        for i in 0..8u64 {
            let part = src_mr.slice(i as usize * 16..(i as usize + 1) * 16)?;
            a.write([part], &remote.slice(i * 16..(i + 1) * 16)?)?;
        }

        // 2. A send before the receive: RNR NAKs until b posts one.
        let sge = src_mr.slice(128..160)?.sge();
        // SAFETY: `src` outlives the wait below and is only read.
        let send = unsafe { a.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())? };
        // Until the responder has said "not ready" at least once (the wire may lose the
        // send or the NAK; RC retransmits after a timeout).
        let rnr_naks = || {
            let trace = fabric.trace_events();
            trace
                .iter()
                .filter(|e| matches!(e.kind, TraceKind::RnrNak(_)))
                .count()
        };
        for _ in 0..10_000 {
            if rnr_naks() > 0 {
                break;
            }
            fabric.run_for(Duration::from_micros(50));
        }
        let recv = inbox_mr.slice_mut(..)?.sge();
        // SAFETY: `inbox` is not accessed until the receive is redeemed.
        let recv = unsafe { b.post_receive_unpolled(&[recv])? };
        a.wait(send)?;
        let got = b.wait(recv)?;

        // 3. A link flap under a write: timeouts while down, recovery once up.
        fabric.link_down(1)?;
        let sge = src_mr.slice(160..192)?.sge();
        let op = SendOp::Write {
            remote_addr: remote.addr + 128,
            rkey: remote.rkey,
        };
        // SAFETY: `src` outlives the wait below and is only read.
        let flap = unsafe { a.post_send_unpolled(&[sge], op, SendFlags::empty())? };
        fabric.run_for(Duration::from_millis(6));
        fabric.link_up(1)?;
        a.wait(flap)?;

        // 4. A read and an atomic.
        a.read([local_mr.slice_mut(..8)?], &remote.slice(0..8)?)?;
        let old = a.fetch_add(local_mr.slice_mut(8..16)?, &remote.slice(248..256)?, 1)?;

        assert_eq!(got.byte_len, 32, "the send arrived whole");
        assert_eq!(&target_mr.as_slice()[..128], &src_mr.as_slice()[..128]);
        assert_eq!(
            &target_mr.as_slice()[128..160],
            &src_mr.as_slice()[160..192]
        );
        assert_eq!(&inbox_mr.as_slice()[..32], &src_mr.as_slice()[128..160]);
        assert_eq!(
            (old, &local_mr.as_slice()[..8]),
            (0, &src_mr.as_slice()[..8])
        );

        let file = File::create(out).map_err(|e| format!("cannot create {out}: {e}"))?;
        let mut file = BufWriter::new(file);
        fabric.write_chrome_trace(&mut file)?;
        file.flush()?;

        let trace = fabric.trace_events();
        let count = |f: &dyn Fn(&TraceKind) -> bool| trace.iter().filter(|e| f(&e.kind)).count();
        let drops = count(&|k| matches!(k, TraceKind::Drop(_, DropReason::Random)));
        let link = count(&|k| matches!(k, TraceKind::Drop(_, DropReason::LinkDown)));
        println!(
            "seed {seed}: {} trace events over {:?} simulated; {} retransmissions, {} random \
             drops, {} lost to the link flap, {} RNR NAKs, {} timeouts",
            trace.len(),
            fabric.now(),
            count(&|k| *k == TraceKind::Retransmit),
            drops,
            link,
            count(&|k| matches!(k, TraceKind::RnrNak(_))),
            count(&|k| *k == TraceKind::Timeout),
        );
        println!("wrote {out}");
        Ok(())
    }
}
