// INIT cannot go straight to RTS.
use zverbs::provider::sim::Sim;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, RtsOptions};
use zverbs::{CompletionQueue, Context};

fn main() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 8).unwrap();
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    let qp = qp.into_init(&InitOptions::default()).unwrap();
    let _ = qp.into_rts(&RtsOptions::default());
}
