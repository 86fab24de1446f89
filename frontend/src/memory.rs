//! Memory guard: wasm32 linear memory ends at 4 GiB, and an allocation past
//! it aborts the module (`unreachable`), losing everything in the tab. Each
//! big step (upcycle, route, graft, MoErge) first estimates the bytes it will
//! allocate and compares them with what the tab can still get; if they do
//! not fit, it answers with a message instead of crashing.
//!
//! What the tab can still get = the growth room (4 GiB minus the current
//! linear memory) plus the memory freed inside it (the allocator reuses it:
//! linear memory never shrinks), minus [`SPARE`] for fragmentation, the
//! step's temporaries and the page itself. In wasm the live bytes come from a
//! counting global allocator ([`Counting`]).

/// The wasm32 address space.
pub const ADDRESS_SPACE: u64 = 4 << 30;

/// Kept free on top of every estimate.
pub const SPARE: u64 = 256 << 20;

/// safetensors header bytes per tensor (name, dtype, shape, offsets in JSON),
/// generously.
const HEADER_PER_TENSOR: u64 = 256;

/// The tab's memory at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heap {
    /// Linear memory size (`memory.size * 64 KiB`).
    pub memory: u64,
    /// Bytes currently allocated by Rust.
    pub live: u64,
}

impl Heap {
    /// Bytes new allocations can still get, before [`SPARE`].
    pub fn left(&self) -> u64 {
        let growth = ADDRESS_SPACE.saturating_sub(self.memory);
        let freed = self.memory.saturating_sub(self.live);
        growth + freed
    }

    /// Whether `needed` more bytes fit with [`SPARE`] to spare.
    pub fn fits(&self, needed: u64) -> bool {
        needed.saturating_add(SPARE) <= self.left()
    }
}

/// Bytes a method producing tensors of `tensor_bytes` allocates: the tensors
/// (in the in-memory sink) and, at the end, the serialised
/// `model.safetensors` (a second copy, the download's bytes, kept as the
/// artifact while the sink is dropped).
pub fn output_need(tensor_bytes: impl IntoIterator<Item = u64>) -> u64 {
    let (n, sum) = tensor_bytes.into_iter().fold((0u64, 0u64), |(n, s), b| (n + 1, s + b));
    2 * sum + n * HEADER_PER_TENSOR + 4096
}

/// Bytes the ridge router allocates: first the f32 forward model of the MoE
/// (`params * 4`) and its statistics, freed before the routed checkpoint
/// (`output_need`) is written; the larger of the two phases.
pub fn route_need(moe_params: u64, stats_bytes: u64, output: u64) -> u64 {
    (moe_params.saturating_mul(4) + stats_bytes).max(output)
}

/// Ridge statistics: per MoE layer a `(d+1)^2` Gram matrix and a
/// `(d+1) x experts` right-hand side, in f64, twice (the solve copies them).
pub fn ridge_stats_bytes(moe_layers: u64, hidden: u64, experts: u64) -> u64 {
    let d = hidden + 1;
    2 * moe_layers * (d * d + d * experts) * 8
}

/// The message shown when a step does not fit.
pub fn refusal(what: &str, needed: u64, heap: Heap) -> String {
    format!(
        "{what} needs ~{} of memory, the tab has ~{} left (a browser tab's WebAssembly memory ends at 4 GiB): \
         remove models from the Load page or reload",
        gb(needed + SPARE),
        gb(heap.left())
    )
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

/// Checks `needed` against `heap`.
///
/// # Errors
/// [`refusal`]'s message when it does not fit.
pub fn check(what: &str, needed: u64, heap: Heap) -> Result<(), String> {
    if heap.fits(needed) {
        Ok(())
    } else {
        Err(refusal(what, needed, heap))
    }
}

/// The tab's memory now (native builds: an empty heap, so every check
/// passes; the limit is wasm32's).
pub fn heap() -> Heap {
    #[cfg(target_arch = "wasm32")]
    {
        use std::sync::atomic::Ordering;
        Heap { memory: core::arch::wasm32::memory_size(0) as u64 * 65536, live: LIVE.load(Ordering::Relaxed) as u64 }
    }
    #[cfg(not(target_arch = "wasm32"))]
    Heap { memory: 0, live: 0 }
}

/// Checks `needed` against the tab's memory now.
///
/// # Errors
/// [`refusal`]'s message when it does not fit.
pub fn ensure(what: &str, needed: u64) -> Result<(), String> {
    check(what, needed, heap())
}

/// One line for the Load page: `1.23 GB in use, 2.80 GB left`.
pub fn summary() -> String {
    let h = heap();
    format!("{} in use, ~{} left of 4 GiB", gb(h.live), gb(h.left()))
}

#[cfg(target_arch = "wasm32")]
static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The system allocator, counting live bytes (wasm32 only).
#[cfg(target_arch = "wasm32")]
pub struct Counting;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOC: Counting = Counting;

#[cfg(target_arch = "wasm32")]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::Ordering;

    use super::{Counting, LIVE};

    // SAFETY: every call forwards to `System` with the caller's arguments;
    // the counter only observes sizes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let p = unsafe { System.alloc(l) };
            if !p.is_null() {
                LIVE.fetch_add(l.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            let p = unsafe { System.alloc_zeroed(l) };
            if !p.is_null() {
                LIVE.fetch_add(l.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            unsafe { System.dealloc(p, l) };
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            let q = unsafe { System.realloc(p, l, new) };
            if !q.is_null() {
                LIVE.fetch_sub(l.size(), Ordering::Relaxed);
                LIVE.fetch_add(new, Ordering::Relaxed);
            }
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn left_counts_growth_room_and_freed_memory() {
        let h = Heap { memory: 3 * GB, live: 2 * GB };
        assert_eq!(h.left(), ADDRESS_SPACE - 3 * GB + GB);
        // Live above memory (cannot happen) or memory above 4 GiB saturate.
        assert_eq!(Heap { memory: 5 * GB, live: 6 * GB }.left(), 0);
    }

    #[test]
    fn the_spare_is_kept() {
        let h = Heap { memory: ADDRESS_SPACE - GB, live: ADDRESS_SPACE - GB };
        assert!(h.fits(GB - SPARE));
        assert!(!h.fits(GB - SPARE + 1));
    }

    #[test]
    fn outputs_count_the_sink_and_the_serialised_copy() {
        // SmolLM2-135M upcycled to 2 experts: ~0.86 GB of f32 tensors.
        let need = output_need([430 * 1_000_000u64, 430 * 1_000_000]);
        assert_eq!(need, 2 * 860_000_000 + 2 * 256 + 4096);
        assert_eq!(output_need(std::iter::empty()), 4096);
    }

    #[test]
    fn route_takes_the_larger_phase() {
        assert_eq!(route_need(100, 10, 300), 410);
        assert_eq!(route_need(100, 10, 500), 500);
        // 30 layers, d = 576, 2 experts: 2 * 30 * (577^2 + 577*2) * 8 (~160 MB).
        assert_eq!(ridge_stats_bytes(30, 576, 2), 2 * 30 * (577 * 577 + 577 * 2) * 8);
    }

    #[test]
    fn refusal_reads_in_gigabytes() {
        let h = Heap { memory: 4 * GB, live: 3_600_000_000 };
        let needed = 1_720_000_000;
        let e = check("the graft", needed, h).unwrap_err();
        assert!(e.starts_with("the graft needs ~1.99 GB of memory, the tab has ~0.69 GB left"), "{e}");
        assert!(e.contains("remove models from the Load page or reload"), "{e}");
        assert!(check("the graft", 1_000, Heap { memory: GB, live: GB }).is_ok());
    }
}
