//! Temporary files (and empty temporary directories) that an interrupt
//! (SIGINT, SIGTERM, SIGHUP) removes before the process ends: a Ctrl-C
//! during `train --dump` must not leave a half-written `.FILE.*.tmp`
//! behind, nor `--record` its recordings' folder.
//!
//! The handler may run at any instruction, so it only reads fixed slots of
//! raw C strings and calls `unlink` and `rmdir` (async-signal-safe), then lets the
//! signal's default action end the process as it would have. A handler is
//! installed only where the signal's action is the default (`nohup` keeps
//! SIGHUP ignored).

use std::path::Path;

/// A temporary file registered for removal on interrupt while this lives.
pub struct Pending {
    #[cfg(unix)]
    slot: Option<usize>,
}

/// Registers `path`; dropping the result unregisters it.
pub fn register(path: &Path) -> Pending {
    imp::register(path)
}

#[cfg(unix)]
mod imp {
    use super::Pending;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::ptr::null_mut;
    use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::SeqCst};
    use std::sync::Once;

    /// More temporaries than vramlab ever writes at once; a write past them
    /// is still atomic, only not cleaned on interrupt.
    const SLOTS: usize = 16;
    static PENDING: [AtomicPtr<libc::c_char>; SLOTS] =
        [const { AtomicPtr::new(null_mut()) }; SLOTS];
    /// Set first thing by the handler: a path it may be reading is then
    /// never freed (see `Drop`).
    static HANDLING: AtomicBool = AtomicBool::new(false);
    static INSTALL: Once = Once::new();

    pub fn register(path: &Path) -> Pending {
        INSTALL.call_once(install);
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            return Pending { slot: None };
        };
        let ptr = c.into_raw();
        for (i, s) in PENDING.iter().enumerate() {
            if s.compare_exchange(null_mut(), ptr, SeqCst, SeqCst).is_ok() {
                return Pending { slot: Some(i) };
            }
        }
        // SAFETY: `ptr` came from `into_raw` just above and was not shared.
        drop(unsafe { CString::from_raw(ptr) });
        Pending { slot: None }
    }

    impl Drop for Pending {
        fn drop(&mut self) {
            let Some(i) = self.slot else { return };
            let ptr = PENDING[i].swap(null_mut(), SeqCst);
            // After the swap no handler can load `ptr`; one that loaded it
            // before set HANDLING first, and then the string is left alone.
            if !ptr.is_null() && !HANDLING.load(SeqCst) {
                // SAFETY: `ptr` came from `CString::into_raw` in `register`
                // and this slot held the only copy.
                drop(unsafe { CString::from_raw(ptr) });
            }
        }
    }

    extern "C" fn on_signal(sig: libc::c_int) {
        HANDLING.store(true, SeqCst);
        // Files first, then directories (a registered directory is empty
        // once the files registered in it are gone).
        for remove in [libc::unlink, libc::rmdir] {
            for s in &PENDING {
                let p = s.load(SeqCst);
                if !p.is_null() {
                    // SAFETY: a NUL-terminated string that is never freed
                    // once HANDLING is set; unlink and rmdir are
                    // async-signal-safe, and each fails harmlessly on the
                    // other kind of path.
                    unsafe { remove(p) };
                }
            }
        }
        // SA_RESETHAND made the action the default again: the re-raised
        // signal ends the process when this handler returns.
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(sig) };
    }

    fn install() {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: sigaction with a zeroed struct reads the current action
            // only; the new action's handler is an extern "C" fn that does
            // only async-signal-safe work.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction != libc::SIG_DFL
                {
                    continue;
                }
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                act.sa_flags = libc::SA_RESETHAND;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(sig, &act, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(not(unix))]
mod imp {
    use super::Pending;
    use std::path::Path;

    pub fn register(_path: &Path) -> Pending {
        Pending {}
    }
}
