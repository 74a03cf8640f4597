use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use waitroom::config::{Config, Env};

/// mimalloc as the allocator (the default feature). Built without it (`--no-default-features`),
/// the proxy uses the system's malloc, which heap profilers such as heaptrack can follow
/// (bench/heap-profile.sh).
#[cfg(feature = "mimalloc")]
mod allocator {
    #[global_allocator]
    static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

    /// `mi_option_arena_eager_commit` in mimalloc.h (v3, the version libmimalloc-sys builds); the
    /// sys crate has the setter but not this constant.
    const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

    /// mimalloc commits its arenas eagerly on Linux by default, and memory in an eagerly committed
    /// arena is never given back: with 10,000 idle keep-alive connections that measured 889-912 MB
    /// resident against 298 MB without (glibc: 320 MB). The option must be set before the first
    /// arena is reserved, i.e. before the first allocation, which happens before `main`: so this
    /// runs as an ELF constructor. An operator's own `MIMALLOC_ARENA_EAGER_COMMIT` wins.
    extern "C" fn lazy_arenas() {
        extern "C" {
            fn getenv(name: *const std::ffi::c_char) -> *mut std::ffi::c_char;
        }
        // SAFETY: a NUL-terminated name; getenv allocates nothing. mi_option_set is not thread safe,
        // and constructors run before any thread of ours exists.
        unsafe {
            if getenv(c"MIMALLOC_ARENA_EAGER_COMMIT".as_ptr()).is_null() {
                libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
            }
        }
    }

    #[used]
    #[link_section = ".init_array"]
    static LAZY_ARENAS: extern "C" fn() = lazy_arenas;
}

/// A waiting room in front of an order API: a fair, capped line in Redis.
#[derive(Parser)]
#[command(name = "waitroom", version)]
struct Cli {
    /// The configuration file.
    #[arg(long, value_name = "PATH", default_value = "proxy.yaml", global = true)]
    config: PathBuf,
    /// Validate the configuration and exit (needs no Redis).
    #[arg(long)]
    check: bool,
    /// With --check: check everything but what the environment holds (the secrets `*_env` keys
    /// name), so CI can validate a file without the production secrets.
    #[arg(long, requires = "check")]
    no_env: bool,
    /// Print the JSON Schema of the configuration file and exit (needs no configuration).
    #[arg(long)]
    print_schema: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Look at or steer the room through a running proxy's admin API (admin.listen, else
    /// metrics_listen, with the token from the variable admin.token_env names).
    Room {
        #[arg(value_enum)]
        action: RoomAction,
        /// The room, by its name in `rooms`; left out: the room `default`, or the only room.
        #[arg(long)]
        room: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum RoomAction {
    /// Show the room's state and numbers.
    Status,
    /// Stop admission; the line keeps accepting and waiting users keep their places.
    Pause,
    /// Undo pause.
    Resume,
    /// Close the line: nobody new gets in, waiting users lose their places; tokens stay valid.
    Close,
    /// Open a closed room with a new, empty line.
    Open,
}

impl From<RoomAction> for waitroom::cli::Action {
    fn from(action: RoomAction) -> Self {
        use waitroom::cli::Action;
        match action {
            RoomAction::Status => Action::Status,
            RoomAction::Pause => Action::Pause,
            RoomAction::Resume => Action::Resume,
            RoomAction::Close => Action::Close,
            RoomAction::Open => Action::Open,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_schema {
        print!("{}", waitroom::config::schema::text());
        return ExitCode::SUCCESS;
    }
    waitroom::logging::init();
    let env = if cli.no_env { Env::Skip } else { Env::Read };
    let config = match Config::load_with(&cli.config, env) {
        Ok(config) => config,
        Err(error) => {
            for problem in &error.problems {
                eprintln!("{problem}");
            }
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Room { action, room }) = cli.command {
        return match waitroom::cli::run(&config, &cli.config.display().to_string(), action.into(), room.as_deref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("waitroom room: {error}");
                ExitCode::from(1)
            }
        };
    }
    if cli.check {
        if cli.no_env {
            println!("{}: configuration is valid (secrets in the environment not checked)", cli.config.display());
        } else {
            println!("{}: configuration is valid", cli.config.display());
        }
        if let Some(event) = &config.event {
            println!("{}", event.describe());
        }
        return ExitCode::SUCCESS;
    }
    let code = match waitroom::server::run(config, cli.config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            waitroom::logging::flush();
            eprintln!("waitroom: {error}");
            ExitCode::from(1)
        }
    };
    waitroom::logging::flush();
    code
}
