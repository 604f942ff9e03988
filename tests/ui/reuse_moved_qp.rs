// A transition consumes the queue pair: the old value cannot be used again.
use zverbs::provider::sim::Sim;
use zverbs::qp::{InitOptions, QpConfig, QueuePair};
use zverbs::{CompletionQueue, Context};

fn main() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 8).unwrap();
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    let _init = qp.into_init(&InitOptions::default()).unwrap();
    let _again = qp.into_init(&InitOptions::default());
}
