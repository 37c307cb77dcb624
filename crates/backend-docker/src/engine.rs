//! The Docker engine connection: find its socket, connect with bollard, negotiate the API
//! version, and say plainly (exit 3, with a fix) when there is no engine here.

use std::path::PathBuf;
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, Docker};

use iblab_backend::{EnvError, EnvKind};

/// The oldest Engine API iblab is tested against (Debian 12's docker.io 20.10).
pub const MIN_API: (u32, u32) = (1, 41);

/// How long one Engine API request may take (image imports stream hundreds of MB).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// What to do when there is no engine.
pub const FIX: &str = "install and start a Docker engine: `apt-get install docker.io`, then \
`systemctl start docker` or `sudo .ci/dockerd-start` (no registry needed), or point \
DOCKER_HOST at a running engine's unix socket";

/// A connected engine and what it said about itself.
#[derive(Clone)]
pub struct Engine {
    pub docker: Docker,
    pub socket: PathBuf,
    pub version: String,
    pub api: String,
}

/// The unix socket iblab talks to: `DOCKER_HOST` when it names one, else Docker's default.
pub fn socket_path() -> PathBuf {
    iblab_sys::host::docker_socket()
}

/// No engine answers at `socket` (kind [`EnvKind::Unreachable`]), for the reason `why`.
fn no_engine(socket: &std::path::Path, why: impl std::fmt::Display) -> EnvError {
    EnvError::of(
        EnvKind::Unreachable,
        format!(
            "no Docker engine here ({}: {why})\n  fix: {FIX}",
            socket.display()
        ),
    )
}

/// No engine answers at `socket`, as the client said.
fn no_engine_because(socket: &std::path::Path, e: bollard::errors::Error) -> EnvError {
    no_engine(socket, &e).because(e)
}

/// Connect, negotiate the API version down to the engine's, and check it is new enough.
pub async fn connect() -> Result<Engine, EnvError> {
    let socket = socket_path();
    if let Ok(h) = std::env::var("DOCKER_HOST")
        && !h.is_empty()
        && !h.starts_with("unix://")
    {
        return Err(EnvError::new(format!(
            "DOCKER_HOST={h} is not a unix socket: the docker backend joins containers with \
             veth pairs from this host, so the engine must run here\n  fix: unset DOCKER_HOST \
             or set it to unix:///path/to/docker.sock"
        )));
    }
    let docker = if std::env::var_os("DOCKER_HOST").is_some() {
        Docker::connect_with_unix(
            &socket.to_string_lossy(),
            REQUEST_TIMEOUT.as_secs(),
            API_DEFAULT_VERSION,
        )
    } else {
        Docker::connect_with_local_defaults()
    }
    .map_err(|e| no_engine_because(&socket, e))?
    .with_timeout(REQUEST_TIMEOUT);
    let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
        .await
        .map_err(|_| {
            no_engine(
                &socket,
                "the socket exists but the engine did not answer in 10 s",
            )
        })?
        .map_err(|e| no_engine_because(&socket, e))?;
    let v = docker
        .version()
        .await
        .map_err(|e| no_engine_because(&socket, e))?;
    let api = v.api_version.unwrap_or_default();
    if parse_api(&api).is_some_and(|a| a < MIN_API) {
        return Err(EnvError::new(format!(
            "the Docker engine at {} speaks API {api}; iblab needs {}.{} or newer (Docker 20.10+)\n  fix: upgrade the engine",
            socket.display(),
            MIN_API.0,
            MIN_API.1
        )));
    }
    Ok(Engine {
        docker,
        socket,
        version: v.version.unwrap_or_default(),
        api,
    })
}

/// `1.41` → (1, 41).
pub fn parse_api(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

pub use iblab_sys::runtime::blocking;

/// Is this bollard error the engine saying "no such container/image"?
pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_compare() {
        assert_eq!(parse_api("1.41"), Some((1, 41)));
        assert!(parse_api("1.41").unwrap() >= MIN_API);
        assert!(parse_api("1.40").unwrap() < MIN_API);
        assert_eq!(parse_api("x"), None);
    }
}
