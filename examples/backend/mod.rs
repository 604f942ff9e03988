//! Command-line handling (clap) and backend selection shared by the examples that run on
//! either backend (a module of each, not an example of its own).
//!
//! `--backend sim|verbs` picks the backend (default `sim`); each needs its cargo feature.
//! For `verbs`: `--device NAME`, else `ZVERBS_DEVICE`, else the first device present; the
//! GID index from `ZVERBS_GID_INDEX`, else [`Verbs::select_gid`]'s default (the RoCE v2
//! IPv4-mapped entry).
#![allow(dead_code)]

use std::fmt;

/// The side of a client/server example ([`ClientServerArgs::role`]).
pub enum Role {
    /// Listens at this address.
    Server(std::net::SocketAddr),
    /// Asks the server at this address.
    Client(std::net::SocketAddr),
}

/// Runs example `name`: installs the `tracing` subscriber (feature `tracing`: to stderr,
/// filtered by `RUST_LOG`, warnings by default; a line per span as it closes), runs `run`, and gives the exit status:
/// success, or its error on stderr.
pub fn main(name: &str, run: impl FnOnce() -> Result<(), String>) -> std::process::ExitCode {
    #[cfg(feature = "tracing")]
    {
        use tracing_subscriber::{fmt::format::FmtSpan, EnvFilter};
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
        // A span's line when it closes, with the time it took: what set-up costs.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_span_events(FmtSpan::CLOSE)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .try_init();
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs both roles of a client/server example in one process (the simulator's two
/// devices): `server` on a thread of its own, `client` on this one; the client's outcome,
/// then the server's.
pub fn side_by_side(
    server: impl FnOnce() -> Result<(), String> + Send,
    client: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    std::thread::scope(|s| {
        let server = s.spawn(server);
        let client = client();
        let server = server.join();
        client.and(server.unwrap_or_else(|_| Err("the server panicked".into())))
    })
}

/// A client/server example (rping, udaddy): what it does on each backend. [`run`] reads
/// the command line ([`ClientServerArgs`]) and calls the one the backend names.
pub trait ClientServer {
    /// The example's name, for messages.
    const NAME: &'static str;
    /// What it does, for `--help`.
    const ABOUT: &'static str;
    /// The port it serves at.
    const PORT: u16;
    /// Both roles on the simulator's two devices ([`SimRoles`]), `count` exchanges.
    #[cfg(feature = "sim")]
    fn sim(roles: &SimRoles<'_>, count: usize) -> Result<(), String>;
    /// `role` on verbs device `device`, `count` exchanges.
    #[cfg(feature = "verbs")]
    fn verbs(device: &str, role: Role, count: usize) -> Result<(), String>;
}

/// Where a client/server example's two roles run on the simulator.
#[cfg(feature = "sim")]
pub struct SimRoles<'a> {
    /// The simulator, with two devices.
    pub sim: &'a zverbs::provider::sim::Sim,
    /// The server's address: 10.0.0.2 (on `sim1`), at [`ClientServer::PORT`].
    pub server: std::net::SocketAddr,
    /// The client's address: 10.0.0.1 (on `sim0`).
    pub from: std::net::IpAddr,
}

/// Runs client/server example `E` as the command line says; its exit status.
pub fn run<E: ClientServer>() -> std::process::ExitCode {
    let run = || {
        // `count` is unused in a build without a backend, which only says which feature
        // to enable.
        #[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_variables))]
        let ClientServerCli {
            common: args,
            count,
        } = parse_with(E::NAME, Some(E::ABOUT));
        match args.backend.backend {
            #[cfg(feature = "sim")]
            Backend::Sim => {
                let sim = zverbs::provider::sim::Sim::with_devices(2);
                let roles = SimRoles {
                    sim: &sim,
                    server: std::net::SocketAddr::new([10, 0, 0, 2].into(), E::PORT),
                    from: [10, 0, 0, 1].into(),
                };
                E::sim(&roles, count)
            }
            #[cfg(feature = "verbs")]
            Backend::Verbs => {
                let device = verbs::device(args.backend.device.as_deref())?;
                E::verbs(&device, args.role(E::PORT)?, count)
            }
            #[allow(unreachable_patterns)]
            other => Err(other.not_compiled_in(E::NAME)),
        }
    };
    main(E::NAME, run)
}

/// A backend the examples can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The in-process simulator (feature `sim`).
    Sim,
    /// libibverbs on a real or soft-RoCE device (feature `verbs`).
    Verbs,
}

impl Backend {
    /// The cargo feature the backend needs.
    pub fn feature(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Verbs => "verbs",
        }
    }

    /// Whether this build has the backend.
    pub fn compiled_in(self) -> bool {
        match self {
            Backend::Sim => cfg!(feature = "sim"),
            Backend::Verbs => cfg!(feature = "verbs"),
        }
    }

    /// The error for a backend this build does not have.
    pub fn not_compiled_in(self, example: &str) -> String {
        let f = self.feature();
        let other = [Backend::Sim, Backend::Verbs]
            .into_iter()
            .find(|b| b.compiled_in())
            .map_or(String::new(), |b| {
                format!(" (this build has `{b}`: pass --backend {b})")
            });
        format!(
            "backend `{f}` is not compiled into this build{other}; for `{f}`: \
             cargo run --release --features {f} --example {example} -- --backend {f}"
        )
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.feature())
    }
}

/// The options of every example that runs on either backend (flattened into each one's
/// command line).
#[derive(clap::Args, Debug)]
pub struct BackendArgs {
    /// Provider (each needs its cargo feature)
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Verbs device [default: ZVERBS_DEVICE, else the first one]
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
}

/// The options of a client/server example: the backend, and the side it plays on a
/// real device.
#[derive(clap::Args, Debug)]
pub struct ClientServerArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Verbs: serve at ADDR (the simulator plays both roles)
    #[arg(long, value_name = "ADDR", conflicts_with = "client")]
    pub server: Option<std::net::IpAddr>,
    /// Verbs: ask the server at ADDR
    #[arg(long, value_name = "ADDR")]
    pub client: Option<std::net::IpAddr>,
}

/// The command line of a client/server example run by [`run`] (its `about` is the
/// example's).
#[derive(clap::Parser, Debug)]
#[command(about = None)]
struct ClientServerCli {
    #[command(flatten)]
    common: ClientServerArgs,
    /// Exchanges
    #[arg(long, value_name = "N", default_value_t = 10)]
    count: usize,
}

impl ClientServerArgs {
    /// The side played on a real device, at `port`.
    pub fn role(&self, port: u16) -> Result<Role, String> {
        let at = |ip| std::net::SocketAddr::new(ip, port);
        match (self.server, self.client) {
            (Some(a), None) => Ok(Role::Server(at(a))),
            (None, Some(a)) => Ok(Role::Client(at(a))),
            _ => Err("give --server ADDR or --client ADDR".into()),
        }
    }
}

/// Parses the process arguments into `T`, naming the program `name` in `--help` and in
/// errors (clap prints a bad one with the usage and exits).
pub fn parse<T: clap::Parser>(name: &'static str) -> T {
    parse_with(name, None)
}

/// As [`parse`], with `about` for `--help` in place of `T`'s own.
fn parse_with<T: clap::Parser>(name: &'static str, about: Option<&'static str>) -> T {
    let mut command = T::command().name(name);
    if let Some(about) = about {
        command = command.about(about);
    }
    T::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

/// The verbs backend's device and GID choice.
#[cfg(feature = "verbs")]
pub mod verbs {
    use zverbs::provider::verbs::{GidSelect, Verbs};
    use zverbs::qp::QpConfig;
    use zverbs::Context;

    /// The device: `--device`, else `ZVERBS_DEVICE`, else the first device present.
    pub fn device(flag: Option<&str>) -> Result<String, String> {
        if let Some(d) = flag {
            return Ok(d.to_owned());
        }
        if let Some(d) = std::env::var("ZVERBS_DEVICE")
            .ok()
            .filter(|d| !d.is_empty())
        {
            return Ok(d);
        }
        Verbs::devices().into_iter().next().ok_or_else(|| {
            "no verbs device found (for soft-RoCE: `rdma link add rxe0 type rxe netdev \
             <if>`, or scripts/rxe-test.sh; see the README)"
                .to_owned()
        })
    }

    /// Queue pair settings for `ctx`: port 1 and the GID index from `ZVERBS_GID_INDEX`, else
    /// the RoCE v2 IPv4-mapped entry ([`Verbs::select_gid`]).
    pub fn qp_config(ctx: &Context<Verbs>) -> Result<QpConfig, String> {
        let how = match std::env::var("ZVERBS_GID_INDEX") {
            Ok(i) => GidSelect::Index(
                i.parse()
                    .map_err(|_| format!("bad ZVERBS_GID_INDEX {i:?}"))?,
            ),
            Err(_) => GidSelect::default(),
        };
        let port = QpConfig::default().port;
        let gid = Verbs::select_gid(ctx.raw(), port, how)
            .map_err(|e| format!("{}: GID selection: {e}", ctx.raw().name()))?;
        Ok(QpConfig {
            gid_index: gid.index,
            ..QpConfig::default()
        })
    }
}
