//! The record each running instance leaves in `<state_dir>/instances`, so a
//! restarted manager finds (adopts) the processes that outlived it.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{InstanceError, InstanceRequest};

/// One running process of an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    pub name: String,
    pub pid: u32,
    /// Field 22 of /proc/<pid>/stat: tells the process from a later one that
    /// got the same pid.
    pub start_time: u64,
    pub port: u16,
    pub request: InstanceRequest,
}

/// A record file and what it holds, or why it cannot be used.
pub(super) struct Found {
    pub path: PathBuf,
    pub record: Result<Record, InstanceError>,
}

/// The records directory.
#[derive(Clone, Debug)]
pub(super) struct Records {
    dir: PathBuf,
}

const SUFFIX: &str = ".json";
/// Prefix of files being written: never read as records.
const TEMP_PREFIX: &str = ".";

impl Records {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("instances"),
        }
    }

    pub fn create_dir(&self) -> Result<(), InstanceError> {
        fs::create_dir_all(&self.dir).map_err(|e| InstanceError::io("creating", &self.dir, e))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{SUFFIX}"))
    }

    /// Replaces the record atomically (temp file, then rename), so a crash
    /// leaves the old record or the new, never half of one. Not fsynced: a
    /// power loss kills the processes too, making any record stale anyway.
    pub fn write(&self, record: &Record) -> Result<(), InstanceError> {
        let path = self.path(&record.name);
        let temp = self
            .dir
            .join(format!("{TEMP_PREFIX}{}{SUFFIX}.tmp", record.name));
        let json = serde_json::to_vec_pretty(record).map_err(|source| InstanceError::Record {
            path: path.clone(),
            source,
        })?;
        // Owner-only: an engine's record holds its CHAP secrets.
        let written = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)
            .and_then(|mut file| file.write_all(&json));
        written.map_err(|e| InstanceError::io("writing", &temp, e))?;
        fs::rename(&temp, &path).map_err(|e| InstanceError::io("renaming", &temp, e))
    }

    /// Removes the record; nothing if there is none.
    pub fn remove(&self, name: &str) -> Result<(), InstanceError> {
        remove_file(&self.path(name))
    }

    /// Every record file, each with its record or why it is unusable. Left
    /// over temp files (a crash mid-write) are removed.
    pub fn load_all(&self) -> Result<Vec<Found>, InstanceError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(InstanceError::io("listing", &self.dir, e)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|e| InstanceError::io("listing", &self.dir, e))?
                .path();
            let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if file_name.starts_with(TEMP_PREFIX) {
                remove_file(&path)?;
            } else if let Some(name) = file_name.strip_suffix(SUFFIX) {
                let record = read(&path, name);
                found.push(Found { path, record });
            }
        }
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }
}

/// Reads the record at `path`, which must be about instance `name`.
fn read(path: &Path, name: &str) -> Result<Record, InstanceError> {
    let text = fs::read(path).map_err(|e| InstanceError::io("reading", path, e))?;
    let record: Record = serde_json::from_slice(&text).map_err(|source| InstanceError::Record {
        path: path.to_path_buf(),
        source,
    })?;
    // A record whose name is not its file name could never be removed by
    // name: refuse it like a corrupt one.
    record.request.validate()?;
    if record.name != name || record.request.name != name {
        return Err(InstanceError::InvalidName(format!(
            "{} holds a record for {:?}",
            path.display(),
            record.name
        )));
    }
    Ok(record)
}

pub(super) fn remove_file(path: &Path) -> Result<(), InstanceError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(InstanceError::io("removing", path, e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::InstanceKind;

    fn record(name: &str) -> Record {
        Record {
            name: name.into(),
            pid: 42,
            start_time: 7,
            port: 10000,
            request: InstanceRequest {
                name: name.into(),
                kind: InstanceKind::Replica {
                    volume: "vol".into(),
                    dir: "/data/r".into(),
                    size: 4096,
                },
            },
        }
    }

    #[test]
    fn an_engine_record_with_chap_secrets_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;

        use crate::engine::FrontendKind;
        use crate::frontend::iscsi::chap::{ChapSecrets, Credential};

        let dir = tempfile::tempdir().expect("tempdir");
        let records = Records::new(dir.path());
        records.create_dir().expect("create");
        let mut engine = record("e");
        engine.request.kind = InstanceKind::Engine {
            volume: "vol".into(),
            generation: 1,
            size: 4096,
            replicas: vec!["10.0.0.1:10000".into()],
            frontend: FrontendKind::Iscsi,
            salvage: false,
            chap: Some(ChapSecrets {
                initiator: Credential {
                    user: "node".into(),
                    secret: "initiator-secret".into(),
                },
                target: None,
            }),
        };
        records.write(&engine).expect("write");
        let path = records.path("e");
        let mode = fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let found = records.load_all().expect("load");
        assert_eq!(found[0].record.as_ref().expect("e"), &engine);
    }

    #[test]
    fn writes_loads_and_removes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = Records::new(dir.path());
        records.create_dir().expect("create");
        records.write(&record("a")).expect("write a");
        records.write(&record("b")).expect("write b");
        fs::write(dir.path().join("instances/.c.json.tmp"), "{").expect("temp");
        fs::write(dir.path().join("instances/d.json"), "{").expect("corrupt");
        fs::write(
            dir.path().join("instances/e.json"),
            serde_json::to_vec(&record("f")).expect("json"),
        )
        .expect("misnamed");

        let found = records.load_all().expect("load");
        let names: Vec<_> = found
            .iter()
            .map(|f| f.path.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, ["a.json", "b.json", "d.json", "e.json"]);
        assert_eq!(found[0].record.as_ref().expect("a"), &record("a"));
        assert!(found[2].record.is_err());
        assert!(found[3].record.is_err());
        assert!(!dir.path().join("instances/.c.json.tmp").exists());

        records.remove("a").expect("remove");
        records.remove("a").expect("remove again");
        assert!(!records.path("a").exists());
    }
}
