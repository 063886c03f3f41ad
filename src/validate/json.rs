//! A JSON reader for inference request headers that accepts exactly the JSON Triton accepts.
//!
//! Triton reads request JSON with RapidJSON 1.1 (`kParseNanAndInfFlag`), which differs from
//! strict JSON (and from serde_json) in ways a gateway must follow, or it would refuse
//! requests Triton serves: `NaN`, `Inf`, `Infinity` and `-Infinity` are numbers; strings may
//! hold invalid UTF-8 and lone low surrogates (`\udc00`); a leading byte-order mark is
//! skipped; a NUL byte after the document ends it. Errors carry RapidJSON's own message and
//! byte offset, so `failed to parse the request JSON buffer: Invalid value. at 12` reads the
//! same from the gateway as from Triton.
//!
//! It is also built for size: only the parts of a request that validation looks at are kept
//! (names, datatypes, shapes, parameters); an input's `data` array is never built, only
//! summarized (element count, and the first element that does not fit each datatype), and
//! members nobody reads are checked for syntax and dropped. Nested values are walked with an
//! explicit stack, so no depth of nesting can overflow the gateway's stack.

use std::borrow::Cow;
use std::sync::OnceLock;

/// A string as RapidJSON decodes it: bytes, not necessarily UTF-8.
pub type Str<'a> = Cow<'a, [u8]>;

/// A syntax error: RapidJSON's message and the byte offset it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    /// `GetParseError_En` text, e.g. `Invalid value.`.
    pub message: &'static str,
    /// Offset from the start of the JSON text (a byte-order mark included).
    pub offset: usize,
}

const DOCUMENT_EMPTY: &str = "The document is empty.";
const ROOT_NOT_SINGULAR: &str = "The document root must not be followed by other values.";
const VALUE_INVALID: &str = "Invalid value.";
const OBJECT_MISS_NAME: &str = "Missing a name for object member.";
const OBJECT_MISS_COLON: &str = "Missing a colon after a name of object member.";
const OBJECT_MISS_COMMA: &str = "Missing a comma or '}' after an object member.";
const ARRAY_MISS_COMMA: &str = "Missing a comma or ']' after an array element.";
const HEX_INVALID: &str = "Incorrect hex digit after \\u escape in string.";
const SURROGATE_INVALID: &str = "The surrogate pair in string is invalid.";
const ESCAPE_INVALID: &str = "Invalid escape character in string.";
const MISS_QUOTATION_MARK: &str = "Missing a closing quotation mark in string.";
const NUMBER_TOO_BIG: &str = "Number too big to be stored in double.";
const NUMBER_MISS_FRACTION: &str = "Miss fraction part in number.";
const NUMBER_MISS_EXPONENT: &str = "Miss exponent in number.";

/// A JSON number with RapidJSON's distinction: integers (from -2^63 to 2^64-1, written
/// without fraction or exponent) versus doubles (everything else, NaN and infinities too).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    Int(i128),
    Double(f64),
}

impl Number {
    /// `IsUint64`: a non-negative integer.
    pub fn as_u64(self) -> Option<u64> {
        match self {
            Self::Int(i) => u64::try_from(i).ok(),
            Self::Double(_) => None,
        }
    }

    /// `IsInt64`: an integer within the signed range.
    pub fn is_i64(self) -> bool {
        matches!(self, Self::Int(i) if i64::try_from(i).is_ok())
    }
}

/// What kind of value something was (for values not kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// Triton's checks on one element of `data`, as each datatype reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementCheck {
    /// `AsBool`: BOOL.
    Bool,
    /// `AsUInt`: UINT8..UINT64 (any non-negative integer; Triton does not range-check).
    Uint,
    /// `AsInt`: INT8..INT64 (any integer from -2^63 to 2^63-1).
    Int,
    /// `AsDouble`: FP32, FP64 (any number).
    Double,
    /// `AsString`: BYTES.
    String,
}

const CHECKS: usize = 5;

impl ElementCheck {
    fn index(self) -> usize {
        self as usize
    }

    fn bit(self) -> u8 {
        1 << self.index()
    }
}

/// An element of `data`, as far as the checks tell elements apart.
#[derive(Clone, Copy)]
pub(super) enum Leaf {
    Bool,
    String,
    /// A number; `uint`: `IsUint64`, `int`: `IsInt64`.
    Number {
        uint: bool,
        int: bool,
    },
    Other,
}

impl Leaf {
    fn number(n: Number) -> Self {
        Self::Number {
            uint: n.as_u64().is_some(),
            int: n.is_i64(),
        }
    }

    /// A bit per `ElementCheck` that accepts this element.
    fn accepted_by(self) -> u8 {
        match self {
            Self::Bool => ElementCheck::Bool.bit(),
            Self::String => ElementCheck::String.bit(),
            Self::Number { uint, int } => {
                ElementCheck::Double.bit()
                    | if uint { ElementCheck::Uint.bit() } else { 0 }
                    | if int { ElementCheck::Int.bit() } else { 0 }
            }
            Self::Other => 0,
        }
    }
}

/// An input's `data`, summarized while reading instead of built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSummary {
    /// The value's kind: Triton wants an array.
    pub kind: Kind,
    /// Leaves: non-array values at any depth of nested arrays (Triton flattens any nesting,
    /// whatever the shape).
    pub elements: u64,
    /// For each `ElementCheck`, the index of the first element it refuses.
    first_refused: [Option<u64>; CHECKS],
    /// Bit per `ElementCheck` that has refused nothing yet.
    unrefused: u8,
    /// Sum over string elements of their decoded length plus 4 (BYTES serialization).
    pub string_bytes: u64,
}

impl DataSummary {
    /// The index of the first element `check` refuses, if any.
    pub fn first_refused(&self, check: ElementCheck) -> Option<u64> {
        self.first_refused[check.index()]
    }

    /// A summary of nothing yet, of a value of `kind`.
    pub(super) fn new(kind: Kind) -> Self {
        Self {
            kind,
            elements: 0,
            first_refused: [None; CHECKS],
            unrefused: (1 << CHECKS) - 1,
            string_bytes: 0,
        }
    }

    /// A string element of decoded `length`: BYTES serializes it behind 4 bytes of length.
    pub(super) fn add_string(&mut self, length: u64) {
        self.add(Leaf::String);
        self.string_bytes = self.string_bytes.saturating_add(length + 4);
    }

    /// One more element.
    pub(super) fn add(&mut self, leaf: Leaf) {
        // Most arrays are of one kind: after the first element nothing is left to record,
        // and the common case is one mask operation per element. (Testing `unrefused != 0`
        // is not enough: the check that accepts the array's kind, e.g. `Double` for FP32
        // data, never refuses, and walking all five checks for every number took about a
        // fifth of the reader's time: loadtest/validation.sh, 1 MiB JSON.)
        let newly = self.unrefused & !leaf.accepted_by();
        if newly != 0 {
            self.refuse(newly);
        }
        self.elements += 1;
    }

    /// Records the current element as the first that the checks in `newly` refuse.
    #[cold]
    fn refuse(&mut self, newly: u8) {
        for (index, first) in self.first_refused.iter_mut().enumerate() {
            if newly & (1 << index) != 0 {
                *first = Some(self.elements);
            }
        }
        self.unrefused &= !newly;
    }
}

/// An input's `shape`, summarized (a hostile shape array may be millions long).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeSummary {
    /// The value's kind: Triton wants an array.
    pub kind: Kind,
    /// The dimensions, as long as every one so far is an unsigned integer and there are at
    /// most `MAX_RANK` of them.
    pub dims: Vec<u64>,
    /// Whether some element is not an unsigned integer.
    pub has_non_uint: bool,
    /// Whether there were more than `MAX_RANK` dimensions.
    pub too_long: bool,
}

/// More dimensions than any model has; such a shape is not kept.
pub const MAX_RANK: usize = 1024;

/// A value as far as validation needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Str<'a>),
    Array(Vec<Value<'a>>),
    /// Members in document order; a repeated name is kept twice (RapidJSON does too, and
    /// `find` returns the first, as RapidJSON's `FindMember` does).
    Object(Vec<(Str<'a>, Value<'a>)>),
    /// An input's `data`.
    Data(DataSummary),
    /// An input's `shape`.
    Shape(ShapeSummary),
    /// A value validation never reads: checked for syntax, only its kind kept.
    Skipped(Kind),
}

impl<'a> Value<'a> {
    /// The kind of value.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Null => Kind::Null,
            Self::Bool(_) => Kind::Bool,
            Self::Number(_) => Kind::Number,
            Self::String(_) => Kind::String,
            Self::Array(_) => Kind::Array,
            Self::Object(_) => Kind::Object,
            Self::Data(d) => d.kind,
            Self::Shape(s) => s.kind,
            Self::Skipped(kind) => *kind,
        }
    }

    /// The first member named `key`, if this is an object.
    pub fn find(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Self::Object(members) => members
                .iter()
                .find(|(name, _)| name.as_ref() == key.as_bytes())
                .map(|(_, value)| value),
            _ => None,
        }
    }

    /// Members of an object, in order.
    pub fn members(&self) -> Option<&[(Str<'a>, Value<'a>)]> {
        match self {
            Self::Object(members) => Some(members),
            _ => None,
        }
    }

    /// The elements of an array.
    pub fn elements(&self) -> Option<&[Value<'a>]> {
        match self {
            Self::Array(elements) => Some(elements),
            _ => None,
        }
    }

    /// A string's bytes.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Self::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

/// Where a value sits in an inference request, which decides what is kept of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Root,
    Inputs,
    Input,
    Outputs,
    Output,
    Parameters,
    Shape,
    Scalar,
    Data,
}

/// Reads an inference request header (`{"id": ..., "inputs": [...], ...}`).
pub fn parse_request(text: &[u8]) -> Result<Value<'_>, SyntaxError> {
    let mut reader = Reader { text, pos: 0 };
    // RapidJSON's UTF-8 memory stream skips each byte of a byte-order mark on its own.
    for bom in [0xEF, 0xBB, 0xBF] {
        if reader.peek() == bom {
            reader.pos += 1;
        }
    }
    reader.skip_whitespace();
    if reader.peek() == 0 {
        return Err(reader.error(DOCUMENT_EMPTY));
    }
    let value = reader.value(Place::Root)?;
    reader.skip_whitespace();
    if reader.peek() != 0 {
        return Err(reader.error(ROOT_NOT_SINGULAR));
    }
    Ok(value)
}

/// The text of Triton's error for a syntax error.
pub fn syntax_message(error: &SyntaxError) -> String {
    format!(
        "failed to parse the request JSON buffer: {} at {}",
        error.message, error.offset
    )
}

struct Reader<'a> {
    text: &'a [u8],
    pos: usize,
}

/// A container being walked by `skip_or_summarize`.
#[derive(Clone, Copy)]
enum Frame {
    /// An array; `leaves` when its elements are `data` elements.
    Array {
        leaves: bool,
    },
    Object,
}

// One impl block of about 680 lines, on purpose: the reader is a step-by-step port of
// RapidJSON's (Triton's JSON parser), whose functions share one cursor and keep RapidJSON's
// names and order, so each can be read side by side with its original; `number` follows
// `ParseNumber` step for step, and splitting it would lose that correspondence.
impl<'a> Reader<'a> {
    /// RapidJSON's `Peek`: NUL at the end (and for a NUL byte).
    fn peek(&self) -> u8 {
        self.text.get(self.pos).copied().unwrap_or(0)
    }

    fn consume(&mut self, byte: u8) -> bool {
        if self.peek() == byte && byte != 0 {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn error(&self, message: &'static str) -> SyntaxError {
        SyntaxError {
            message,
            offset: self.pos,
        }
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), b' ' | b'\n' | b'\r' | b'\t') {
            self.pos += 1;
        }
    }

    /// One value, kept as `place` needs it.
    fn value(&mut self, place: Place) -> Result<Value<'a>, SyntaxError> {
        match (place, self.peek()) {
            (Place::Data, _) => self
                .skip_or_summarize(true)
                .map(|(_, summary)| Value::Data(summary.expect("data is summarized"))),
            (Place::Shape, b'[') => self.shape(),
            (Place::Root | Place::Input | Place::Output | Place::Parameters, b'{') => {
                self.object(place)
            }
            (Place::Inputs | Place::Outputs, b'[') => self.array(place),
            (_, b'{' | b'[') => self
                .skip_or_summarize(false)
                .map(|(kind, _)| Value::Skipped(kind)),
            (_, b'"') => Ok(Value::String(self.string()?)),
            (_, b'n') => self.literal(b"ull", Value::Null),
            (_, b't') => self.literal(b"rue", Value::Bool(true)),
            (_, b'f') => self.literal(b"alse", Value::Bool(false)),
            _ => Ok(Value::Number(self.number()?)),
        }
    }

    /// `null`, `true`, `false`: the first letter is known to match.
    fn literal(&mut self, rest: &[u8], value: Value<'a>) -> Result<Value<'a>, SyntaxError> {
        self.pos += 1;
        for &byte in rest {
            if !self.consume(byte) {
                return Err(self.error(VALUE_INVALID));
            }
        }
        Ok(value)
    }

    fn object(&mut self, place: Place) -> Result<Value<'a>, SyntaxError> {
        self.pos += 1; // '{'
        self.skip_whitespace();
        let mut members = Vec::new();
        if self.consume(b'}') {
            return Ok(Value::Object(members));
        }
        loop {
            if self.peek() != b'"' {
                return Err(self.error(OBJECT_MISS_NAME));
            }
            let name = self.string()?;
            self.skip_whitespace();
            if !self.consume(b':') {
                return Err(self.error(OBJECT_MISS_COLON));
            }
            self.skip_whitespace();
            let child = member_place(place, &name);
            let value = match child {
                Some(child) => self.value(child)?,
                None => Value::Skipped(self.skip_or_summarize(false)?.0),
            };
            members.push((name, value));
            self.skip_whitespace();
            match self.peek() {
                b',' => {
                    self.pos += 1;
                    self.skip_whitespace();
                }
                b'}' => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.error(OBJECT_MISS_COMMA)),
            }
        }
    }

    fn array(&mut self, place: Place) -> Result<Value<'a>, SyntaxError> {
        let element = match place {
            Place::Inputs => Place::Input,
            Place::Outputs => Place::Output,
            _ => Place::Scalar,
        };
        self.pos += 1; // '['
        self.skip_whitespace();
        let mut elements = Vec::new();
        if self.consume(b']') {
            return Ok(Value::Array(elements));
        }
        loop {
            elements.push(self.value(element)?);
            self.skip_whitespace();
            if self.consume(b',') {
                self.skip_whitespace();
            } else if self.consume(b']') {
                return Ok(Value::Array(elements));
            } else {
                return Err(self.error(ARRAY_MISS_COMMA));
            }
        }
    }

    fn shape(&mut self) -> Result<Value<'a>, SyntaxError> {
        self.pos += 1; // '['
        self.skip_whitespace();
        let mut shape = ShapeSummary {
            kind: Kind::Array,
            dims: Vec::new(),
            has_non_uint: false,
            too_long: false,
        };
        if self.consume(b']') {
            return Ok(Value::Shape(shape));
        }
        loop {
            let dim = match self.peek() {
                b'{' | b'[' => {
                    self.skip_or_summarize(false)?;
                    None
                }
                _ => self.value(Place::Scalar)?.as_u64(),
            };
            match dim {
                Some(_) if shape.too_long || shape.has_non_uint => {}
                Some(d) if shape.dims.len() < MAX_RANK => shape.dims.push(d),
                Some(_) => {
                    shape.too_long = true;
                    shape.dims = Vec::new();
                }
                None => shape.has_non_uint = true,
            }
            self.skip_whitespace();
            if self.consume(b',') {
                self.skip_whitespace();
            } else if self.consume(b']') {
                return Ok(Value::Shape(shape));
            } else {
                return Err(self.error(ARRAY_MISS_COMMA));
            }
        }
    }

    /// Walks one value without keeping it, with an explicit stack. With `summarize`, the
    /// value is an input's `data`: every non-array value reached through arrays alone is an
    /// element, classified for `DataSummary`.
    fn skip_or_summarize(
        &mut self,
        summarize: bool,
    ) -> Result<(Kind, Option<DataSummary>), SyntaxError> {
        let mut summary = summarize.then(|| DataSummary::new(Kind::Null));
        let mut stack: Vec<Frame> = Vec::new();
        let mut root_kind = None;
        loop {
            // A value starts here: the root, an array element or a member value.
            let counts = match stack.last() {
                Some(Frame::Array { leaves }) => *leaves,
                Some(Frame::Object) => false,
                None => false,
            };
            if counts && let Some(summary) = summary.as_mut() {
                self.plain_run(summary);
            }
            let kind = match self.peek() {
                b'[' => {
                    self.pos += 1;
                    self.skip_whitespace();
                    let leaves = summarize && (stack.is_empty() || counts);
                    if self.consume(b']') {
                        Kind::Array
                    } else {
                        stack.push(Frame::Array { leaves });
                        root_kind.get_or_insert(Kind::Array);
                        continue;
                    }
                }
                b'{' => {
                    if counts && let Some(summary) = summary.as_mut() {
                        summary.add(Leaf::Other);
                    }
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.consume(b'}') {
                        Kind::Object
                    } else {
                        stack.push(Frame::Object);
                        root_kind.get_or_insert(Kind::Object);
                        self.member_name()?;
                        continue;
                    }
                }
                _ => self.scalar(if counts { summary.as_mut() } else { None })?,
            };
            root_kind.get_or_insert(kind);
            if self.close(&mut stack)? {
                let kind = root_kind.expect("a value was read");
                if let Some(summary) = summary.as_mut() {
                    summary.kind = kind;
                }
                return Ok((kind, summary));
            }
        }
    }

    /// A string, literal or number, walked; an element of `data` (`summary`) is classified.
    fn scalar(&mut self, summary: Option<&mut DataSummary>) -> Result<Kind, SyntaxError> {
        match self.peek() {
            b'"' => {
                let length = self.skip_string()?;
                if let Some(summary) = summary {
                    summary.add_string(length);
                }
                Ok(Kind::String)
            }
            b'n' | b't' | b'f' => {
                let (rest, leaf, kind): (&[u8], _, _) = match self.peek() {
                    b'n' => (b"ull", Leaf::Other, Kind::Null),
                    b't' => (b"rue", Leaf::Bool, Kind::Bool),
                    _ => (b"alse", Leaf::Bool, Kind::Bool),
                };
                self.literal(rest, Value::Null)?;
                if let Some(summary) = summary {
                    summary.add(leaf);
                }
                Ok(kind)
            }
            _ => {
                let leaf = match self.plain_number() {
                    Some(leaf) => leaf,
                    None => Leaf::number(self.number()?),
                };
                if let Some(summary) = summary {
                    summary.add(leaf);
                }
                Ok(Kind::Number)
            }
        }
    }

    /// After a complete value, closes every container it completes: `false` at the next
    /// element or member (its name read), `true` when the walked value itself is complete.
    fn close(&mut self, stack: &mut Vec<Frame>) -> Result<bool, SyntaxError> {
        loop {
            let Some(frame) = stack.last().copied() else {
                return Ok(true);
            };
            self.skip_whitespace();
            match (frame, self.peek()) {
                (Frame::Array { .. }, b',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    return Ok(false);
                }
                (Frame::Object, b',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    self.member_name()?;
                    return Ok(false);
                }
                (Frame::Array { .. }, b']') | (Frame::Object, b'}') => {
                    self.pos += 1;
                    stack.pop();
                }
                (Frame::Array { .. }, _) => return Err(self.error(ARRAY_MISS_COMMA)),
                (Frame::Object, _) => return Err(self.error(OBJECT_MISS_COMMA)),
            }
        }
    }

    /// `"name"` `:` before a member value.
    fn member_name(&mut self) -> Result<(), SyntaxError> {
        if self.peek() != b'"' {
            return Err(self.error(OBJECT_MISS_NAME));
        }
        self.skip_string()?;
        self.skip_whitespace();
        if !self.consume(b':') {
            return Err(self.error(OBJECT_MISS_COLON));
        }
        self.skip_whitespace();
        Ok(())
    }

    /// A string, decoded (borrowed when it has no escapes).
    fn string(&mut self) -> Result<Str<'a>, SyntaxError> {
        let start = self.pos + 1;
        let mut decoded: Option<Vec<u8>> = None;
        self.scan_string(|piece| match piece {
            Piece::Raw(range) => {
                if let Some(out) = decoded.as_mut() {
                    out.extend_from_slice(range);
                }
            }
            Piece::Escaped(bytes, raw_before) => {
                decoded
                    .get_or_insert_with(|| raw_before.to_vec())
                    .extend_from_slice(bytes);
            }
        })?;
        Ok(match decoded {
            Some(bytes) => Cow::Owned(bytes),
            None => Cow::Borrowed(&self.text[start..self.pos - 1]),
        })
    }

    /// A string checked and measured (decoded length) but not kept.
    fn skip_string(&mut self) -> Result<u64, SyntaxError> {
        let mut length = 0u64;
        self.scan_string(|piece| {
            length += match piece {
                Piece::Raw(range) => range.len() as u64,
                Piece::Escaped(bytes, _) => bytes.len() as u64,
            }
        })?;
        Ok(length)
    }

    /// RapidJSON's `ParseStringToStream` (1.1): the opening quote is at `pos`. Reports the
    /// decoded string as raw runs and escaped pieces.
    fn scan_string(&mut self, mut sink: impl FnMut(Piece<'a, '_>)) -> Result<(), SyntaxError> {
        self.pos += 1; // '"'
        let start = self.pos;
        let mut run = self.pos;
        loop {
            let c = self.peek();
            match c {
                b'"' => {
                    sink(Piece::Raw(&self.text[run..self.pos]));
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => {
                    sink(Piece::Raw(&self.text[run..self.pos]));
                    let escape_offset = self.pos;
                    self.pos += 1;
                    let simple = match self.peek() {
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0C),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        _ => None,
                    };
                    let mut utf8 = [0u8; 4];
                    let bytes: &[u8] = if let Some(byte) = simple {
                        self.pos += 1;
                        utf8[0] = byte;
                        &utf8[..1]
                    } else if self.peek() == b'u' {
                        self.pos += 1;
                        let mut codepoint = self.hex4(escape_offset)?;
                        if (0xD800..=0xDBFF).contains(&codepoint) {
                            if !(self.consume(b'\\') && self.consume(b'u')) {
                                return Err(SyntaxError {
                                    message: SURROGATE_INVALID,
                                    offset: escape_offset,
                                });
                            }
                            let low = self.hex4(escape_offset)?;
                            if !(0xDC00..=0xDFFF).contains(&low) {
                                return Err(SyntaxError {
                                    message: SURROGATE_INVALID,
                                    offset: escape_offset,
                                });
                            }
                            codepoint = (((codepoint - 0xD800) << 10) | (low - 0xDC00)) + 0x10000;
                        }
                        let n = encode_utf8(codepoint, &mut utf8);
                        &utf8[..n]
                    } else {
                        return Err(SyntaxError {
                            message: ESCAPE_INVALID,
                            offset: escape_offset,
                        });
                    };
                    sink(Piece::Escaped(bytes, &self.text[start..escape_offset]));
                    run = self.pos;
                }
                0 => return Err(self.error(MISS_QUOTATION_MARK)),
                c if c < 0x20 => return Err(self.error(ESCAPE_INVALID)),
                _ => self.pos += 1,
            }
        }
    }

    fn hex4(&mut self, escape_offset: usize) -> Result<u32, SyntaxError> {
        let mut codepoint = 0u32;
        for _ in 0..4 {
            let digit = match self.peek() {
                c @ b'0'..=b'9' => c - b'0',
                c @ b'A'..=b'F' => c - b'A' + 10,
                c @ b'a'..=b'f' => c - b'a' + 10,
                _ => {
                    return Err(SyntaxError {
                        message: HEX_INVALID,
                        offset: escape_offset,
                    });
                }
            };
            codepoint = (codepoint << 4) | u32::from(digit);
            self.pos += 1;
        }
        Ok(codepoint)
    }

    /// The bulk of a data array, read in one tight loop: plain numbers each followed by a
    /// comma, then any whitespace (`json.dumps` writes `1, 2`, `indent=2` a newline). It
    /// stops before the first element that is anything else (including the last, followed
    /// by `]`, and one with whitespace before its comma), where the general walk takes over,
    /// at the start of a value as the walk expects it. The walk's per-element dispatch cost
    /// about two thirds of the reader's time on 1 MiB of FP32 data (benches/validate.rs).
    fn plain_run(&mut self, summary: &mut DataSummary) {
        loop {
            let start = self.pos;
            let Some(leaf) = self.plain_number() else {
                return;
            };
            if self.text.get(self.pos) != Some(&b',') {
                self.pos = start;
                return;
            }
            self.pos += 1;
            self.skip_whitespace();
            summary.add(leaf);
        }
    }

    /// The common number in tensor data (`plain_number`), consumed when it is one.
    fn plain_number(&mut self) -> Option<Leaf> {
        let (end, leaf) = plain_number(self.text, self.pos)?;
        self.pos = end;
        Some(leaf)
    }

    /// RapidJSON's `ParseNumber` (1.1, `kParseNanAndInfFlag`, normal precision), step by
    /// step: which literals are integers, which are doubles, and which are errors.
    fn number(&mut self) -> Result<Number, SyntaxError> {
        let start = self.pos;
        let digit = |c: u8| c.is_ascii_digit();
        let minus = self.consume(b'-');
        let mut i: u32 = 0;
        let mut i64v: u64 = 0;
        let mut use64 = false;
        let mut significand_digits = 0i32;
        let mut d = 0.0f64;
        let mut nan_or_inf = false;
        let c = self.peek();
        if c == b'0' {
            self.pos += 1;
        } else if (b'1'..=b'9').contains(&c) {
            i = u32::from(c - b'0');
            self.pos += 1;
            let (limit, last) = if minus {
                (214748364, b'8')
            } else {
                (429496729, b'5')
            };
            while digit(self.peek()) {
                if i >= limit && (i != limit || self.peek() > last) {
                    i64v = u64::from(i);
                    use64 = true;
                    break;
                }
                i = i * 10 + u32::from(self.peek() - b'0');
                self.pos += 1;
                significand_digits += 1;
            }
        } else if c == b'I' || c == b'N' {
            nan_or_inf = true;
            if self.consume(b'N') {
                if !(self.consume(b'a') && self.consume(b'N')) {
                    return Err(self.error(VALUE_INVALID));
                }
                d = f64::NAN;
            } else {
                self.pos += 1; // 'I'
                if !(self.consume(b'n') && self.consume(b'f')) {
                    return Err(self.error(VALUE_INVALID));
                }
                d = if minus {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                };
                if self.peek() == b'i'
                    && !(self.consume(b'i')
                        && self.consume(b'n')
                        && self.consume(b'i')
                        && self.consume(b't')
                        && self.consume(b'y'))
                {
                    return Err(self.error(VALUE_INVALID));
                }
            }
        } else {
            return Err(self.error(VALUE_INVALID));
        }

        let mut use_double = false;
        if use64 {
            let (limit, last) = if minus {
                (0x0CCC_CCCC_CCCC_CCCC_u64, b'8')
            } else {
                (0x1999_9999_9999_9999_u64, b'5')
            };
            while digit(self.peek()) {
                if i64v >= limit && (i64v != limit || self.peek() > last) {
                    d = i64v as f64;
                    use_double = true;
                    break;
                }
                i64v = i64v * 10 + u64::from(self.peek() - b'0');
                self.pos += 1;
                significand_digits += 1;
            }
        }
        if use_double {
            while digit(self.peek()) {
                d = d * 10.0 + f64::from(self.peek() - b'0');
                self.pos += 1;
            }
        }

        let mut exp_frac = 0i32;
        if self.consume(b'.') {
            if !digit(self.peek()) {
                return Err(self.error(NUMBER_MISS_FRACTION));
            }
            if !use_double {
                if !use64 {
                    i64v = u64::from(i);
                }
                while digit(self.peek()) {
                    if i64v > 0x1F_FFFF_FFFF_FFFF {
                        break;
                    }
                    i64v = i64v * 10 + u64::from(self.peek() - b'0');
                    self.pos += 1;
                    exp_frac -= 1;
                    if i64v != 0 {
                        significand_digits += 1;
                    }
                }
                d = i64v as f64;
                use_double = true;
            }
            while digit(self.peek()) {
                if significand_digits < 17 {
                    d = d * 10.0 + f64::from(self.peek() - b'0');
                    exp_frac -= 1;
                    if d > 0.0 {
                        significand_digits += 1;
                    }
                }
                self.pos += 1;
            }
        }

        let mut exp = 0i32;
        if self.consume(b'e') || self.consume(b'E') {
            if !use_double {
                d = if use64 { i64v as f64 } else { f64::from(i) };
                use_double = true;
            }
            let mut exp_minus = false;
            if self.consume(b'+') {
            } else if self.consume(b'-') {
                exp_minus = true;
            }
            if !digit(self.peek()) {
                return Err(self.error(NUMBER_MISS_EXPONENT));
            }
            exp = i32::from(self.peek() - b'0');
            self.pos += 1;
            if exp_minus {
                let max_exp = (exp_frac + 2147483639) / 10;
                while digit(self.peek()) {
                    exp = exp * 10 + i32::from(self.peek() - b'0');
                    self.pos += 1;
                    if exp > max_exp {
                        while digit(self.peek()) {
                            self.pos += 1;
                        }
                    }
                }
            } else {
                let max_exp = 308 - exp_frac;
                while digit(self.peek()) {
                    exp = exp * 10 + i32::from(self.peek() - b'0');
                    self.pos += 1;
                    if exp > max_exp {
                        return Err(SyntaxError {
                            message: NUMBER_TOO_BIG,
                            offset: start,
                        });
                    }
                }
            }
            if exp_minus {
                exp = -exp;
            }
        }

        if use_double {
            let d = strtod_normal_precision(d, exp + exp_frac);
            if d > f64::MAX {
                return Err(SyntaxError {
                    message: NUMBER_TOO_BIG,
                    offset: start,
                });
            }
            Ok(Number::Double(if minus { -d } else { d }))
        } else if nan_or_inf {
            Ok(Number::Double(d))
        } else if use64 {
            Ok(Number::Int(if minus {
                -i128::from(i64v)
            } else {
                i128::from(i64v)
            }))
        } else {
            Ok(Number::Int(if minus {
                -i128::from(i)
            } else {
                i128::from(i)
            }))
        }
    }
}

/// A part of a decoded string: raw text, or the bytes of one escape (with the raw text of
/// the string before it, for starting a decoded copy).
enum Piece<'a, 'b> {
    Raw(&'a [u8]),
    Escaped(&'b [u8], &'a [u8]),
}

/// Where the run of ASCII digits starting at `from` ends.
#[inline(always)]
fn digits_end(text: &[u8], mut from: usize) -> usize {
    while text.get(from).is_some_and(u8::is_ascii_digit) {
        from += 1;
    }
    from
}

/// The common number in tensor data at `pos`, classified without computing its value: at
/// most 18 integer digits (no leading zero), an optional fraction, no exponent. Such a
/// number can be neither too big nor anything but what its form says (an integer fits both
/// int64 and uint64 unless negative). Its end and its leaf; anything else (`None`) goes the
/// full `number` way, which has the errors and their offsets.
#[inline(always)]
pub(super) fn plain_number(text: &[u8], pos: usize) -> Option<(usize, Leaf)> {
    let negative = text.get(pos) == Some(&b'-');
    let first = pos + usize::from(negative);
    let mut end = digits_end(text, first);
    let digits = end - first;
    if digits == 0 || digits > 18 || (digits > 1 && text[first] == b'0') {
        return None;
    }
    let mut fraction = false;
    if text.get(end) == Some(&b'.') {
        let decimals_end = digits_end(text, end + 1);
        if decimals_end == end + 1 {
            return None;
        }
        fraction = true;
        end = decimals_end;
    }
    if matches!(text.get(end), Some(b'e' | b'E')) {
        return None;
    }
    let leaf = if fraction {
        Leaf::Number {
            uint: false,
            int: false,
        }
    } else {
        // "-0" is RapidJSON's integer 0, unsigned too.
        let zero = digits == 1 && text[first] == b'0';
        Leaf::Number {
            uint: !negative || zero,
            int: true,
        }
    };
    Some((end, leaf))
}

/// What is kept of the member `name` of an object at `place` (`None`: skipped).
fn member_place(place: Place, name: &[u8]) -> Option<Place> {
    match (place, name) {
        (Place::Root, b"id") => Some(Place::Scalar),
        (Place::Root | Place::Input | Place::Output, b"parameters") => Some(Place::Parameters),
        (Place::Root, b"inputs") => Some(Place::Inputs),
        (Place::Root, b"outputs") => Some(Place::Outputs),
        (Place::Input | Place::Output, b"name") => Some(Place::Scalar),
        (Place::Input, b"datatype") => Some(Place::Scalar),
        (Place::Input, b"shape") => Some(Place::Shape),
        (Place::Input, b"data") => Some(Place::Data),
        (Place::Parameters, _) => Some(Place::Scalar),
        _ => None,
    }
}

/// RapidJSON's UTF-8 encoder: surrogates (a lone low one is allowed) encode as 3 bytes.
fn encode_utf8(codepoint: u32, out: &mut [u8; 4]) -> usize {
    if codepoint <= 0x7F {
        out[0] = codepoint as u8;
        1
    } else if codepoint <= 0x7FF {
        out[0] = 0xC0 | ((codepoint >> 6) & 0xFF) as u8;
        out[1] = 0x80 | (codepoint & 0x3F) as u8;
        2
    } else if codepoint <= 0xFFFF {
        out[0] = 0xE0 | ((codepoint >> 12) & 0xFF) as u8;
        out[1] = 0x80 | ((codepoint >> 6) & 0x3F) as u8;
        out[2] = 0x80 | (codepoint & 0x3F) as u8;
        3
    } else {
        out[0] = 0xF0 | ((codepoint >> 18) & 0xFF) as u8;
        out[1] = 0x80 | ((codepoint >> 12) & 0x3F) as u8;
        out[2] = 0x80 | ((codepoint >> 6) & 0x3F) as u8;
        out[3] = 0x80 | (codepoint & 0x3F) as u8;
        4
    }
}

/// RapidJSON's `Pow10`: exact powers of ten, 1e0 to 1e308.
fn pow10(n: i32) -> f64 {
    static TABLE: OnceLock<Vec<f64>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=308)
            .map(|e| format!("1e{e}").parse().expect("a power of ten"))
            .collect()
    });
    table[n as usize]
}

fn fast_path(significand: f64, exp: i32) -> f64 {
    if exp < -308 {
        0.0
    } else if exp >= 0 {
        significand * pow10(exp.min(308))
    } else {
        significand / pow10(-exp)
    }
}

fn strtod_normal_precision(d: f64, p: i32) -> f64 {
    if p < -308 {
        fast_path(fast_path(d, -308), p + 308)
    } else {
        fast_path(d, p)
    }
}

#[cfg(test)]
#[path = "../../tests/support/reformat.rs"]
mod reformat;

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> (String, usize) {
        let e = parse_request(text.as_bytes()).unwrap_err();
        (e.message.to_string(), e.offset)
    }

    fn number(text: &str) -> Number {
        let doc = format!("{{\"id\":{text}}}");
        match parse_request(doc.as_bytes()).unwrap().find("id") {
            Some(Value::Number(n)) => *n,
            other => panic!("{other:?}"),
        }
    }

    /// Each pinned against Triton 2.51's answer to the same text.
    #[test]
    fn syntax_errors_match_triton() {
        assert_eq!(error("{bad"), (OBJECT_MISS_NAME.into(), 1));
        assert_eq!(error(r#"{"inputs": [}"#), (VALUE_INVALID.into(), 12));
        assert_eq!(error(r#"{"inputs":[]} x"#), (ROOT_NOT_SINGULAR.into(), 14));
        assert_eq!(error("   "), (DOCUMENT_EMPTY.into(), 3));
        assert_eq!(error("{\"id\":\"a\tb\"}"), (ESCAPE_INVALID.into(), 8));
        assert_eq!(error(r#"{"id":"a\qb"}"#), (ESCAPE_INVALID.into(), 8));
        assert_eq!(error(r#"{"id":"a\u12"}"#), (HEX_INVALID.into(), 8));
        assert_eq!(error(r#"{"id":"abc"#), (MISS_QUOTATION_MARK.into(), 10));
        assert_eq!(error("{\"id\":\"a\0b\"}"), (MISS_QUOTATION_MARK.into(), 8));
        assert_eq!(error(r#"{"id" "abc"}"#), (OBJECT_MISS_COLON.into(), 6));
        assert_eq!(
            error(r#"{"id":"abc" "inputs":[]}"#),
            (OBJECT_MISS_COMMA.into(), 12)
        );
        assert_eq!(
            error(r#"{"x":tru, "inputs":[]}"#),
            (VALUE_INVALID.into(), 8)
        );
        assert_eq!(error(r#"{"x":[1,2,]}"#), (VALUE_INVALID.into(), 10));
        assert_eq!(error(r#"{"x":1,}"#), (OBJECT_MISS_NAME.into(), 7));
        assert_eq!(error(r#"{"x":[1 2]}"#), (ARRAY_MISS_COMMA.into(), 8));
        assert_eq!(error(r#"{"x":[04]}"#), (ARRAY_MISS_COMMA.into(), 7));
        assert_eq!(error(r#"{"x":4.}"#), (NUMBER_MISS_FRACTION.into(), 7));
        assert_eq!(error(r#"{"x":.4}"#), (VALUE_INVALID.into(), 5));
        assert_eq!(error(r#"{"x":4e}"#), (NUMBER_MISS_EXPONENT.into(), 7));
        assert_eq!(error(r#"{"x":+4}"#), (VALUE_INVALID.into(), 5));
        assert_eq!(error(r#"{"x":-}"#), (VALUE_INVALID.into(), 6));
        assert_eq!(error(r#"{"x":nan}"#), (VALUE_INVALID.into(), 6));
        assert_eq!(error(r#"{"x":1e400}"#), (NUMBER_TOO_BIG.into(), 5));
        assert_eq!(error(r#"{"x":0e400}"#), (NUMBER_TOO_BIG.into(), 5));
        assert_eq!(error(r#"{"id":"\ud800"}"#), (SURROGATE_INVALID.into(), 7));
        assert_eq!(error(r#"{"x":1}/*c*/"#), (ROOT_NOT_SINGULAR.into(), 7));
        // Inside a skipped or summarized value the same errors, the same offsets.
        assert_eq!(
            error(r#"{"other":[1,{"a" 1}]}"#),
            (OBJECT_MISS_COLON.into(), 17)
        );
        assert_eq!(
            error(r#"{"inputs":[{"data":[1,2,]}]}"#),
            (VALUE_INVALID.into(), 24)
        );
        assert_eq!(
            syntax_message(&SyntaxError {
                message: VALUE_INVALID,
                offset: 12
            }),
            "failed to parse the request JSON buffer: Invalid value. at 12"
        );
    }

    #[test]
    fn accepts_what_triton_accepts() {
        for text in [
            "\u{feff}{\"inputs\":[]}",
            " \t\r\n{\"inputs\":[]} \n",
            "{\"inputs\":[]}\0 anything after a NUL",
            r#"{"id":"a\udc00b"}"#,
            "{\"id\":\"\u{ff}\"}",
            r#"{"x":[NaN,Inf,-Inf,Infinity,-Infinity,-NaN,1e-400,123456789012345678901234567890]}"#,
        ] {
            assert!(parse_request(text.as_bytes()).is_ok(), "{text:?}");
        }
        assert!(parse_request(b"{\"id\":\"\xff\"}").is_ok());
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_request(deep.as_bytes()).is_ok());
    }

    #[test]
    fn numbers_are_integers_or_doubles_as_rapidjson_says() {
        assert_eq!(number("0"), Number::Int(0));
        assert_eq!(number("-0"), Number::Int(0));
        assert_eq!(number("4294967296"), Number::Int(4294967296));
        assert_eq!(number("18446744073709551615"), Number::Int(u64::MAX.into()));
        assert!(matches!(number("18446744073709551616"), Number::Double(_)));
        assert_eq!(number("-9223372036854775808"), Number::Int(i64::MIN.into()));
        assert!(matches!(number("-9223372036854775809"), Number::Double(_)));
        assert_eq!(number("4.0"), Number::Double(4.0));
        assert_eq!(number("1e3"), Number::Double(1000.0));
        assert_eq!(number("-1.5E-2"), Number::Double(-0.015));
        assert_eq!(number("Inf"), Number::Double(f64::INFINITY));
        assert_eq!(number("-Infinity"), Number::Double(f64::NEG_INFINITY));
        assert!(matches!(number("NaN"), Number::Double(d) if d.is_nan()));
        assert_eq!(number("4294967296").as_u64(), Some(4294967296));
        assert!(!Number::Int(u64::MAX.into()).is_i64());
        assert!(Number::Int(-1).is_i64());
        assert_eq!(Number::Int(-1).as_u64(), None);
    }

    #[test]
    fn plain_numbers_are_classified_as_the_full_reader_does() {
        for text in [
            "0",
            "-0",
            "7",
            "-7",
            "123456789012345678",
            "-123456789012345678",
            "0.5",
            "-0.5",
            "1.25",
            "999999999999999999.999",
        ] {
            let mut reader = Reader {
                text: text.as_bytes(),
                pos: 0,
            };
            let Some(Leaf::Number { uint, int }) = reader.plain_number() else {
                panic!("{text} is plain")
            };
            assert_eq!(reader.pos, text.len(), "{text}");
            let full = number(text);
            assert_eq!(
                (uint, int),
                (full.as_u64().is_some(), full.is_i64()),
                "{text}"
            );
        }
        for text in [
            "01",
            "-",
            "1.",
            "1e5",
            "1234567890123456789",
            "NaN",
            "-Inf",
            ".5",
        ] {
            let mut reader = Reader {
                text: text.as_bytes(),
                pos: 0,
            };
            assert!(reader.plain_number().is_none(), "{text}");
            assert_eq!(reader.pos, 0);
        }
    }

    #[test]
    fn strings_decode_like_rapidjson() {
        let doc = parse_request(br#"{"id":"a\n\u00e9\ud83d\ude00\udc00\u0000z"}"#).unwrap();
        assert_eq!(
            doc.find("id").unwrap().as_bytes().unwrap(),
            b"a\n\xc3\xa9\xf0\x9f\x98\x80\xed\xb0\x80\0z"
        );
        let doc = parse_request(br#"{"id":"plain"}"#).unwrap();
        assert!(matches!(
            doc.find("id"),
            Some(Value::String(Cow::Borrowed(b"plain")))
        ));
    }

    #[test]
    fn data_is_summarized_not_built() {
        let doc = parse_request(
            br#"{"inputs":[{"name":"x","data":[[1,2],[3,[4.5]],true,"ab\n",-3,{"a":[1]},null,[]]}]}"#,
        )
        .unwrap();
        let input = &doc.find("inputs").unwrap().elements().unwrap()[0];
        let Some(Value::Data(data)) = input.find("data") else {
            panic!("{input:?}")
        };
        assert_eq!(data.kind, Kind::Array);
        assert_eq!(data.elements, 9);
        assert_eq!(data.first_refused(ElementCheck::Bool), Some(0));
        assert_eq!(data.first_refused(ElementCheck::Uint), Some(3));
        assert_eq!(data.first_refused(ElementCheck::Int), Some(3));
        assert_eq!(data.first_refused(ElementCheck::Double), Some(4));
        assert_eq!(data.first_refused(ElementCheck::String), Some(0));
        assert_eq!(data.string_bytes, 3 + 4);

        let doc = parse_request(br#"{"inputs":[{"data":5,"shape":[1,"x",3]}]}"#).unwrap();
        let input = &doc.find("inputs").unwrap().elements().unwrap()[0];
        assert_eq!(input.find("data").unwrap().kind(), Kind::Number);
        let Some(Value::Shape(shape)) = input.find("shape") else {
            panic!()
        };
        assert!(shape.has_non_uint);
    }

    #[test]
    fn first_of_repeated_members_wins() {
        let doc = parse_request(br#"{"inputs":[],"inputs":[1]}"#).unwrap();
        assert_eq!(doc.find("inputs").unwrap().elements().unwrap().len(), 0);
    }

    /// RFC 8259 allows space, tab, LF and CR before and after every structural character;
    /// `json.dumps` puts a space after each `,` and `:`, `indent=2` puts newlines. None of
    /// it may change what is read (Triton's RapidJSON skips it all), nor may `\u` escapes.
    #[test]
    fn whitespace_between_tokens_changes_nothing() {
        let compact = br#"{"id":"a","parameters":{"priority":1},"inputs":[{"name":"INPUT0","shape":[2,2],"datatype":"FP32","data":[[1,2.5],[-3,4]]},{"name":"S","shape":[2],"datatype":"BYTES","data":["x","yz"],"parameters":{"binary_data_size":4}}],"outputs":[{"name":"OUT"},{}],"extra":[1,{"a":[]}]}"#;
        let expected = parse_request(compact).unwrap();
        for seed in 0..64 {
            for style in reformat::styles(seed) {
                let text = reformat::reformat(compact, style);
                assert_eq!(
                    parse_request(&text).as_ref(),
                    Ok(&expected),
                    "{style:?}: {:?}",
                    String::from_utf8_lossy(&text)
                );
            }
        }
        // Python's `json.dumps` defaults, and `indent=2` after data with one number per line.
        for text in [
            r#"{"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}"#,
            "{\n  \"inputs\": [\n    {\n      \"name\": \"INPUT0\",\n      \"shape\": [\n        4\n      ],\n      \"datatype\": \"FP32\",\n      \"data\": [\n        1,\n        2,\n        3,\n        4\n      ]\n    }\n  ]\n}",
        ] {
            let doc = parse_request(text.as_bytes()).unwrap();
            let compact =
                br#"{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
            assert_eq!(doc, parse_request(compact).unwrap(), "{text:?}");
        }
    }
}
