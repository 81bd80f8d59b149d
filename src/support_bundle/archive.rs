//! The bundle's tar.gz, written on a blocking thread as the collection
//! hands it files: each is scrubbed (`redact.rs`) on its way in, so no
//! byte reaches the archive unscrubbed, `summary.txt` included. The
//! collection waits while the archive is behind (a bounded channel), and
//! stops once the archive can no longer be written (the file's disk is
//! full, the API's caller went away).

use std::io::Write;
use std::sync::Arc;

use flate2::Compression;
use flate2::write::GzEncoder;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::redact::Redactor;
use super::report::{Listed, Report};

/// Files waiting to be written.
const QUEUE: usize = 2;

enum Message {
    File {
        path: String,
        data: Vec<u8>,
        /// Redactions made already, in the objects (`redact_json`).
        redacted: usize,
    },
    /// The last: `summary.txt` from this report and the files' list.
    Finish(Report),
}

/// The archive can no longer be written; why is in [`Sink::finish`]'s
/// error.
#[derive(Debug)]
pub struct Stopped;

/// Where the collection hands its files.
pub struct Sink {
    sender: mpsc::Sender<Message>,
    writer: JoinHandle<std::io::Result<()>>,
}

impl Sink {
    /// An archive whose files are under `root/`, written to `out`.
    pub fn start<W>(out: W, root: String, redactor: Arc<Redactor>) -> Self
    where
        W: Write + Send + 'static,
    {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let writer = tokio::task::spawn_blocking(move || write(out, &root, &redactor, receiver));
        Self { sender, writer }
    }

    /// Adds the file `path` (under the bundle's root), `redacted` being
    /// how many redactions its content has had already.
    pub async fn file(
        &self,
        path: impl Into<String>,
        data: Vec<u8>,
        redacted: usize,
    ) -> Result<(), Stopped> {
        let path = path.into();
        let message = Message::File {
            path,
            data,
            redacted,
        };
        self.sender.send(message).await.map_err(|_| Stopped)
    }

    /// Writes `summary.txt` from `report` and closes the archive.
    pub async fn finish(self, report: Report) -> std::io::Result<()> {
        // A writer that stopped has its error to tell, below.
        let _ = self.sender.send(Message::Finish(report)).await;
        drop(self.sender);
        match self.writer.await {
            Ok(written) => written,
            Err(panicked) => Err(std::io::Error::other(panicked)),
        }
    }
}

/// The writer's loop: every file scrubbed, then tarred and compressed.
fn write<W: Write>(
    out: W,
    root: &str,
    redactor: &Redactor,
    mut receiver: mpsc::Receiver<Message>,
) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(GzEncoder::new(out, Compression::default()));
    let mtime = jiff::Timestamp::now().as_second().max(0).unsigned_abs();
    let mut listed = Vec::new();
    while let Some(message) = receiver.blocking_recv() {
        match message {
            Message::File {
                path,
                data,
                redacted,
            } => {
                let (data, scrubbed) = redactor.scrub(data);
                append(&mut tar, &format!("{root}/{path}"), &data, mtime)?;
                listed.push(Listed {
                    path,
                    bytes: data.len() as u64,
                    redactions: redacted + scrubbed,
                });
            }
            Message::Finish(report) => {
                let (summary, _) = redactor.scrub(report.render(&listed).into_bytes());
                append(&mut tar, &format!("{root}/summary.txt"), &summary, mtime)?;
                break;
            }
        }
    }
    tar.into_inner()?.finish()?.flush()
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    data: &[u8],
    mtime: u64,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, path, data)
}
