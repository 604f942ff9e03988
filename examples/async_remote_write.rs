//! The async-rdma README scenario on zverbs: the client asks the server for a remote
//! region, writes into it, and hands the token back; the server receives its own buffer and
//! checks the bytes. Set up over TCP on 127.0.0.1, both ends in this process.
//!
//! ```text
//! cargo run --features sim,tokio --example async_remote_write
//! cargo run --features verbs,tokio --example async_remote_write -- --backend verbs [--device NAME]
//! ```

mod backend;

use std::process::ExitCode;
use std::time::Duration;

// `Backend` names the arms of backends built in.
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_imports))]
use backend::{Backend, BackendArgs};

/// The async-rdma README scenario on zverbs: a server lends a registered region, the
/// client writes it remotely and hands it back.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    backend: BackendArgs,
}
use tokio::net::TcpListener;
use zverbs::provider::Provider;
use zverbs::tokio::Connection;
use zverbs::{AccessFlags, ChannelConfig};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_remote_write: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let args: Cli = backend::parse("async_remote_write");
    match args.backend.backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            let sim = zverbs::provider::sim::Sim::with_devices(2);
            scenario(&sim, "sim0", "sim1").await
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            let device = backend::verbs::device(args.backend.device.as_deref())?;
            scenario(&zverbs::provider::verbs::Verbs, &device, &device).await
        }
        #[allow(unreachable_patterns)]
        b => Err(b.not_compiled_in("async_remote_write")),
    }
}

/// The whole story: fifteen lines, as in async-rdma's README.
async fn scenario<P: Provider + Sync + 'static>(
    provider: &P,
    client_dev: &str,
    server_dev: &str,
) -> Result<(), String>
where
    P::Error: std::fmt::Debug,
{
    let cfg = ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        ..ChannelConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = async {
        let rdma = Connection::listen(provider, server_dev, &listener, 1 << 20, &cfg)
            .await
            .map_err(|e| e.to_string())?;
        // Wait for the client to write into our memory and hand it back.
        let lmr = rdma.receive_local().await.map_err(|e| format!("{e:?}"))?;
        if lmr[4..8] != [1, 1, 1, 1] {
            return Err(format!("server got {:?}", &lmr[..]));
        }
        println!("server: received {:?} in its own buffer", &lmr[..]);
        Ok::<_, String>(())
    };
    let client = async {
        let rdma = Connection::connect(provider, client_dev, addr, 1 << 20, &cfg)
            .await
            .map_err(|e| e.to_string())?;
        let rmr = rdma
            .request_remote(8, AccessFlags::REMOTE_WRITE)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let mut lmr = rdma.pool().alloc(4).map_err(|e| e.to_string())?;
        lmr.copy_from_slice(&[1; 4]);
        // Write the four bytes into the second half of the remote region.
        let half = rmr.region().slice(4..8).map_err(|e| e.to_string())?;
        rdma.channel()
            .write(lmr, &half)
            .await
            .0
            .map_err(|e| format!("{e:?}"))?;
        rdma.send_remote(rmr).await.map_err(|e| format!("{e:?}"))?;
        println!("client: wrote 4 bytes into the server's region and handed it back");
        Ok::<_, String>(())
    };
    let (s, c) = tokio::join!(
        async { server.await.map_err(|e| format!("server: {e}")) },
        async { client.await.map_err(|e| format!("client: {e}")) }
    );
    s.and(c)
}
