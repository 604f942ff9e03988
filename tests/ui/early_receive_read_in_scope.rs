// A receive posted in INIT by connect_scope holds its buffer for the whole scope: reading
// the buffer inside the scope, while the device may still write it, must not compile.
use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context};

fn main() {
    let sim = Sim::with_devices(2);
    let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default()).unwrap();
    let b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default()).unwrap();
    let mut inbox = [0u8; 8];
    let mut inbox = pb.register(&mut inbox).unwrap();
    let _ = b.connect_scope(&a.endpoint(), [inbox.slice_mut(..).unwrap()], |_, _| {
        let _peek = inbox.as_slice()[0];
        Ok(())
    });
}
