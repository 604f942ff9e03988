// Device memory registered from a dmabuf is not the process's: its region lends no bytes to
// the host, only slices for work requests and a remote region for peers.
use zverbs::provider::sim::Sim;
use zverbs::{AccessFlags, Context};

fn main() {
    let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
    let gpu = ctx.raw().alloc_device_memory(64).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let lw = AccessFlags::LOCAL_WRITE;
    let mut region = pd.register_dmabuf(gpu.dmabuf_fd(), 0, 64, 0, lw).unwrap();
    let _bytes: &[u8] = region.as_slice();
    region.as_mut_slice()[0] = 1;
}
