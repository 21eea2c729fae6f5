//! `gaffer api`: the task service's role, and `gaffer api hash-token`.

use std::io::{IsTerminal, Read};
use std::net::SocketAddr;

use clap::{Args, Subcommand};

use crate::api::ApiOptions;
use crate::cli::{CliError, Global};

/// The name of the demo's admin key, as records show who submitted.
const UP_ADMIN: &str = "up-admin";

/// Arguments of `gaffer api`: alone it runs the server; a subcommand does something else.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ApiArgs {
    /// What to do instead of running the server
    #[command(subcommand)]
    pub command: Option<ApiCmd>,
    /// Address to listen on, overriding [api].listen
    #[arg(long, env = "GAFFER_API_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// SHA-256 of an extra admin token (`gaffer up` passes the demo's)
    #[arg(long, env = "GAFFER_API_ADMIN_SHA256", value_name = "HEX", hide = true)]
    pub admin_sha256: Option<String>,
}

/// `gaffer api …`.
#[derive(Subcommand)]
pub enum ApiCmd {
    /// Print the SHA-256 of a token read from stdin: the token_sha256 of an [api.keys.NAME]
    ///
    /// Surrounding white space (the newline of `echo`) is not part of the token. The token
    /// itself never goes into the config.
    HashToken,
}

/// `gaffer api`: runs an api instance until SIGTERM or Ctrl-C.
pub async fn serve(global: &Global, args: ApiArgs) -> Result<(), CliError> {
    let config = global.load()?;
    let (redis_url, connect) = global.redis_target(&config)?;
    let mut opts = ApiOptions::new(config, redis_url);
    opts.connect = connect;
    opts.listen = args.listen;
    opts.custom_handlers = global.registry.custom_names();
    if let Some(hex) = &args.admin_sha256 {
        let key =
            crate::api::admin_key(UP_ADMIN, hex).map_err(|e| CliError::Usage(e.to_string()))?;
        opts.extra_keys.push(key);
    }
    let shutdown = crate::signals::shutdown_on_term().map_err(|e| CliError::Runtime(e.into()))?;
    crate::api::run(opts, shutdown, None)
        .await
        .map_err(CliError::Runtime)
}

/// `gaffer api hash-token`: the token on stdin hashed as the config wants it; an empty
/// token is bad usage (exit 2).
pub fn hash_token() -> Result<(), CliError> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("gaffer: reading the token from stdin (end with Ctrl-D)");
    }
    let mut token = String::new();
    stdin
        .read_to_string(&mut token)
        .map_err(|e| CliError::Usage(format!("cannot read the token from stdin: {e}")))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(CliError::Usage(
            "no token on stdin (e.g. `echo \"$TOKEN\" | gaffer api hash-token`)".into(),
        ));
    }
    if token.contains(['\n', '\r']) {
        return Err(CliError::Usage(
            "stdin holds several lines; a token is one line".into(),
        ));
    }
    println!("{}", crate::api::hash_token(token));
    Ok(())
}
