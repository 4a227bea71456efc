//! The plugin's side of an `mps-supervisor` launch (see
//! [`super::supervisor`]): the request and result files and the wait for
//! the answer. Apart from the supervisor's loop, which runs a
//! [`super::host::LocalMps`], so that `LocalMps` can ask without the two
//! files importing each other.

use std::time::{Duration, Instant};

use gpu_dra_driver::bounded_file::{self, Links};

use super::error::Error;
use crate::state::checkpoint::MpsDaemon;
use crate::state::durable;

pub(super) const REQUEST: &str = "launch.request";
pub(super) const RESULT: &str = "launch.result";
/// The most of a request or result file read (a list of device UUIDs, or
/// an error message).
pub(super) const MESSAGE_MAX: u64 = 64 << 10;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Request {
    pub(super) visible: Vec<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Outcome {
    pub(super) error: Option<String>,
}

/// Asks the supervisor to launch `daemon` and waits (up to `within`) for
/// its answer.
pub fn request_launch(daemon: &MpsDaemon, within: Duration) -> Result<(), Error> {
    let _ = std::fs::remove_file(daemon.root.join(RESULT));
    let request = serde_json::to_vec(&Request { visible: daemon.visible.clone() }).map_err(Error::EncodeRequest)?;
    durable::write(&daemon.root, REQUEST, &request, 0o600)
        .map_err(|source| Error::WriteRequest { path: daemon.root.join(REQUEST), source })?;
    let deadline = Instant::now() + within;
    let result = daemon.root.join(RESULT);
    loop {
        if let Ok(bytes) = bounded_file::read(&result, MESSAGE_MAX, Links::Refuse) {
            let _ = std::fs::remove_file(&result);
            let outcome: Outcome =
                serde_json::from_slice(&bytes).map_err(|source| Error::ReadOutcome { path: result.clone(), source })?;
            return match outcome.error {
                None => Ok(()),
                Some(error) => Err(Error::SupervisorFailed(error)),
            };
        }
        if Instant::now() >= deadline {
            let _ = std::fs::remove_file(daemon.root.join(REQUEST));
            return Err(Error::NoSupervisor { within, root: daemon.root.clone() });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
