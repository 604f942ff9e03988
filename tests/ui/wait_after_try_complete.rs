// Work that `try_complete` reported finished cannot be waited for again: `try_complete`
// consumes the handle (a second wait would find nothing, time out and kill the queue pair).
use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context};

fn main() {
    let sim = Sim::with_devices(2);
    let (ca, cb) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default()).unwrap();
    let b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default()).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (mut a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let pending = unsafe { a.post_receive_unpolled(&[]) }.unwrap();
    if let Ok(Ok(_done)) = a.try_complete(pending) {
        let _again = a.wait(pending);
    }
}
