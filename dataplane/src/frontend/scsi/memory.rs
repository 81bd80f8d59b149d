//! A volume in memory for the SCSI layer's tests, which can be made to fail.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

use crate::frontend::{BLOCK_SIZE, BlockDevice};

/// A volume in memory that can be made to fail, counting flushes.
pub struct Memory {
    pub data: Mutex<Vec<u8>>,
    pub failing: Mutex<Option<i32>>,
    pub flushes: AtomicUsize,
    pub touched: AtomicBool,
    /// While false, reads wait: how a test holds a command mid-way.
    pub reads_open: watch::Sender<bool>,
}

impl Memory {
    pub fn new(blocks: u64) -> Arc<Self> {
        Arc::new(Self {
            data: Mutex::new(vec![0; (blocks * BLOCK_SIZE) as usize]),
            failing: Mutex::new(None),
            flushes: AtomicUsize::new(0),
            touched: AtomicBool::new(false),
            reads_open: watch::Sender::new(true),
        })
    }

    fn outcome(&self) -> io::Result<()> {
        self.touched.store(true, Ordering::SeqCst);
        match *self.failing.lock().unwrap() {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}

impl BlockDevice for Memory {
    fn size(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }

    async fn read(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let _ = self.reads_open.subscribe().wait_for(|open| *open).await;
        self.outcome()?;
        let data = self.data.lock().unwrap();
        Ok(Bytes::copy_from_slice(
            &data[offset as usize..offset as usize + len],
        ))
    }

    async fn write(&self, offset: u64, bytes: Bytes) -> io::Result<()> {
        self.outcome()?;
        let mut data = self.data.lock().unwrap();
        data[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        self.outcome()?;
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.outcome()?;
        let mut data = self.data.lock().unwrap();
        data[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}
