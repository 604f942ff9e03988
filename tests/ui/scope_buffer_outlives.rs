// A buffer posted in a scope must outlive the scope: a buffer local to the closure is
// rejected, so no work can be in flight on freed memory.
use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context};

fn main() {
    let sim = Sim::with_devices(2);
    let ca = Context::open(&sim, "sim0").unwrap();
    let pa = ca.alloc_pd().unwrap();
    let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default()).unwrap();
    let ep = a.endpoint();
    let mut a = a.connect(&ep).unwrap();
    let _ = a.scope(|s| {
        let mut local = [0u8; 8];
        let mr = pa.register(&mut local).unwrap();
        s.post_send([mr.slice(..).unwrap()])?;
        Ok(())
    });
}
