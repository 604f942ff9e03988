//! RDMA writes into GPU memory, checked on the GPU (feature `cuda`).
//!
//! ```sh
//! cargo run --release --features cuda,sim --example gpu_write [-- --mib 1024]
//! ZVERBS_DEVICE=mlx5_0 cargo run --release --features cuda,verbs --example gpu_write
//! ```
//!
//! - **Simulator** (feature `sim`): device `sim1`'s device memory is put on GPU 0 (CUDA
//!   managed memory, `Context::alloc_gpu_memory`) and registered as a dmabuf; `sim0`
//!   writes `--mib` MiB into it (1 GiB by default) in 1 MiB RDMA writes, each stamped with
//!   its index; then every byte is read back on the GPU's side with the copy engine
//!   (`cuMemcpyDtoH`) and checked. Prints the write rate.
//! - **Verbs** (feature `verbs`, a device named by `--device` or `ZVERBS_DEVICE` that
//!   imports dmabufs): GPU memory allocated with `cuMemAlloc`, exported as a dmabuf
//!   (`zverbs::cuda::GpuBuffer`), registered, and written the same way by a loopback
//!   channel on that device.
//!
//! - **Export**: 2 MiB allocated with `cuMemAlloc` and exported as a dmabuf descriptor,
//!   alone (what a NIC would import).
//!
//! A part that cannot run here (no `cuda` feature, no GPU or driver, no device that
//! imports dmabufs) prints `SKIPPED: <reason>`. Exits 0 unless a check fails.

mod backend;

use std::process::ExitCode;

fn main() -> ExitCode {
    backend::main("gpu_write", run)
}

#[cfg(not(feature = "cuda"))]
fn run() -> Result<(), String> {
    println!(
        "SKIPPED: built without the cuda feature (cargo run --release --features cuda,sim \
         --example gpu_write)"
    );
    Ok(())
}

/// RDMA writes into GPU memory: on the simulator, through a dmabuf export, and on a
/// verbs device.
#[cfg(feature = "cuda")]
#[derive(clap::Parser)]
struct Cli {
    /// MiB to write
    #[arg(long, value_name = "MIB", default_value_t = 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    mib: usize,
    /// Verbs device [default: ZVERBS_DEVICE, else the first one]
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
}

#[cfg(feature = "cuda")]
fn run() -> Result<(), String> {
    let args: Cli = backend::parse("gpu_write");
    let mib = args.mib;
    sim_part(mib)?;
    export_part()?;
    verbs_part(&args, mib)
}

/// The dmabuf export of a CUDA allocation alone (what a NIC would import).
#[cfg(feature = "cuda")]
fn export_part() -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let gpu = match zverbs::cuda::GpuBuffer::alloc(0, 2 << 20) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("SKIPPED: dmabuf export: no GPU memory ({e})");
            return Ok(());
        }
    };
    let fd = gpu
        .export_dmabuf()
        .map_err(|e| format!("dmabuf export: {e}"))?;
    let at = gpu.device_ptr();
    println!(
        "dmabuf export: 2 MiB of GPU 0 at {at:#x} is dmabuf descriptor {}",
        fd.as_raw_fd()
    );
    Ok(())
}

/// Bytes per write.
#[cfg(feature = "cuda")]
const CHUNK: usize = 1 << 20;

/// What chunk `i` holds: a pattern, its first 8 bytes the index.
#[cfg(feature = "cuda")]
fn fill(chunk: &mut [u8], i: usize) {
    for (j, b) in chunk.iter_mut().enumerate() {
        *b = (j % 251) as u8;
    }
    chunk[..8].copy_from_slice(&(i as u64).to_le_bytes());
}

/// Writes chunks `0..mib` (as [`fill`] makes them) to `remote` over `ch`, one RDMA write
/// each, from one registered chunk of `pd`; how long the writes took.
#[cfg(feature = "cuda")]
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(dead_code))]
fn write_chunks<P: zverbs::provider::Provider>(
    ch: &mut zverbs::Channel<P, 16, 1>,
    pd: &zverbs::ProtectionDomain<P>,
    remote: &zverbs::RemoteRegion,
    mib: usize,
) -> Result<std::time::Duration, String> {
    let mut src = vec![0u8; CHUNK];
    fill(&mut src, 0);
    let mut mr = pd.register(&mut src).map_err(|e| e.to_string())?;
    let start = std::time::Instant::now();
    for i in 0..mib {
        mr.as_mut_slice()[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let to = remote
            .slice((i * CHUNK) as u64..)
            .map_err(|e| e.to_string())?;
        let piece = mr.slice(..).map_err(|e| e.to_string())?;
        ch.write([piece], &to).map_err(|e| e.to_string())?;
    }
    Ok(start.elapsed())
}

/// Reads `mib` chunks back with `read(offset, out)` and checks each.
#[cfg(feature = "cuda")]
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(dead_code))]
fn check(
    mib: usize,
    mut read: impl FnMut(usize, &mut [u8]) -> Result<(), String>,
) -> Result<(), String> {
    let (mut want, mut got) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    for i in 0..mib {
        fill(&mut want, i);
        read(i * CHUNK, &mut got)?;
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("chunk {i}: byte {at} differs on the GPU"));
        }
    }
    Ok(())
}

#[cfg(all(feature = "cuda", feature = "sim"))]
fn sim_part(mib: usize) -> Result<(), String> {
    use zverbs::testing::Pair;
    use zverbs::{AccessFlags, ChannelConfig};

    let mut p = Pair::<16, 1>::connected(&ChannelConfig::default()).map_err(|e| e.to_string())?;
    let len = mib * CHUNK;
    let gpu = match p.b.ctx.raw().alloc_gpu_memory(0, len) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("SKIPPED: simulator on a GPU: no GPU 0 with {len} bytes free ({e})");
            return Ok(());
        }
    };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let region =
        p.b.pd
            .register_dmabuf(gpu.dmabuf_fd(), 0, len, 0x1_0000_0000, access);
    let remote = region.map_err(|e| e.to_string())?.remote();
    let took = write_chunks(&mut p.a.ch, &p.a.pd, &remote, mib)?;
    let ptr = gpu.gpu_ptr().ok_or("the device memory is not on the GPU")?;
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| format!("{e:?}"))?;
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
    check(mib, |off, out| {
        // SAFETY: `off..off + out.len()` lies inside the live allocation `ptr` names.
        let r = unsafe { cudarc::driver::result::memcpy_dtoh_sync(out, ptr + off as u64) };
        r.map_err(|e| format!("cuMemcpyDtoH: {e:?}"))
    })?;
    let gbps = len as f64 / took.as_secs_f64() / 1e9;
    println!("sim: {mib} MiB written into GPU memory in {took:?} ({gbps:.2} GB/s), every byte checked on the GPU");
    Ok(())
}

#[cfg(all(feature = "cuda", not(feature = "sim")))]
fn sim_part(_mib: usize) -> Result<(), String> {
    println!("SKIPPED: simulator on a GPU: built without the sim feature");
    Ok(())
}

#[cfg(all(feature = "cuda", feature = "verbs"))]
fn verbs_part(args: &Cli, mib: usize) -> Result<(), String> {
    use zverbs::cuda::GpuBuffer;
    use zverbs::provider::verbs::Verbs;
    use zverbs::{AccessFlags, Channel, ChannelConfig, Context};

    let device = match backend::verbs::device(args.device.as_deref()) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIPPED: verbs: {e}");
            return Ok(());
        }
    };
    let ctx = Context::open(&Verbs, &device).map_err(|e| e.to_string())?;
    if !ctx.query_device().map_err(|e| e.to_string())?.dmabuf {
        println!("SKIPPED: verbs: {device} registers no dmabufs");
        return Ok(());
    }
    let len = mib * CHUNK;
    let gpu = match GpuBuffer::alloc(0, len) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("SKIPPED: verbs: no GPU memory ({e})");
            return Ok(());
        }
    };
    let fd = gpu
        .export_dmabuf()
        .map_err(|e| format!("dmabuf export: {e}"))?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let region = pd.register_dmabuf_owned(fd, 0, len, gpu.device_ptr(), access);
    let remote = region.map_err(|e| e.to_string())?.remote();
    let cfg = ChannelConfig {
        qp: backend::verbs::qp_config(&ctx)?,
        ..ChannelConfig::default()
    };
    let a = Channel::<Verbs, 16, 1>::prepare(&ctx, &pd, &cfg).map_err(|e| e.to_string())?;
    let b = Channel::<Verbs, 16, 1>::prepare(&ctx, &pd, &cfg).map_err(|e| e.to_string())?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(|e| e.to_string())?;
    let _b = b.connect(&ea).map_err(|e| e.to_string())?;
    let took = write_chunks(&mut a, &pd, &remote, mib)?;
    check(mib, |off, out| {
        gpu.copy_out(off, out).map_err(|e| e.to_string())
    })?;
    let gbps = len as f64 / took.as_secs_f64() / 1e9;
    println!("verbs ({device}): {mib} MiB written into GPU memory in {took:?} ({gbps:.2} GB/s), every byte checked on the GPU");
    Ok(())
}

#[cfg(all(feature = "cuda", not(feature = "verbs")))]
fn verbs_part(_args: &Cli, _mib: usize) -> Result<(), String> {
    println!("SKIPPED: verbs: built without the verbs feature");
    Ok(())
}
