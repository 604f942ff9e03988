// A queue pair on a shared receive queue has no receive queue of its own: posting a
// receive to it must not compile (receives go to the SRQ).
use zverbs::provider::sim::Sim;
use zverbs::qp::{InitOptions, QpConfig, QueuePair};
use zverbs::{CompletionQueue, Context, RecvWr, SharedReceiveQueue, SrqAttr};

fn main() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 8).unwrap();
    let attr = SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 };
    let srq = SharedReceiveQueue::create(&ctx, &pd, &attr).unwrap();
    let qp = QueuePair::create_on_srq(&ctx, &pd, &cq, &cq, &srq, &QpConfig::default()).unwrap();
    let qp = qp.into_init(&InitOptions::default()).unwrap();
    let wr: RecvWr<1> = RecvWr::new(1);
    unsafe { qp.post_recv(&[wr]) }.unwrap();
}
