//! One agent per instance: `/run/dispatcher/<instance>.lock`, locked (flock) for the
//! agent's whole life and naming its pid. A second `dispatcher run` for the instance is
//! refused; the CLI takes the same lock for the time it writes the maps itself, so it
//! never writes behind an agent and no agent starts in the middle of its writes.
//!
//! The file is never removed (a lock on a removed file would let a third process lock a
//! new one beside it); it is as small as a pid file.

use std::{
    fs::File,
    io::{Read, Seek, Write},
    path::PathBuf,
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};

/// Where the lock of `instance` lives.
pub fn lock_path(instance: &str) -> PathBuf {
    PathBuf::from(format!("/run/dispatcher/{instance}.lock"))
}

/// The mark of an operator's `dispatcher leave`, kept until `dispatcher join`: an agent
/// (re)started while it is there stays out of the group. Under /run: a reboot forgets it.
pub fn left_mark(instance: &str) -> PathBuf {
    PathBuf::from(format!("/run/dispatcher/{instance}.left"))
}

/// The lock, held until dropped.
pub struct InstanceLock {
    _lock: Flock<File>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("instance `{instance}` is held by pid {pid}: another agent (stop it first with `dispatcher stop`, or give this configuration another `dispatcher.instance`), or a dispatcher command writing its maps (try again)")]
    Held { instance: String, pid: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Takes the lock of `instance` for this process.
pub fn acquire(instance: &str) -> Result<InstanceLock, LockError> {
    let path = lock_path(instance);
    let io = |source: std::io::Error| LockError::Io { path: path.display().to_string(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut file =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    // A moment's grace: `holder` probes with a short shared lock of its own, and a CLI
    // command writes the maps under this lock for a moment.
    let mut tries = 0;
    let mut lock = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((f, Errno::EWOULDBLOCK)) if tries < 100 => {
                file = f;
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err((mut f, Errno::EWOULDBLOCK)) => {
                return Err(LockError::Held { instance: instance.to_string(), pid: read_pid(&mut f) })
            }
            Err((_, e)) => return Err(io(e.into())),
        }
    };
    lock.set_len(0).map_err(io)?;
    lock.rewind().map_err(io)?;
    writeln!(lock, "{}", std::process::id()).map_err(io)?;
    Ok(InstanceLock { _lock: lock })
}

/// The pid of the agent that holds `instance`, if one does (for messages; to act on it,
/// take the lock with `acquire`).
pub fn holder(instance: &str) -> Option<String> {
    let file = File::open(lock_path(instance)).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_) => None,
        Err((mut f, Errno::EWOULDBLOCK)) => Some(read_pid(&mut f)),
        Err(_) => None,
    }
}

fn read_pid(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    match s.trim() {
        "" => "unknown".into(),
        pid => pid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time() {
        let name = format!("unit-test-{}", std::process::id());
        assert_eq!(holder(&name), None);
        let lock = acquire(&name).unwrap();
        assert_eq!(holder(&name), Some(std::process::id().to_string()));
        // flock locks belong to the open file: a second open in this process conflicts too.
        assert!(matches!(acquire(&name), Err(LockError::Held { .. })));
        drop(lock);
        assert_eq!(holder(&name), None, "released with its holder");
        let again = acquire(&name).expect("free again");
        drop(again);
        let _ = std::fs::remove_file(lock_path(&name));
    }
}
