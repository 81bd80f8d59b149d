//! FUSE over io_uring (kernel 6.14+, protocol 7.42): the kernel hands
//! requests to entries we registered on a ring and takes their answers back
//! through the same ring, with no read or write per request.
//!
//! The kernel keeps one queue per possible CPU and puts a request on the
//! queue of the CPU that issued it; it switches the connection to the rings
//! only once every queue has an entry, so we register [`DEPTH`] entries on
//! every queue, each queue served by a thread of its own. An entry is a
//! header area and a payload buffer of ours, which the kernel fills with a
//! request; we answer in the same buffers and commit, which also makes the
//! entry available for the next request (`COMMIT_AND_FETCH`).
//!
//! Only a queue's thread submits to its ring: the kernel copies a request
//! into our buffers as work of the task that submitted the entry, and
//! cancels the entries of a task that exits. A request answered on another
//! thread (data, on the runtime) is queued to its queue's thread, which is
//! woken through an eventfd only if it sleeps.

use std::cell::UnsafeCell;
use std::fs;
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd};
use std::panic::{self, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use io_uring::types::{Fixed, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};
use nix::errno::Errno;
use nix::libc;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::mman::{MapFlags, ProtFlags};
use tracing::{Span, debug, error, warn};
use zerocopy::{FromBytes, IntoBytes};

use super::fuse_abi::OutHeader;
use super::fuse_abi::uring::{self, CmdReq, EntInOut};
use super::fuse_dev::DevFuse;
use super::fuse_proto::{self, Frame};
use super::fuse_reply::Sink;
use super::fuse_session::{self, Handler};

/// Entries per queue: requests a CPU can have in flight before the kernel
/// queues them. The loop device keeps up to 128 in flight over all CPUs.
const DEPTH: u16 = 16;
/// An entry's header area: the kernel's 288 bytes, on a page of their own.
const HEADER_AREA: usize = 4096;
/// How long a stopping queue waits for the kernel to end its entries.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What a completion is for: the high half of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Register = 1,
    Commit = 2,
    Wake = 3,
}

impl Op {
    fn user_data(self, slot: u16) -> u64 {
        (self as u64) << 32 | u64::from(slot)
    }

    fn of(user_data: u64) -> Option<(Op, u16)> {
        let op = match user_data >> 32 {
            1 => Op::Register,
            2 => Op::Commit,
            3 => Op::Wake,
            _ => return None,
        };
        Some((op, user_data as u16))
    }
}

/// The queues the kernel expects: one per possible CPU, whether online or
/// not (it refuses to use the rings until each has an entry).
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let list = fs::read_to_string("/sys/devices/system/cpu/possible")?;
    count_cpus(&list).ok_or_else(|| io::Error::other(format!("unreadable CPU list {list:?}")))
}

/// The number of CPUs in a kernel CPU list such as `0-3,8`.
fn count_cpus(list: &str) -> Option<usize> {
    list.trim().split(',').try_fold(0, |count, part| {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last) = (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?);
        Some(count + last.checked_sub(first)? + 1)
    })
}

/// Anonymous memory shared with the kernel, reserved but only backed where
/// touched: most requests use a page of their megabyte.
#[derive(Debug)]
struct Buffers {
    base: NonNull<u8>,
    len: NonZeroUsize,
}

impl Buffers {
    fn new(len: usize) -> io::Result<Self> {
        let len = NonZeroUsize::new(len).ok_or_else(|| io::Error::other("empty ring buffers"))?;
        // SAFETY: a new private anonymous mapping aliases nothing.
        let base = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }?;
        Ok(Buffers {
            base: base.cast(),
            len,
        })
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing refers to it any more: the
        // queue owning it is gone, and with it every reply and the ring.
        if let Err(err) = unsafe { nix::sys::mman::munmap(self.base.cast(), self.len.get()) } {
            warn!(%err, "cannot unmap FUSE ring buffers");
        }
    }
}

/// One queue's entries and what its thread shares with those answering.
///
/// An entry's buffers belong to one party at a time, which alone touches
/// them: the kernel from the command that hands it the entry until that
/// command completes; then the queue's thread, until it hands the request
/// to the handler with a [`Reply`]; the reply, until [`Queue::answer`]
/// queues the entry; then the thread, which commits it to the kernel.
#[derive(Debug)]
pub(crate) struct Queue {
    qid: u16,
    buffers: Buffers,
    payload_size: usize,
    /// Entries answered and waiting to be committed by the thread.
    answered: Mutex<Vec<u16>>,
    /// The thread sleeps in the kernel and needs [`Queue::wake`] to see
    /// new answers.
    parked: AtomicBool,
    wake: EventFd,
    /// Requests that arrived on this queue.
    served: AtomicU64,
    /// The registering iovecs of each entry, read by the kernel when it
    /// takes a REGISTER.
    iovecs: Box<[[libc::iovec; 2]]>,
    /// Where the eventfd's count is read to: here rather than in the
    /// thread, because a read still armed when the thread ends its ring may
    /// complete after (the queue outlives the thread).
    wake_buf: UnsafeCell<[u8; 8]>,
}

// SAFETY: the raw buffers are shared under the ownership protocol above;
// everything else is Sync by itself.
unsafe impl Send for Queue {}
// SAFETY: as for Send.
unsafe impl Sync for Queue {}

impl Queue {
    fn new(qid: u16, payload_size: usize) -> io::Result<Self> {
        let buffers = Buffers::new(usize::from(DEPTH) * (HEADER_AREA + payload_size))?;
        let mut queue = Queue {
            qid,
            buffers,
            payload_size,
            answered: Mutex::new(Vec::with_capacity(usize::from(DEPTH))),
            parked: AtomicBool::new(false),
            wake: EventFd::from_flags(EfdFlags::EFD_CLOEXEC)?,
            served: AtomicU64::new(0),
            iovecs: Box::new([]),
            wake_buf: UnsafeCell::new([0; 8]),
        };
        queue.iovecs = (0..DEPTH).map(|slot| queue.entry_iovecs(slot)).collect();
        Ok(queue)
    }

    fn entry(&self, slot: u16) -> (*mut u8, *mut u8) {
        assert!(slot < DEPTH, "entry {slot} of {DEPTH}");
        let offset = usize::from(slot) * (HEADER_AREA + self.payload_size);
        // SAFETY: within the mapping, which holds DEPTH entries.
        let headers = unsafe { self.buffers.base.as_ptr().add(offset) };
        // SAFETY: as above.
        (headers, unsafe { headers.add(HEADER_AREA) })
    }

    /// The iovecs that register an entry: its header area and its payload.
    fn entry_iovecs(&self, slot: u16) -> [libc::iovec; 2] {
        let (headers, payload) = self.entry(slot);
        [
            libc::iovec {
                iov_base: headers.cast(),
                iov_len: uring::REQ_HEADER_SIZE,
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: self.payload_size,
            },
        ]
    }

    /// The request in entry `slot`: its header area and payload buffer.
    ///
    /// # Safety
    /// The caller owns the entry (see [`Queue`]) for as long as it holds
    /// the slices.
    unsafe fn request(&self, slot: u16) -> (&[u8], &[u8]) {
        let (headers, payload) = self.entry(slot);
        // SAFETY: the caller owns the entry; the kernel wrote it before the
        // completion that gave it to us.
        unsafe {
            (
                std::slice::from_raw_parts(headers, uring::REQ_HEADER_SIZE),
                std::slice::from_raw_parts(payload, self.payload_size),
            )
        }
    }

    /// Answers the request in entry `slot` and hands the entry to the
    /// thread to commit. A body larger than the payload buffer (the kernel
    /// never asks for one) is answered EIO.
    ///
    /// # Safety
    /// The caller owns the entry: it is the [`Sink::Uring`] the queue's
    /// thread made for it, answering once.
    pub(crate) unsafe fn answer(
        &self,
        slot: u16,
        header: &OutHeader,
        body: &[u8],
    ) -> Result<(), Errno> {
        let fits = body.len() <= self.payload_size;
        let (header, body) = if fits {
            (*header, body)
        } else {
            (fuse_proto::out_header(header.unique, libc::EIO, 0), &[][..])
        };
        let ent = EntInOut {
            payload_sz: body.len() as u32,
            ..EntInOut::default()
        };
        let (headers, payload) = self.entry(slot);
        // SAFETY: the caller owns the entry until it is queued below, and
        // the copies stay within its header area and payload buffer.
        unsafe {
            let write = |at: usize, bytes: &[u8]| {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), headers.add(at), bytes.len());
            };
            write(uring::IN_OUT, header.as_bytes());
            write(uring::ENT_IN_OUT, ent.as_bytes());
            std::ptr::copy_nonoverlapping(body.as_ptr(), payload, body.len());
        }
        lock(&self.answered).push(slot);
        if self.parked.swap(false, Ordering::SeqCst)
            && let Err(err) = self.wake.write(1)
        {
            warn!(qid = self.qid, %err, "cannot wake a FUSE ring thread");
        }
        if fits { Ok(()) } else { Err(Errno::EOVERFLOW) }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The rings, built before the INIT reply offers them to the kernel.
pub(crate) struct Rings {
    queues: Vec<(IoUring<squeue::Entry128, cqueue::Entry>, Arc<Queue>)>,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rings")
            .field("queues", &self.queues.len())
            .finish()
    }
}

impl Rings {
    /// A ring per possible CPU, each with `dev` as its fixed file 0 and
    /// buffers for [`DEPTH`] requests of up to `payload_size` bytes.
    pub(crate) fn build(dev: &DevFuse, payload_size: usize) -> io::Result<Self> {
        let page = HEADER_AREA;
        let payload_size = payload_size.div_ceil(page) * page;
        let mut queues = Vec::new();
        for qid in 0..possible_cpus()? {
            let qid = u16::try_from(qid).map_err(io::Error::other)?;
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .setup_cqsize(4 * u32::from(DEPTH))
                .setup_submit_all()
                .build(2 * u32::from(DEPTH))?;
            ring.submitter()
                .register_files(&[dev.as_fd().as_raw_fd()])?;
            queues.push((ring, Arc::new(Queue::new(qid, payload_size)?)));
        }
        Ok(Rings { queues })
    }

    /// Registers the entries and serves the requests that arrive on them
    /// with `handler`, a thread per queue, inside `span`. Call after the
    /// INIT reply that accepted the rings.
    pub(crate) fn start<H: Handler>(self, handler: Arc<H>, span: Span) -> io::Result<Running> {
        let stopping = Arc::new(AtomicBool::new(false));
        let (ready, registered) = mpsc::channel();
        let mut threads = Vec::new();
        let mut queues = Vec::new();
        for (ring, queue) in self.queues {
            queues.push(queue.clone());
            let worker = Worker {
                ring,
                queue,
                handler: handler.clone(),
                stopping: stopping.clone(),
                live: 0,
                scratch: Vec::new(),
            };
            let (span, ready) = (span.clone(), ready.clone());
            threads.push(
                thread::Builder::new()
                    .name(format!("fuse-ring-{}", worker.queue.qid))
                    .spawn(move || span.in_scope(|| worker.run(ready)))?,
            );
        }
        // Every queue must have its entries before the kernel uses any.
        for _ in 0..threads.len() {
            registered
                .recv()
                .map_err(|_| io::Error::other("a FUSE ring thread ended before registering"))??;
        }
        Ok(Running {
            threads,
            queues,
            stopping,
        })
    }
}

/// The rings' threads.
#[derive(Debug)]
pub(crate) struct Running {
    threads: Vec<JoinHandle<io::Result<()>>>,
    queues: Vec<Arc<Queue>>,
    stopping: Arc<AtomicBool>,
}

impl Running {
    /// The requests that arrived through the rings so far.
    pub(crate) fn served(&self) -> u64 {
        self.queues
            .iter()
            .map(|queue| queue.served.load(Ordering::Relaxed))
            .sum()
    }

    /// Waits for the threads once the connection has ended: the kernel ends
    /// every entry then, and a thread whose entries it has not ended within
    /// [`STOP_GRACE`] gives them up.
    pub(crate) fn join(self) -> io::Result<()> {
        self.stopping.store(true, Ordering::SeqCst);
        for queue in &self.queues {
            // A spurious wake-up is harmless; a thread that sleeps on
            // entries the kernel already ended would otherwise sleep on.
            if let Err(err) = queue.wake.write(1) {
                warn!(qid = queue.qid, %err, "cannot wake a FUSE ring thread");
            }
        }
        fuse_session::join_all(self.threads, "a FUSE ring thread panicked")
    }
}

/// A queue's thread: the only one to submit to its ring.
struct Worker<H> {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    queue: Arc<Queue>,
    handler: Arc<H>,
    stopping: Arc<AtomicBool>,
    /// Entries the kernel has not ended.
    live: usize,
    /// Where a request is copied to be parsed: the kernel shares the
    /// entry's buffers, and the reply writes them while the request may
    /// still be borrowed.
    scratch: Vec<u8>,
}

impl<H: Handler> Worker<H> {
    /// Registers the entries, says so through `ready`, then serves them.
    fn run(mut self, ready: mpsc::Sender<io::Result<()>>) -> io::Result<()> {
        let registered = self.register();
        let failed = registered.is_err();
        // The receiver waits for every queue: it is still there.
        let _ = ready.send(registered);
        if failed {
            return Ok(());
        }
        let served = self.serve();
        if let Err(err) = &served {
            error!(qid = self.queue.qid, %err, "FUSE ring thread failed: requests from its CPU go unanswered");
        }
        served
    }

    fn register(&mut self) -> io::Result<()> {
        for slot in 0..DEPTH {
            self.push(self.command(Op::Register, slot, 0))?;
        }
        self.live = usize::from(DEPTH);
        self.arm_wake()?;
        self.submit()
    }

    fn serve(&mut self) -> io::Result<()> {
        let mut stop_deadline = None;
        let mut completions = Vec::new();
        loop {
            self.commit_answered()?;
            if self.live == 0 {
                break;
            }
            let deadline = match stop_deadline {
                None if self.stopping.load(Ordering::SeqCst) => {
                    *stop_deadline.insert(Instant::now() + STOP_GRACE)
                }
                None => {
                    self.wait(None)?;
                    self.take_completions(&mut completions);
                    self.complete(&mut completions)?;
                    continue;
                }
                Some(deadline) => deadline,
            };
            if Instant::now() >= deadline {
                warn!(
                    qid = self.queue.qid,
                    entries = self.live,
                    "FUSE ring entries not ended by the kernel; giving them up"
                );
                break;
            }
            self.wait(Some(Duration::from_millis(100)))?;
            self.take_completions(&mut completions);
            self.complete(&mut completions)?;
        }
        debug!(qid = self.queue.qid, "FUSE ring thread done");
        Ok(())
    }

    /// A command on entry `slot`: REGISTER hands the kernel its buffers,
    /// COMMIT_AND_FETCH the answer to request `commit_id`.
    fn command(&self, op: Op, slot: u16, commit_id: u64) -> squeue::Entry128 {
        let (cmd_op, iovecs) = match op {
            Op::Register => (
                uring::CMD_REGISTER,
                Some(&self.queue.iovecs[usize::from(slot)]),
            ),
            _ => (uring::CMD_COMMIT_AND_FETCH, None),
        };
        let request = CmdReq {
            commit_id,
            qid: self.queue.qid,
            ..CmdReq::default()
        };
        let mut cmd = [0; 80];
        cmd[..size_of::<CmdReq>()].copy_from_slice(request.as_bytes());
        let mut entry = opcode::UringCmd80::new(Fixed(0), cmd_op).cmd(cmd);
        if let Some(iovecs) = iovecs {
            entry = entry.addr(Some(iovecs.as_ptr() as u64));
        }
        let entry = entry.build().user_data(op.user_data(slot));
        match iovecs {
            Some(iovecs) => with_len(entry, iovecs.len() as u32),
            None => entry,
        }
    }

    fn push(&mut self, entry: squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: what the entry points to (the iovecs, the wake buffer,
            // the entry's buffers) belongs to the queue, which outlives the
            // ring.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.submit()?;
        }
    }

    /// Submits what is queued, retrying while the kernel is short of
    /// memory or busy: the thread must not end while the connection lives,
    /// or its CPU's requests would wait forever.
    fn submit(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(err) if transient(&err) => thread::sleep(Duration::from_millis(1)),
                Err(err) => return Err(err),
            }
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let fd = io_uring::types::Fd(self.queue.wake.as_fd().as_raw_fd());
        let read = opcode::Read::new(fd, self.queue.wake_buf.get().cast(), 8)
            .build()
            .user_data(Op::Wake.user_data(0));
        self.push(read.into())
    }

    /// Commits the entries answered since the last look.
    fn commit_answered(&mut self) -> io::Result<()> {
        let answered = std::mem::take(&mut *lock(&self.queue.answered));
        for slot in answered {
            // SAFETY: answered entries are the thread's again.
            let (headers, _) = unsafe { self.queue.request(slot) };
            let unique = OutHeader::read_from_prefix(headers).map_or(0, |(h, _)| h.unique);
            self.push(self.command(Op::Commit, slot, unique))?;
        }
        Ok(())
    }

    /// Submits what is queued and sleeps until a completion arrives (or
    /// `timeout` passes), unless an answer arrived meanwhile.
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.queue.parked.store(true, Ordering::SeqCst);
        if !lock(&self.queue.answered).is_empty() {
            self.queue.parked.store(false, Ordering::SeqCst);
            return self.submit();
        }
        let waited = match timeout {
            None => self.ring.submit_and_wait(1),
            Some(timeout) => {
                let timespec = Timespec::from(timeout);
                let args = SubmitArgs::new().timespec(&timespec);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        self.queue.parked.store(false, Ordering::SeqCst);
        match waited {
            Err(err) if err.raw_os_error() == Some(libc::ETIME) => Ok(()),
            Err(err) if transient(&err) => {
                thread::sleep(Duration::from_millis(1));
                Ok(())
            }
            other => other.map(drop),
        }
    }

    fn take_completions(&mut self, into: &mut Vec<(u64, i32)>) {
        into.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
    }

    fn complete(&mut self, completions: &mut Vec<(u64, i32)>) -> io::Result<()> {
        for (user_data, result) in completions.drain(..) {
            match Op::of(user_data) {
                Some((Op::Wake, _)) => self.arm_wake()?,
                Some((Op::Register | Op::Commit, slot)) if result == 0 => self.dispatch(slot),
                Some((op, slot)) => self.failed(op, slot, Errno::from_raw(-result))?,
                None => warn!(user_data, "unknown FUSE ring completion"),
            }
        }
        Ok(())
    }

    /// A request arrived in entry `slot`: copied out, parsed and handed to
    /// the handler with the reply that owns the entry from then on.
    fn dispatch(&mut self, slot: u16) {
        let filled = self.copy_out(slot);
        let (headers, payload) = self.scratch.split_at(uring::REQ_HEADER_SIZE);
        let parsed = Frame::split_uring(headers, &payload[..filled]).and_then(|frame| {
            let request = fuse_proto::parse(&frame)?;
            Ok((frame.header, request))
        });
        self.queue.served.fetch_add(1, Ordering::Relaxed);
        let sink = Sink::Uring {
            queue: self.queue.clone(),
            slot,
        };
        // A handler that panics drops the reply, which answers EIO; the
        // thread must live on, or its CPU's requests would wait forever. A
        // DESTROY needs no care: the kernel ends every entry after it.
        let handler = &*self.handler;
        let dispatched = panic::catch_unwind(AssertUnwindSafe(|| {
            fuse_session::dispatch(handler, parsed, headers, sink)
        }));
        if dispatched.is_err() {
            error!(qid = self.queue.qid, slot, "FUSE request handler panicked");
        }
    }

    /// Copies entry `slot`'s header area and filled payload into the
    /// scratch buffer; returns the payload's length.
    fn copy_out(&mut self, slot: u16) -> usize {
        let size = uring::REQ_HEADER_SIZE + self.queue.payload_size;
        if self.scratch.len() < size {
            self.scratch.resize(size, 0);
        }
        // SAFETY: the completion handed the entry to this thread, and the
        // slices end here, before the reply that may write it exists.
        let (headers, payload) = unsafe { self.queue.request(slot) };
        let (ent, _) =
            EntInOut::read_from_prefix(&headers[uring::ENT_IN_OUT..]).unwrap_or_default();
        // More than the buffer holds is refused by the parser as truncated.
        let filled = (ent.payload_sz as usize).min(payload.len());
        let (to_headers, to_payload) = self.scratch.split_at_mut(uring::REQ_HEADER_SIZE);
        to_headers.copy_from_slice(headers);
        to_payload[..filled].copy_from_slice(&payload[..filled]);
        filled
    }

    /// Entry `slot`'s command failed with `errno`.
    fn failed(&mut self, op: Op, slot: u16, errno: Errno) -> io::Result<()> {
        match (op, errno) {
            // The connection is being torn down (or its ring was never set
            // up): the entry ends.
            (_, Errno::ENOTCONN | Errno::ECONNABORTED | Errno::ECANCELED) => {
                self.live -= 1;
                Ok(())
            }
            // Registered before the kernel finished INIT, or the kernel was
            // short of memory: again.
            (Op::Register, Errno::EAGAIN | Errno::ENOMEM) => {
                self.push(self.command(Op::Register, slot, 0))
            }
            (Op::Register, errno) => {
                // The kernel falls back to /dev/fuse for the requests the
                // rings would have served.
                warn!(qid = self.queue.qid, slot, %errno, "FUSE ring entry refused");
                self.live -= 1;
                Ok(())
            }
            // The kernel did not take the answer and kept the entry: it is
            // lost unless registered again.
            (_, errno) => {
                warn!(qid = self.queue.qid, slot, %errno, "FUSE answer refused; registering the entry again");
                self.push(self.command(Op::Register, slot, 0))
            }
        }
    }
}

/// An error of `io_uring_enter` that passes: interrupted, or the kernel
/// short of memory or of completion space for a moment.
fn transient(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ENOMEM)
    )
}

/// Sets a command's `len` (the number of iovecs a REGISTER passes), which
/// `UringCmd80` has no setter for.
fn with_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)`: the 64-byte `io_uring_sqe`, whose
    // `len` is the u32 at byte 24, then 64 bytes of command. Any bytes make
    // a valid entry (the size equality is checked by transmute).
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpus("0\n"), Some(1));
        assert_eq!(count_cpus("0-1\n"), Some(2));
        assert_eq!(count_cpus("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpus(""), None);
        assert_eq!(count_cpus("3-1"), None);
        assert!(possible_cpus().unwrap() >= 1);
    }

    #[test]
    fn a_register_command_is_laid_out_as_the_kernel_reads_it() {
        let request = CmdReq {
            commit_id: 0x0102_0304_0506_0708,
            qid: 3,
            ..CmdReq::default()
        };
        let mut cmd = [0; 80];
        cmd[..24].copy_from_slice(request.as_bytes());
        let entry = opcode::UringCmd80::new(Fixed(0), uring::CMD_REGISTER)
            .cmd(cmd)
            .addr(Some(0xdead_beef))
            .build()
            .user_data(Op::Register.user_data(5));
        let entry = with_len(entry, 2);
        // SAFETY: as in with_len.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
        let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(bytes[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(bytes[1] & 1, 1, "IOSQE_FIXED_FILE");
        assert_eq!(u32_at(4), 0, "fixed file 0");
        assert_eq!(u32_at(8), uring::CMD_REGISTER, "cmd_op");
        assert_eq!(u64_at(16), 0xdead_beef, "addr");
        assert_eq!(u32_at(24), 2, "len");
        assert_eq!(Op::of(u64_at(32)), Some((Op::Register, 5)), "user_data");
        assert_eq!(&bytes[48..72], request.as_bytes(), "fuse_uring_cmd_req");
    }

    #[test]
    fn an_answer_fills_the_entry_and_queues_it() {
        let queue = Queue::new(0, 8192).unwrap();
        let header = fuse_proto::out_header(77, 0, 5);
        queue.parked.store(true, Ordering::SeqCst);
        // SAFETY: nothing else uses the entry.
        unsafe { queue.answer(3, &header, b"hello") }.unwrap();
        // SAFETY: nothing else uses the entry.
        let (headers, payload) = unsafe { queue.request(3) };
        let (out, _) = OutHeader::read_from_prefix(headers).unwrap();
        assert_eq!((out.len, out.error, out.unique), (21, 0, 77));
        let (ent, _) = EntInOut::read_from_prefix(&headers[uring::ENT_IN_OUT..]).unwrap();
        assert_eq!(ent.payload_sz, 5);
        assert_eq!(&payload[..5], b"hello");
        assert_eq!(*lock(&queue.answered), [3]);
        assert_eq!(queue.wake.read().unwrap(), 1, "a parked thread is woken");

        let too_big = vec![0; 8193];
        let header = fuse_proto::out_header(78, 0, too_big.len());
        // SAFETY: as above.
        let answered = unsafe { queue.answer(4, &header, &too_big) };
        assert_eq!(answered, Err(Errno::EOVERFLOW));
        // SAFETY: as above.
        let (headers, _) = unsafe { queue.request(4) };
        let (out, _) = OutHeader::read_from_prefix(headers).unwrap();
        assert_eq!((out.error, out.unique), (-libc::EIO, 78));
    }
}
