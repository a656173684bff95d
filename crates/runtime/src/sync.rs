//! Locking without poisoning, for state that stays valid after every
//! statement.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, ignoring poisoning.
///
/// The guarded data is plain bookkeeping (counters, timestamps, maps of
/// them) that is valid after every single statement, so a panic elsewhere
/// cannot leave it broken.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
