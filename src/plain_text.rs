//! Plain text: printable ASCII other than `"` and `\`, the bytes every writer here keeps as
//! they are. A JSON string of them has no escapes (the validation readers take it as it is),
//! and Rust's `Debug` prints a `str` of them between quotes unchanged (the access log writes
//! such values straight, `log_text`). One rule for both, found eight bytes at a time: a
//! byte-by-byte loop made member names a quarter of the plain JSON reader's work on a small
//! request. (Digits stay byte by byte in the readers: their runs are short, and eight at a
//! time cost more, about 30 instructions a number: `benches/validate.rs` under callgrind.)
//!
//! Each class is a function that marks, in a little-endian word of eight bytes, the high
//! bit of every byte outside the class. The tricks below borrow or carry from a marked byte
//! into the bytes after it, never into those before, so the lowest mark is exact: all a run
//! needs.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = ONES * 0x80;

/// The end of the run of a class's bytes starting at `from` in `text`.
/// `marks` is the class's word test, `member` the same test for one byte (the tail).
#[inline(always)]
fn run_end(
    text: &[u8],
    mut from: usize,
    marks: impl Fn(u64) -> u64,
    member: impl Fn(u8) -> bool,
) -> usize {
    while let Some(word) = text.get(from..from + 8) {
        let marked = marks(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        if marked != 0 {
            return from + (marked.trailing_zeros() / 8) as usize;
        }
        from += 8;
    }
    while text.get(from).is_some_and(|&b| member(b)) {
        from += 1;
    }
    from
}

/// Marks bytes below `n` (`n` ≤ 0x80).
#[inline(always)]
fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS
}

/// Marks bytes above `n` (`n` < 0x80).
#[inline(always)]
fn above(word: u64, n: u8) -> u64 {
    (word.wrapping_add(ONES * u64::from(0x7f - n)) | word) & HIGHS
}

/// Marks bytes equal to `byte`.
#[inline(always)]
fn equal(word: u64, byte: u8) -> u64 {
    below(word ^ (ONES * u64::from(byte)), 1)
}

/// The end of the run of plain text in `text` from `from`.
pub(crate) fn end(text: &[u8], from: usize) -> usize {
    run_end(
        text,
        from,
        |w| below(w, 0x20) | above(w, 0x7e) | equal(w, b'"') | equal(w, b'\\'),
        plain_text_byte,
    )
}

/// Whether `text` is plain text throughout.
pub(crate) fn is_plain(text: &str) -> bool {
    end(text.as_bytes(), 0) == text.len()
}

/// Whether `byte` is plain text (`end`'s class, one byte at a time).
fn plain_text_byte(byte: u8) -> bool {
    (0x20..0x7f).contains(&byte) && byte != b'"' && byte != b'\\'
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value at every place of a word and of the tail, behind members of the
    /// class and in front of bytes a borrow or carry could disturb.
    fn agrees(end: fn(&[u8], usize) -> usize, member: fn(u8) -> bool, filler: u8) {
        for stop in 0..=255u8 {
            for after in [0u8, b'"', b'5', b'a', 0x7f, 0xff] {
                for at in 0..20 {
                    let mut text = vec![filler; at + 1];
                    text.extend([stop, after, filler, b'\\', 0x1f]);
                    let naive = text[1..]
                        .iter()
                        .position(|&b| !member(b))
                        .map_or(text.len(), |p| p + 1);
                    assert_eq!(end(&text, 1), naive, "{stop:#x} at {at}");
                }
            }
        }
        assert_eq!(end(&[filler; 3], 3), 3);
        assert_eq!(end(&[filler; 3], 0), 3);
    }

    #[test]
    fn a_plain_text_run_ends_at_the_first_byte_a_plain_string_does_not_hold() {
        agrees(end, plain_text_byte, b'x');
        assert!(is_plain("/v2/models/add_sub/infer") && is_plain(""));
        assert!(!is_plain("a\"b") && !is_plain("caf\u{e9}") && !is_plain("tab\there"));
        assert!(plain_text_byte(b' ') && plain_text_byte(b'~'));
        assert!(!plain_text_byte(0x7f) && !plain_text_byte(b'"') && !plain_text_byte(b'\\'));
    }
}
