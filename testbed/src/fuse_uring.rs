//! The kernel's switch of FUSE over io_uring (`enable_uring`, global to the
//! machine), for tests that need it on or off: set while a guard lives and
//! put back as found when the last one goes, also on a panic. Tests that
//! need it on share it; a test that needs it off waits for them to finish.

use std::fs;
use std::path::Path;
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use oxhorn::frontend::ENABLE_URING;

/// On for the guards that share it, off for the one that holds it alone.
static SWITCH: RwLock<()> = RwLock::new(());
/// The guards sharing it on, and what the switch said before the first.
static SHARED: Mutex<Option<(usize, String)>> = Mutex::new(None);

/// Keeps FUSE over io_uring on.
pub struct On {
    _shared: RwLockReadGuard<'static, ()>,
}

/// Turns FUSE over io_uring on until the guard goes; `None`, with a line
/// saying the test is skipped, where the kernel has no such switch.
pub fn on() -> Option<On> {
    if !available() {
        return None;
    }
    let shared = SWITCH.read().unwrap_or_else(PoisonError::into_inner);
    let mut state = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    match &mut *state {
        Some((guards, _)) => *guards += 1,
        None => *state = Some((1, set("Y"))),
    }
    Some(On { _shared: shared })
}

impl Drop for On {
    fn drop(&mut self) {
        let mut state = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((guards, was)) = &mut *state {
            *guards -= 1;
            if *guards == 0 {
                set(was);
                *state = None;
            }
        }
    }
}

/// Keeps FUSE over io_uring off.
pub struct Off {
    _alone: RwLockWriteGuard<'static, ()>,
    was: String,
}

/// Turns FUSE over io_uring off until the guard goes; `None` (the test is
/// skipped, saying so) where the kernel has no such switch.
pub fn off() -> Option<Off> {
    if !available() {
        return None;
    }
    let alone = SWITCH.write().unwrap_or_else(PoisonError::into_inner);
    Some(Off {
        was: set("N"),
        _alone: alone,
    })
}

impl Drop for Off {
    fn drop(&mut self) {
        set(&self.was);
    }
}

fn available() -> bool {
    let there = Path::new(ENABLE_URING).exists();
    if !there {
        eprintln!("skipped: this kernel has no FUSE over io_uring ({ENABLE_URING} is missing)");
    }
    there
}

/// Sets the switch to `value`; returns what it was.
fn set(value: &str) -> String {
    let was = fs::read_to_string(ENABLE_URING)
        .unwrap_or_else(|e| panic!("reading {ENABLE_URING}: {e}"))
        .trim()
        .to_string();
    fs::write(ENABLE_URING, value).unwrap_or_else(|e| panic!("writing {ENABLE_URING}: {e}"));
    was
}
