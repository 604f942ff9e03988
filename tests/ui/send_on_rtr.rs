// Posting a send on a queue pair in RTR (connected, not yet RTS) must not compile.
use zverbs::provider::sim::Sim;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, RtrOptions};
use zverbs::{CompletionQueue, Context, SendFlags, SendOp, SendWr};

fn main() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 8).unwrap();
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    let qp = qp.into_init(&InitOptions::default()).unwrap();
    let ep = qp.endpoint();
    let qp = qp.into_rtr(&ep, &RtrOptions::default()).unwrap();
    let wr: SendWr<1> = SendWr::new(1, SendOp::Send, SendFlags::SIGNALED);
    unsafe { qp.post_send(&[wr]) }.unwrap();
}
