//! The simulator ping-pong of `benches/data_path.rs` (`pingpong_64B/sim_channel`) on ONE
//! thread: both sides' calls in the order a round trip makes them, so the figure is the
//! software cost of a round trip without any cross-core traffic.
//!
//! ```text
//! cargo run --release --features sim --example sim_rtt [-- ROUND_TRIPS]
//! ```
//!
//! Prints `ns_per_round_trip=<mean>`. Under `valgrind --tool=callgrind`, two runs with
//! different `ROUND_TRIPS` give instructions per round trip (setup cancels out), as
//! `scripts/callgrind.sh` does for post + poll. Compare with the two-thread bench: the
//! difference is what the two cores' sharing of the simulator costs.

use std::time::Instant;

use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context, SendFlags, SendOp};

const MSG: usize = 64;

fn buffer(len: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; len].into_boxed_slice())
}

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .map_or(Ok(200_000), |s| s.parse())
        .expect("ROUND_TRIPS must be a number");
    let sim = Sim::with_devices(2);
    let (ca, cb) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let cfg = ChannelConfig::default();
    let a = Channel::<Sim, 64, 4>::prepare(&ca, &pa, &cfg).unwrap();
    let b = Channel::<Sim, 64, 4>::prepare(&cb, &pb, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (mut a, mut b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let out = pa.register(buffer(MSG)).unwrap();
    let mut a_in = pa.register(buffer(MSG)).unwrap();
    let mut b_in = pb.register(buffer(MSG)).unwrap();
    let src = out.slice(..).unwrap();
    let a_dst = [a_in.slice_mut(..).unwrap().sge()];
    let b_buf = [b_in.slice_mut(..).unwrap().sge()];

    let start = Instant::now();
    for _ in 0..iters {
        // SAFETY (both receives): the buffer is written by the device only until the
        // receive is redeemed in this iteration, and read by nobody.
        let ra = unsafe { a.post_receive_unpolled(&a_dst) }.unwrap();
        let rb = unsafe { b.post_receive_unpolled(&b_buf) }.unwrap();
        a.send([src]).unwrap();
        b.wait(rb).unwrap();
        // SAFETY: the echo only reads `b_in`, which is not reused before it completes.
        let p = unsafe { b.post_send_unpolled(&b_buf, SendOp::Send, SendFlags::empty()) }.unwrap();
        b.wait(p).unwrap();
        let got = a.wait(ra).unwrap();
        assert_eq!(got.byte_len as usize, MSG);
    }
    let ns = start.elapsed().as_nanos() as f64 / iters.max(1) as f64;
    println!("ns_per_round_trip={ns:.0}");
}
