// A datagram channel posts datagrams only: an RDMA write on one must not compile.
use zverbs::provider::sim::Sim;
use zverbs::qp::{Ud, UdOptions};
use zverbs::{AccessFlags, Channel, ChannelConfig, Context, Op};

fn main() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let opts = UdOptions { qkey: 1, pkey_index: 0 };
    let cfg = ChannelConfig::default();
    let mut ch = Channel::<Sim, 4, 1, Ud>::datagram(&ctx, &pd, &cfg, &opts).unwrap();
    let mut buf = [0u8; 8];
    let mr = unsafe { pd.register_with_access(&mut buf, AccessFlags::all()) }.unwrap();
    let remote = mr.remote();
    ch.execute(Op::write([mr.slice(..).unwrap()], &remote)).unwrap();
}
