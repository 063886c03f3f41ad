//! The process's allocator: mimalloc, called the way its own fast path wants.
//!
//! A request makes some seventy small allocations. The `mimalloc` crate hands each to
//! `mi_malloc_aligned`, whose small-block path costs about 70 instructions per call here
//! (`loadtest/instructions.sh`): it finds the size class's page itself and checks the free
//! block's alignment. Every mimalloc block is a whole number of words from a page start
//! aligned to 16 bytes, so any block is aligned to a word: for an alignment of at most a
//! word, plain `mi_malloc` gives the same guarantee on its shorter path, as the standard
//! library's `System` does with `malloc`. Larger alignments keep the aligned calls.
//!
//! Built without transparent huge pages (`no_thp`), which would take idle RSS from 18 to
//! 31 MiB.

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// Whether any mimalloc block meets the layout's alignment (a word or less: every block is a
/// whole number of words from a 16-byte-aligned page start), so the plain calls serve it.
fn plain(layout: Layout) -> bool {
    layout.align() <= std::mem::size_of::<usize>()
}

/// mimalloc, with the unaligned entry points where the layout allows them.
pub struct Mimalloc;

// SAFETY: every call returns memory from mimalloc of at least `layout.size()` bytes, aligned
// to `layout.align()` (a word or less: any mimalloc block; more: mimalloc's aligned calls),
// and `mi_free` takes back a block from any of them.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if plain(layout) {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if plain(layout) {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            if plain(layout) {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_and_alignment_is_honoured_through_grow_and_free() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            let mut blocks = Vec::new();
            for size in (1..300).chain([1000, 4095, 4096, 65_536, 1 << 20]) {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: the layout's size is non-zero; each block is freed below with it.
                unsafe {
                    let fresh = Mimalloc.alloc(layout);
                    let zeroed = Mimalloc.alloc_zeroed(layout);
                    assert!(!fresh.is_null() && !zeroed.is_null());
                    assert_eq!(fresh as usize % align, 0, "{layout:?}");
                    assert_eq!(zeroed as usize % align, 0, "{layout:?}");
                    assert!(
                        std::slice::from_raw_parts(zeroed, size)
                            .iter()
                            .all(|&b| b == 0)
                    );
                    fresh.write_bytes(0xAB, size);
                    let grown = Mimalloc.realloc(fresh, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grown {layout:?}");
                    assert!(
                        std::slice::from_raw_parts(grown, size)
                            .iter()
                            .all(|&b| b == 0xAB)
                    );
                    blocks.push((grown, Layout::from_size_align(size * 3, align).unwrap()));
                    blocks.push((zeroed, layout));
                }
            }
            for (block, layout) in blocks {
                // SAFETY: allocated above with this layout, freed once.
                unsafe { Mimalloc.dealloc(block, layout) }
            }
        }
    }
}
