//! The same JSON text written the ways clients write it, for differential tests and the fuzz
//! target (`fuzz/fuzz_targets/validate_request.rs` includes this file): Python's
//! `json.dumps` defaults, `indent=2`, random whitespace around every structural character,
//! and `\u` escapes for every character of every string.
//!
//! It works on the text, not on a parsed value, so it keeps what a JSON library would not
//! (RapidJSON's `NaN`, invalid UTF-8, a byte-order mark, a syntax error) and changes only
//! what RFC 8259 says carries no meaning: whitespace between tokens, and how a string's
//! characters are spelled.

/// One way of writing JSON.
#[derive(Clone, Copy, Debug)]
pub enum Style {
    /// `json.dumps(obj)`: `", "` between items, `": "` after names.
    PythonDefault,
    /// `json.dumps(obj, indent=2)`: one item per line, two spaces per level.
    Indent2,
    /// Zero to three of space, tab, LF, CR before and after every structural character,
    /// drawn from a generator seeded with this value.
    RandomWhitespace(u64),
    /// Every character of every string (names too) as `\uXXXX` (a surrogate pair beyond
    /// the BMP); escapes already there and bytes that are not UTF-8 stay as they are.
    UnicodeEscapes,
}

/// Every style, with `seed` for the random one.
pub fn styles(seed: u64) -> [Style; 4] {
    [
        Style::PythonDefault,
        Style::Indent2,
        Style::RandomWhitespace(seed),
        Style::UnicodeEscapes,
    ]
}

/// `text` written in `style`.
pub fn reformat(text: &[u8], style: Style) -> Vec<u8> {
    let mut writer = Writer {
        out: Vec::with_capacity(text.len() * 2),
        style,
        depth: 0,
        rng: match style {
            Style::RandomWhitespace(seed) => seed | 1,
            _ => 1,
        },
    };
    let mut at = 0;
    while at < text.len() {
        let byte = text[at];
        if byte == b'"' {
            at = writer.string(text, at);
            continue;
        }
        if b"{}[],:".contains(&byte) {
            writer.structural(byte, next_significant(text, at + 1));
        } else {
            writer.out.push(byte);
        }
        at += 1;
    }
    writer.out
}

/// The first byte after `from` that is not whitespace.
fn next_significant(text: &[u8], from: usize) -> Option<u8> {
    text[from.min(text.len())..]
        .iter()
        .copied()
        .find(|b| !b" \t\n\r".contains(b))
}

struct Writer {
    out: Vec<u8>,
    style: Style,
    depth: usize,
    rng: u64,
}

impl Writer {
    fn structural(&mut self, byte: u8, next: Option<u8>) {
        match self.style {
            Style::PythonDefault => {
                self.out.push(byte);
                if byte == b',' || byte == b':' {
                    self.out.push(b' ');
                }
            }
            Style::Indent2 => self.indented(byte, next),
            Style::RandomWhitespace(_) => {
                self.whitespace();
                self.out.push(byte);
                self.whitespace();
            }
            Style::UnicodeEscapes => self.out.push(byte),
        }
    }

    /// `indent=2`: an empty container stays `[]` / `{}`, as Python writes it.
    fn indented(&mut self, byte: u8, next: Option<u8>) {
        match byte {
            b'{' | b'[' => {
                self.out.push(byte);
                let empty = matches!((byte, next), (b'{', Some(b'}')) | (b'[', Some(b']')));
                if !empty {
                    self.depth += 1;
                    self.newline();
                }
            }
            b'}' | b']' => {
                let empty = matches!(self.out.last(), Some(b'{' | b'['));
                if !empty {
                    self.depth = self.depth.saturating_sub(1);
                    self.newline();
                }
                self.out.push(byte);
            }
            b',' => {
                self.out.push(b',');
                self.newline();
            }
            _ => self.out.extend_from_slice(b": "),
        }
    }

    fn newline(&mut self) {
        self.out.push(b'\n');
        self.out.resize(self.out.len() + 2 * self.depth, b' ');
    }

    fn whitespace(&mut self) {
        const WHITESPACE: &[u8] = b" \t\n\r";
        let count = self.next_random() % 4;
        for _ in 0..count {
            let pick = (self.next_random() % 4) as usize;
            self.out.push(WHITESPACE[pick]);
        }
    }

    /// xorshift64*: small, and the same sequence for the same seed everywhere.
    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
    }

    /// Copies the string opening at `start` (escaping its characters in `UnicodeEscapes`)
    /// and returns where the text after it begins.
    fn string(&mut self, text: &[u8], start: usize) -> usize {
        let mut end = start + 1;
        while end < text.len() && text[end] != b'"' {
            end += if text[end] == b'\\' { 2 } else { 1 };
        }
        let end = end.min(text.len());
        let body = &text[start + 1..end];
        self.out.push(b'"');
        match self.style {
            Style::UnicodeEscapes => escape_characters(body, &mut self.out),
            _ => self.out.extend_from_slice(body),
        }
        if end < text.len() {
            self.out.push(b'"');
        }
        end + 1
    }
}

/// Writes `body` (a string's text between its quotes) with each character outside an
/// escape as `\uXXXX`.
fn escape_characters(body: &[u8], out: &mut Vec<u8>) {
    let mut at = 0;
    while at < body.len() {
        if body[at] == b'\\' {
            // An escape is kept as written: `\"`, `\n`, `\u00e9`...
            let length = if body.get(at + 1) == Some(&b'u') {
                6
            } else {
                2
            };
            let end = (at + length).min(body.len());
            out.extend_from_slice(&body[at..end]);
            at = end;
            continue;
        }
        let run_end = body[at..]
            .iter()
            .position(|&b| b == b'\\')
            .map_or(body.len(), |i| at + i);
        for chunk in body[at..run_end].utf8_chunks() {
            for c in chunk.valid().chars() {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.extend_from_slice(format!("\\u{unit:04x}").as_bytes());
                }
            }
            out.extend_from_slice(chunk.invalid());
        }
        at = run_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_as_python_does() {
        let text = br#"{"a":[1,2],"b":{},"c":[],"d":"x,:y"}"#;
        assert_eq!(
            String::from_utf8(reformat(text, Style::PythonDefault)).unwrap(),
            r#"{"a": [1, 2], "b": {}, "c": [], "d": "x,:y"}"#
        );
        assert_eq!(
            String::from_utf8(reformat(text, Style::Indent2)).unwrap(),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"d\": \"x,:y\"\n}"
        );
        let text = "{\"\\u00e9\\\"\":\"a\u{e9}\u{1f600}\"}";
        assert_eq!(text, r#"{"\u00e9\"":"aé😀"}"#);
        assert_eq!(
            String::from_utf8(reformat(text.as_bytes(), Style::UnicodeEscapes)).unwrap(),
            r#"{"\u00e9\"":"\u0061\u00e9\ud83d\ude00"}"#
        );
        // Bytes that are not UTF-8 stay as they are.
        assert_eq!(
            reformat(b"[\"a\xff\"]", Style::UnicodeEscapes),
            b"[\"\\u0061\xff\"]"
        );
    }
}
