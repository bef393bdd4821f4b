//! Independent replays on every core: results in the items' order, each
//! thread taking the next item when it is done (replays differ in length by
//! orders of magnitude, so fixed chunks would leave cores idle).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f` of each item, computed on up to `available_parallelism` threads, in
/// the items' order.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                out.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        // Every index below items.len() was taken by one thread, which
        // stored its result before taking another (a panic would have
        // ended the scope above with it).
        .map(|r| r.expect("each item computed"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::map;

    #[test]
    fn results_come_in_the_items_order() {
        let items: Vec<u64> = (0..257).collect();
        // Uneven work: later items finish first on other threads.
        let out = map(&items, |&i| {
            let mut x = 0u64;
            for k in 0..(257 - i) * 1000 {
                x = x.wrapping_add(k ^ i);
            }
            (i, x)
        });
        assert_eq!(out.len(), items.len());
        for (i, (j, _)) in out.iter().enumerate() {
            assert_eq!(i as u64, *j);
        }
        assert!(map(&[] as &[u8], |_| 0u8).is_empty());
    }
}
