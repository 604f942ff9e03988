// Posting a receive on a queue pair still in RESET must not compile (receives from INIT on).
use zverbs::provider::sim::Sim;
use zverbs::qp::{QpConfig, QueuePair};
use zverbs::{CompletionQueue, Context, RecvWr};

fn main() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 8).unwrap();
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    let wr: RecvWr<1> = RecvWr::new(1);
    unsafe { qp.post_recv(&[wr]) }.unwrap();
}
