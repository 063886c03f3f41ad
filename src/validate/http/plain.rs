//! The one-pass reader of a plain inference request: the JSON header that clients send
//! (tritonclient, `json.dumps`, pretty-printed or not), read straight into the
//! `InferRequest` without building a document first.
//!
//! It reads a subset of what the full reader (`read_request` over `json::parse_request`)
//! reads: plain ASCII strings without escapes, the common numbers, the members Triton's
//! reader knows, each at most once. It only ever says yes: on anything outside that subset,
//! and on anything the full reader would refuse, it answers `None` and the full reader reads
//! the request again, with Triton's order of checks and Triton's words. So a request read
//! here is the one the full reader would have read (the tests below hold the two readers to
//! that on generated requests), and a refusal always comes from the full reader.
//!
//! The checks with meaning (a tensor's data against its shape and datatype, binary sizes
//! against the body) are the full reader's own functions (`json_data`, `Binary::tensor`);
//! only the JSON syntax is read twice.

use super::{
    Binary, BodyView, DataSummary, InferRequest, InputTensor, ParameterValue, json_data,
    parameter_fits,
};
use crate::validate::json::{Kind, Leaf, MAX_RANK, plain_number};
use std::borrow::Cow;

/// More inputs than a plain request has; past it the full reader (with its name set) reads.
const MAX_INPUTS: usize = 64;

/// More request parameters than a plain request has; past it the full reader reads. Names
/// are told apart pair by pair, so the bound also bounds that work, and they stay on the
/// stack.
const MAX_PARAMETERS: usize = 16;

/// The request in the JSON header's first `header_length` bytes, with its binary tensors
/// behind them, when it is plain and the full reader would accept it as it is.
pub(super) fn read<'a>(
    body: BodyView<'a>,
    header_length: usize,
    model: &str,
) -> Option<InferRequest<'a>> {
    let text = &body.arrived[..header_length];
    let mut scan = Scan {
        text,
        whole: (text.len() <= WHOLE_UTF8)
            .then(|| std::str::from_utf8(text).ok())
            .flatten(),
        pos: 0,
    };
    let mut binary = Binary {
        body,
        next: header_length,
        model,
    };
    let mut request = InferRequest::default();
    let mut seen = Seen::default();
    scan.object(|scan, key| match key {
        b"id" if seen.first(0) => {
            request.id = Cow::Borrowed(scan.text()?);
            Some(())
        }
        b"parameters" if seen.first(1) => request_parameters(scan),
        b"inputs" if seen.first(2) => scan.array(|scan| {
            let input = input(scan, &mut binary)?;
            let duplicate = request.inputs.iter().any(|i| i.name == input.name);
            (!duplicate && request.inputs.len() < MAX_INPUTS).then(|| request.inputs.push(input))
        }),
        b"outputs" if seen.first(3) => scan.array(|scan| {
            request.outputs.push(output(scan)?);
            Some(())
        }),
        _ => None,
    })?;
    scan.whitespace();
    let whole = scan.pos == scan.text.len() && binary.next == body.length;
    (whole && seen.has(2)).then_some(request)
}

/// Which of an object's members have been read: a repeated one is left to the full reader.
#[derive(Default)]
struct Seen(u8);

impl Seen {
    /// Whether member `bit` is read for the first time (and it is marked read).
    fn first(&mut self, bit: u8) -> bool {
        let fresh = self.0 & (1 << bit) == 0;
        self.0 |= 1 << bit;
        fresh
    }

    /// Whether member `bit` has been read.
    fn has(&self, bit: u8) -> bool {
        self.0 & (1 << bit) != 0
    }
}

/// One input: its name, datatype and shape, and its data in JSON or as the next binary
/// tensor.
fn input<'a>(scan: &mut Scan<'a>, binary: &mut Binary<'_>) -> Option<InputTensor<'a>> {
    let (mut name, mut datatype, mut shape) = (None, None, None);
    let mut data = None;
    let mut binary_size = None;
    let mut seen = Seen::default();
    scan.object(|scan, key| {
        match key {
            b"name" if seen.first(0) => name = Some(scan.text()?),
            b"datatype" if seen.first(1) => datatype = Some(scan.text()?),
            b"shape" if seen.first(2) => shape = Some(scan.shape()?),
            b"data" if seen.first(3) => data = Some(scan.data()?),
            b"parameters" if seen.first(4) => {
                let mut sized = Seen::default();
                scan.object(|scan, key| match key {
                    b"binary_data_size" if sized.first(0) => {
                        binary_size = Some(scan.uint()?);
                        Some(())
                    }
                    _ => None,
                })?;
            }
            _ => return None,
        }
        Some(())
    })?;
    let (name, datatype, shape) = (name?, datatype?, shape?);
    let data = match (data, binary_size) {
        (Some(data), None) => json_data(&data, name, datatype, &shape).ok()?,
        (None, Some(size)) => binary.tensor(size, name, datatype).ok()?,
        _ => return None,
    };
    Some(InputTensor {
        name: Cow::Borrowed(name),
        datatype: Cow::Borrowed(datatype),
        shape: Cow::Owned(shape),
        data,
    })
}

/// One requested output: its name, and at most `binary_data` as a boolean.
fn output<'a>(scan: &mut Scan<'a>) -> Option<Cow<'a, str>> {
    let mut name = None;
    let mut seen = Seen::default();
    scan.object(|scan, key| match key {
        b"name" if seen.first(0) => {
            name = Some(scan.text()?);
            Some(())
        }
        b"parameters" if seen.first(1) => {
            let mut binary = Seen::default();
            scan.object(|scan, key| match (key, scan.scalar()?) {
                (b"binary_data", ParameterValue::Bool) if binary.first(0) => Some(()),
                _ => None,
            })
        }
        _ => None,
    })?;
    name.map(Cow::Borrowed)
}

/// The request's `parameters`, each named once and of the type Triton reads it as
/// (`parameter_fits`, the full reader's rule).
fn request_parameters(scan: &mut Scan<'_>) -> Option<()> {
    let mut names = smallvec::SmallVec::<[&[u8]; MAX_PARAMETERS]>::new();
    scan.object(|scan, key| {
        if names.contains(&key) || names.len() == MAX_PARAMETERS {
            return None;
        }
        names.push(key);
        parameter_fits(key, scan.scalar()?).then_some(())
    })
}

/// A cursor over the JSON header. Every method reads one thing after optional whitespace,
/// and answers `None` for anything outside the plain subset.
struct Scan<'a> {
    text: &'a [u8],
    /// `text` as a `str`, for a short header: its strings are then slices of it, where each
    /// was checked as UTF-8 on its own (~70 instructions a name).
    whole: Option<&'a str>,
    pos: usize,
}

/// Headers up to this long are checked as UTF-8 once, whole (`Scan::whole`): a large JSON
/// tensor's numbers need no such check, so there it would only add.
const WHOLE_UTF8: usize = 4 << 10;

impl<'a> Scan<'a> {
    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.text.get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, consumed when it is `byte`.
    fn eat(&mut self, byte: u8) -> bool {
        self.whitespace();
        let found = self.text.get(self.pos) == Some(&byte);
        self.pos += usize::from(found);
        found
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.whitespace();
        self.text.get(self.pos).copied()
    }

    /// An object: `member` reads the value of each member, given its name.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        if !self.eat(b'{') {
            return None;
        }
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            let key = self.string()?;
            if !self.eat(b':') {
                return None;
            }
            member(self, key)?;
            if !self.eat(b',') {
                return self.eat(b'}').then_some(());
            }
        }
    }

    /// An array: `element` reads each element.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        if self.eat(b']') {
            return Some(());
        }
        loop {
            element(self)?;
            if !self.eat(b',') {
                return self.eat(b']').then_some(());
            }
        }
    }

    /// A string of printable ASCII without escapes: exactly its bytes, as the full reader
    /// decodes it.
    fn string(&mut self) -> Option<&'a [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.pos;
        let end = crate::plain_text::end(self.text, start);
        // The byte that ended the string: its closing quote, or one outside the subset.
        self.pos = end + 1;
        (self.text.get(end) == Some(&b'"')).then(|| &self.text[start..end])
    }

    /// A string kept as text (a member name is only compared, `string`).
    fn text(&mut self) -> Option<&'a str> {
        let string = self.string()?;
        match self.whole {
            // A plain string is ASCII, so its ends are character boundaries.
            Some(whole) => whole.get(self.pos - 1 - string.len()..self.pos - 1),
            None => std::str::from_utf8(string).ok(),
        }
    }

    /// A plain number (`json::plain_number`).
    fn number(&mut self) -> Option<Leaf> {
        self.whitespace();
        let (end, leaf) = plain_number(self.text, self.pos)?;
        self.pos = end;
        Some(leaf)
    }

    /// A non-negative integer of at most 18 digits.
    fn uint(&mut self) -> Option<u64> {
        self.whitespace();
        let start = self.pos;
        match self.number()? {
            // "-0" is unsigned to RapidJSON; the full reader has the last word on it.
            Leaf::Number { uint: true, .. } if self.text[start] != b'-' => Some(
                self.text[start..self.pos]
                    .iter()
                    .fold(0, |value, digit| value * 10 + u64::from(digit - b'0')),
            ),
            _ => None,
        }
    }

    /// A literal (`true`, `false`, `null`) as its data leaf, when one starts here.
    fn literal(&mut self) -> Option<Leaf> {
        self.whitespace();
        let rest = &self.text[self.pos..];
        let (length, leaf) = if rest.starts_with(b"true") || rest.starts_with(b"null") {
            (4, rest[0] == b't')
        } else if rest.starts_with(b"false") {
            (5, true)
        } else {
            return None;
        };
        self.pos += length;
        Some(if leaf { Leaf::Bool } else { Leaf::Other })
    }

    /// A string, number, boolean or null member value.
    fn scalar(&mut self) -> Option<ParameterValue> {
        match self.peek()? {
            b'"' => self.string().map(|_| ParameterValue::String),
            b't' | b'f' | b'n' => match self.literal()? {
                Leaf::Bool => Some(ParameterValue::Bool),
                _ => Some(ParameterValue::Other),
            },
            _ => match self.number()? {
                Leaf::Number { uint: true, .. } => Some(ParameterValue::Uint),
                _ => Some(ParameterValue::Number),
            },
        }
    }

    /// A shape: dimensions as Triton keeps them, whose product fits an `int64`.
    fn shape(&mut self) -> Option<Vec<i64>> {
        let mut shape = Vec::new();
        let mut elements: i64 = 1;
        self.array(|scan| {
            let dim = i64::try_from(scan.uint()?).ok()?;
            elements = elements.checked_mul(dim)?;
            (shape.len() < MAX_RANK).then(|| shape.push(dim))
        })?;
        Some(shape)
    }

    /// An input's `data`: an array, nested or not, of plain numbers, strings, booleans and
    /// nulls, summarized as the full reader summarizes it.
    fn data(&mut self) -> Option<DataSummary> {
        let mut summary = DataSummary::new(Kind::Array);
        self.elements(&mut summary, 0)?;
        Some(summary)
    }

    /// The elements of one array of `data`, `depth` arrays deep. A loop of its own rather
    /// than `array`: an element is most of a large JSON tensor's bytes, and the closure's
    /// calls and the whitespace looked for twice around each element cost about a fifth of
    /// them (`benches/validate.rs`).
    fn elements(&mut self, summary: &mut DataSummary, depth: usize) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        if self.eat(b']') {
            return Some(());
        }
        loop {
            match self.peek()? {
                b'[' if depth < 32 => self.elements(summary, depth + 1)?,
                b'"' => {
                    let length = self.string()?.len() as u64;
                    summary.add_string(length);
                }
                b't' | b'f' | b'n' => summary.add(self.literal()?),
                _ => {
                    let (end, leaf) = plain_number(self.text, self.pos)?;
                    self.pos = end;
                    summary.add(leaf);
                }
            }
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{TensorData, read_request};
    use super::*;
    use bytes::Bytes;

    /// What each reader makes of `header` followed by `tensors`: (one pass, full reader).
    fn both(
        header: &str,
        tensors: &[u8],
    ) -> (Option<InferRequest<'static>>, Option<InferRequest<'static>>) {
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(tensors);
        let body = Bytes::from(body);
        let view = BodyView::whole(&body);
        let full = read_request(view, header.len(), "m").ok();
        let plain = read(view, header.len(), "m").map(InferRequest::into_owned);
        (plain, full)
    }

    /// Read in one pass, and just as the full reader reads it.
    fn plain(header: &str, tensors: &[u8]) -> InferRequest<'static> {
        let (plain, full) = both(header, tensors);
        assert!(plain.is_some(), "not read in one pass: {header}");
        assert_eq!(plain, full, "{header}");
        plain.unwrap()
    }

    #[test]
    fn a_header_longer_than_the_whole_utf8_check_keeps_its_names() {
        let data = vec!["0.5"; 2000].join(", ");
        let header = format!(
            r#"{{"id": "long", "inputs": [{{"name": "INPUT0", "datatype": "FP32", "shape": [2000], "data": [{data}]}}]}}"#
        );
        assert!(header.len() > WHOLE_UTF8);
        let request = plain(&header, b"");
        assert_eq!((&*request.id, &*request.inputs[0].name), ("long", "INPUT0"));
        assert_eq!(request.inputs[0].datatype, "FP32");
    }

    #[test]
    fn what_clients_send_is_read_in_one_pass() {
        // json.dumps' defaults, with an id and request parameters.
        let request = plain(
            r#"{"id": "42", "parameters": {"sequence_id": 7, "sequence_start": true, "tag": "x"}, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.5, -3, 4]}, {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [[1, 2], [3, 4]]}], "outputs": [{"name": "OUTPUT0"}]}"#,
            b"",
        );
        assert_eq!(request.id, "42");
        assert_eq!(*request.inputs[1].shape, [1, 4]);
        assert_eq!(
            request.inputs[0].data,
            TensorData::Elements {
                count: 4,
                byte_size: 16
            }
        );
        assert_eq!(request.outputs, ["OUTPUT0"]);
        // Pretty-printed, BYTES in JSON, booleans.
        plain(
            "{\n  \"inputs\": [\n    {\n      \"name\": \"TEXT\",\n      \"datatype\": \"BYTES\",\n      \"shape\": [2],\n      \"data\": [\"ab\", \"\"]\n    },\n    {\"name\": \"B\", \"datatype\": \"BOOL\", \"shape\": [2], \"data\": [true, false]}\n  ]\n}\n",
            b"",
        );
        // tritonclient's binary tensors, outputs asked for as binary.
        let request = plain(
            r#"{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"INT32","parameters":{"binary_data_size":16}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}],"parameters":{"binary_data_output":true}}"#,
            &[0; 16],
        );
        assert_eq!(
            request.inputs[0].data,
            TensorData::Raw(Bytes::from(vec![0; 16]))
        );
    }

    #[test]
    fn anything_unusual_is_left_to_the_full_reader() {
        for header in [
            // Escapes, unknown members, a repeated member, numbers the full reader parses.
            r#"{"id":"a\nb","inputs":[]}"#,
            r#"{"inputs":[],"extra":1}"#,
            r#"{"inputs":[],"inputs":[]}"#,
            r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1e5]}]}"#,
            r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[NaN]}]}"#,
            // Refusals: the full reader has their words.
            r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[1.5]}]}"#,
            r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]},{"name":"x","datatype":"FP32","shape":[1],"data":[1]}]}"#,
            r#"{"outputs":[]}"#,
            r#"{"inputs":[]} x"#,
            "\u{feff}{\"inputs\":[]}",
        ] {
            assert_eq!(both(header, b"").0, None, "{header}");
        }
        // Binary sizes that do not add up to the body.
        let header = r#"{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"parameters":{"binary_data_size":4}}]}"#;
        assert_eq!(both(header, &[0; 8]).0, None);
        assert_eq!(both(header, &[0; 2]).0, None);
    }

    /// Up to `MAX_PARAMETERS` request parameters are read in one pass; more (a request
    /// could send thousands, each compared with the ones before) go to the full reader,
    /// which accepts them just the same.
    #[test]
    fn many_parameters_are_left_to_the_full_reader() {
        let header = |count: usize| {
            let parameters: Vec<String> = (0..count).map(|i| format!(r#""p{i}":{i}"#)).collect();
            format!(
                r#"{{"parameters":{{{}}},"inputs":[]}}"#,
                parameters.join(",")
            )
        };
        plain(&header(MAX_PARAMETERS), b"");
        let (one_pass, full) = both(&header(MAX_PARAMETERS + 1), b"");
        assert_eq!(one_pass, None);
        assert!(full.is_some(), "the full reader accepts them");
    }

    /// splitmix64: the generated requests are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    /// A request near what clients send, from pieces that are sometimes wrong.
    fn generated(rng: &mut Rng) -> (String, Vec<u8>) {
        const VALUES: &[&str] = &[
            "1",
            "-2",
            "0",
            "-0",
            "2.5",
            "1e3",
            "true",
            "null",
            "\"s\"",
            "[1,2]",
            "{}",
            "18446744073709551616",
            "01",
        ];
        let mut tensors = Vec::new();
        let mut inputs = Vec::new();
        for i in 0..rng.next() % 3 {
            let name = rng.pick(&["\"x\"", "\"y\"", "\"a\\u0041\"", "7"]);
            let datatype = rng.pick(&[
                "\"FP32\"",
                "\"INT32\"",
                "\"UINT8\"",
                "\"BOOL\"",
                "\"BYTES\"",
                "\"FP16\"",
                "\"X\"",
            ]);
            let dims = rng.next() % 4;
            let shape = format!(
                "[{}{}]",
                dims,
                if rng.next().is_multiple_of(4) {
                    ",2"
                } else {
                    ""
                }
            );
            let count = dims * if shape.contains(',') { 2 } else { 1 };
            let mut fields = vec![
                format!("\"name\":{name}"),
                format!("\"datatype\":{datatype}"),
                format!("\"shape\":{shape}"),
            ];
            if rng.next().is_multiple_of(3) {
                let size = count * 4 + rng.next() % 2;
                tensors.resize(tensors.len() + (count * 4) as usize, i as u8);
                fields.push(format!("\"parameters\":{{\"binary_data_size\":{size}}}"));
            } else {
                let data: Vec<&str> = (0..count + rng.next() % 2)
                    .map(|_| rng.pick(VALUES))
                    .collect();
                fields.push(format!("\"data\":[{}]", data.join(",")));
            }
            if rng.next().is_multiple_of(8) {
                fields.push(format!(
                    "\"{}\":{}",
                    rng.pick(&["name", "data", "parameters", "other"]),
                    rng.pick(VALUES)
                ));
            }
            if rng.next().is_multiple_of(2) {
                fields.reverse();
            }
            inputs.push(format!("{{{}}}", fields.join(",")));
        }
        let mut members = vec![format!("\"inputs\":[{}]", inputs.join(","))];
        if rng.next().is_multiple_of(3) {
            members.push(format!("\"id\":{}", rng.pick(&["\"r1\"", "1", "\"\""])));
        }
        if rng.next().is_multiple_of(3) {
            let key = rng.pick(&[
                "sequence_id",
                "sequence_start",
                "priority",
                "timeout",
                "tag",
                "binary_data_output",
            ]);
            members.push(format!("\"parameters\":{{\"{key}\":{}}}", rng.pick(VALUES)));
        }
        if rng.next().is_multiple_of(3) {
            let parameters = rng.pick(&[
                "",
                ",\"parameters\":{\"binary_data\":true}",
                ",\"parameters\":{\"binary_data\":1}",
                ",\"parameters\":{\"classification\":2}",
            ]);
            members.push(format!("\"outputs\":[{{\"name\":\"o\"{parameters}}}]"));
        }
        let separator = rng.pick(&[",", ", ", ",\n  "]);
        (format!("{{{}}}", members.join(separator)), tensors)
    }

    /// Whatever one pass reads, the full reader reads the same; and most of what is well
    /// formed is read in one pass.
    #[test]
    fn the_one_pass_reader_agrees_with_the_full_reader() {
        let mut rng = Rng(31);
        let (mut plain_reads, mut full_reads) = (0, 0);
        for _ in 0..20_000 {
            let (header, tensors) = generated(&mut rng);
            let (plain, full) = both(&header, &tensors);
            if plain.is_some() {
                assert_eq!(plain, full, "{header}");
                plain_reads += 1;
            }
            full_reads += usize::from(full.is_some());
        }
        assert!(
            plain_reads * 2 > full_reads,
            "{plain_reads} of {full_reads} read in one pass"
        );
    }
}
