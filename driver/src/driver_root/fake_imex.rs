//! Fake `nvidia-imex` and `nvidia-imex-ctl` for a fake driver root (tests
//! and demos without an NVLink rack): shell programs that record what they
//! were given and answer like the real ones.
//!
//! - `nvidia-imex -c <cfg>` appends `start <cfg> <peers...>` to
//!   `<root>/imex.log` (the peers read from the config's
//!   `IMEX_NODE_CONFIG_FILE`), `reload <cfg> <peers...>` on SIGUSR1 (how
//!   the peer list is re-read), `stop <cfg>` on SIGTERM, and runs until
//!   stopped. While `<root>/imex.hang-start` exists it waits before
//!   serving (a window for a SIGKILL of the node agent); serving, it
//!   leaves `fake-imex.serving` beside its configuration.
//! - `nvidia-imex-ctl -c <cfg> -q` appends `query <cfg>` to
//!   `<root>/imex-ctl.log` and prints `READY` once that daemon serves,
//!   `NOT_READY` before, or while `<root>/imex.not-ready` exists.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const HEADER: &str = "#!/bin/sh\nroot=\"$(cd \"$(dirname \"$0\")/../..\" && pwd)\"\n";

const DAEMON: &str = r#"cfg="$2"
nodes=$(sed -n 's/^IMEX_NODE_CONFIG_FILE=//p' "$cfg")
peers() { tr '\n' ' ' < "$nodes" | sed 's/ $//'; }
echo "start $cfg $(peers)" >> "$root/imex.log"
while [ -e "$root/imex.hang-start" ]; do sleep 0.05; done
trap 'echo "reload $cfg $(peers)" >> "$root/imex.log"' USR1
trap 'echo "stop $cfg" >> "$root/imex.log"; exit 0' TERM
: > "$(dirname "$cfg")/fake-imex.serving"
while :; do sleep 0.1 & wait $!; done
"#;

const CTL: &str = r#"echo "query $2" >> "$root/imex-ctl.log"
if [ -e "$root/imex.not-ready" ] || [ ! -e "$(dirname "$2")/fake-imex.serving" ]; then echo NOT_READY; else echo READY; fi
"#;

/// Writes both programs into `<root>/usr/bin`.
pub fn install(root: &Path) -> io::Result<()> {
    let bin = root.join("usr/bin");
    std::fs::create_dir_all(&bin)?;
    for (name, body) in [("nvidia-imex", DAEMON), ("nvidia-imex-ctl", CTL)] {
        let path = bin.join(name);
        std::fs::write(&path, format!("{HEADER}{body}"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// The lines of `<root>/imex.log`: what each fake daemon was told.
pub fn daemon_log(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("imex.log")).unwrap_or_default().lines().map(str::to_owned).collect()
}
