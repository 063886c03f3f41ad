//! Reading an HTTP/REST inference request (JSON header plus binary tensor extension) into
//! the neutral `InferRequest`, with the checks Triton's HTTP front-end makes while reading:
//! the JSON itself, each field's type, `data` against the shape and the datatype, binary
//! sizes against the body. Steps, order and messages follow Triton 2.51's `http_server.cc`;
//! none of them needs the model's signature. `verdict` then checks what was read against it:
//! the HTTP reader of the pipeline's `validate` phase.
//!
//! Nothing is copied: binary tensors become slices of the body (`Bytes::slice`), and JSON
//! `data` is only counted and classified.

use super::check::{check, check_raw};
use super::datatype::DataType;
use super::json::{self, DataSummary, ElementCheck, Kind, Value};
use super::request::{InferRequest, InputTensor, Reason, Rejection, TensorData, Verdict};
use super::signature::Signature;
use bytes::Bytes;
use foldhash::{HashSet, HashSetExt};
use std::borrow::Cow;

mod plain;

/// The result of reading a request that Triton's reader would not refuse.
#[derive(Debug, PartialEq)]
pub enum Parsed<'a> {
    /// Read: check it against the signature.
    Request(InferRequest<'a>),
    /// A raw binary request: the whole body is the model's only input (`check_raw`).
    Raw,
    /// A kind of request the gateway leaves to Triton (compressed body, raw binary input,
    /// an absurd header): forwarded unvalidated. The text says why, for debug logs.
    Unvalidated(&'static str),
    /// Only part of the body has arrived and a BYTES tensor in the rest must be walked:
    /// read again with the whole body.
    Incomplete,
}

/// What the reader has of a body: the bytes that have arrived, and the length of the whole
/// (`Content-Length`). For a binary request the arrived bytes may stop anywhere after the
/// JSON header; the tensors behind it are then checked by their sizes as they stream on.
#[derive(Clone, Copy)]
pub struct BodyView<'a> {
    /// The body's first bytes (all of them when `arrived.len() == length`).
    pub arrived: &'a Bytes,
    /// The whole body's length.
    pub length: usize,
}

impl<'a> BodyView<'a> {
    /// A body that has arrived whole.
    pub fn whole(body: &'a Bytes) -> Self {
        Self {
            arrived: body,
            length: body.len(),
        }
    }
}

/// Reads an HTTP inference request body. `header_length` is the
/// `Inference-Header-Content-Length` header, `content_encoding` the `Content-Encoding`
/// header, `model` the model named in the URL (Triton's reader names it in a few messages).
pub fn parse<'a>(
    body: BodyView<'a>,
    header_length: Option<&[u8]>,
    content_encoding: Option<&[u8]>,
    model: &str,
) -> Result<Parsed<'a>, Rejection> {
    let read = json_header(body, header_length, content_encoding).and_then(|header_length| {
        match plain::read(body, header_length, model) {
            Some(request) => Ok(request),
            None => read_request(body, header_length, model),
        }
    });
    match read {
        Ok(request) => Ok(Parsed::Request(request)),
        Err(Stop::Early(parsed)) => Ok(parsed),
        Err(Stop::Refused(rejection)) => Err(rejection),
    }
}

/// Why reading ended before a whole request was read: an outcome that is not a request, or
/// a refusal. Lets each step of `parse` end the reading with `?`.
enum Stop {
    /// Not read further (`Raw`, `Unvalidated`, `Incomplete`).
    Early(Parsed<'static>),
    /// Refused.
    Refused(Rejection),
}

impl From<Rejection> for Stop {
    fn from(rejection: Rejection) -> Self {
        Self::Refused(rejection)
    }
}

/// Whether a `Content-Encoding` value names a compression (anything but `identity`): such a
/// body is not read here, and its sequence is not followed.
pub fn compressed(content_encoding: &[u8]) -> bool {
    !content_encoding.is_empty() && content_encoding != b"identity"
}

/// The length of the body's JSON header (all of it, unless the binary tensor extension's
/// `Inference-Header-Content-Length` says less), once it has arrived; the bodies the
/// gateway does not read as JSON stop here.
fn json_header(
    body: BodyView<'_>,
    header_length: Option<&[u8]>,
    content_encoding: Option<&[u8]>,
) -> Result<usize, Stop> {
    if content_encoding.is_some_and(compressed) {
        return Err(Stop::Early(Parsed::Unvalidated("compressed request body")));
    }
    let Ok(content_length) = i32::try_from(body.length) else {
        return Err(Stop::Early(Parsed::Unvalidated(
            "body larger than Triton's 2 GiB limit",
        )));
    };
    let header_length = match header_length {
        None => content_length,
        Some(raw) => match atoi(raw) {
            None => {
                return Err(Stop::Early(Parsed::Unvalidated(
                    "Inference-Header-Content-Length overflows",
                )));
            }
            Some(n) if n < 0 || n > content_length => {
                return Err(Stop::Refused(Rejection::new(
                    Reason::BinarySize,
                    format!(
                        "inference header size should be in range (0, {content_length}), got: {}",
                        String::from_utf8_lossy(raw)
                    ),
                )));
            }
            Some(n) => n,
        },
    } as usize;
    if header_length == 0 {
        // Triton reads the whole body as one tensor for the model's only input.
        return Err(Stop::Early(Parsed::Raw));
    }
    if body.arrived.len() < header_length {
        return Err(Stop::Early(Parsed::Incomplete));
    }
    Ok(header_length)
}

/// The request in the JSON header's first `header_length` bytes, with its binary tensors
/// behind them: `id`, `parameters`, `inputs`, `outputs`, in the order Triton reads them.
fn read_request(
    body: BodyView<'_>,
    header_length: usize,
    model: &str,
) -> Result<InferRequest<'static>, Stop> {
    let document = json::parse_request(&body.arrived[..header_length])
        .map_err(|e| Rejection::new(Reason::MalformedJson, json::syntax_message(&e)))?;
    let mut request = InferRequest::default();
    if let Some(id) = document.find("id") {
        let id = id.as_bytes().ok_or_else(|| {
            malformed("Unable to parse 'id': attempt to access JSON non-string as string")
        })?;
        request.id = Cow::Owned(c_string(id));
    }
    if let Some(parameters) = document.find("parameters") {
        request_parameters(parameters)?;
    }
    let mut binary = Binary {
        body,
        next: header_length,
        model,
    };
    read_inputs(&document, &mut binary, &mut request)?;
    if binary.next != body.length {
        return Err(Stop::Refused(Rejection::new(
            Reason::BinarySize,
            format!("unexpected additional input data for model '{model}'"),
        )));
    }
    if document.find("outputs").is_some() {
        for output in member_array(&document, "outputs")? {
            request.outputs.push(Cow::Owned(read_output(output)?));
        }
    }
    Ok(request)
}

/// Where the binary tensors are: the body, and where the next one starts (after the JSON
/// header and the tensors read so far).
struct Binary<'b> {
    /// The body.
    body: BodyView<'b>,
    /// The offset of the next tensor's first byte.
    next: usize,
    /// The model named in the URL, for Triton's messages.
    model: &'b str,
}

/// Each input in request order, its name, datatype and shape, and its data.
fn read_inputs(
    document: &Value<'_>,
    binary: &mut Binary<'_>,
    request: &mut InferRequest<'static>,
) -> Result<(), Stop> {
    let mut names = HashSet::new();
    for input in member_array(document, "inputs")? {
        content_type(input)?;
        let name = member_string(input, "name")?;
        let datatype = member_string(input, "datatype")?;
        let Some(shape) = shape(input, &name)? else {
            return Err(Stop::Early(Parsed::Unvalidated(
                "shape with more than 1024 dimensions",
            )));
        };
        if !names.insert(name.clone()) {
            return Err(Stop::Refused(Rejection::new(
                Reason::DuplicateInput,
                format!(
                    "{}input '{name}' already exists in request",
                    request.log_prefix()
                ),
            )));
        }
        let parameters = input.find("parameters");
        let param = |key: &str| parameters.and_then(|p| p.find(key));
        let data = if let Some(size) = param("binary_data_size") {
            binary.tensor(binary_data_size(size)?, &name, &datatype)?
        } else if parameters.is_some_and(|p| p.find("shared_memory_region").is_some()) {
            // Where Triton looks the region up (and finds none).
            shared_memory(parameters)?;
            return Err(Stop::Refused(Rejection::shared_memory()));
        } else {
            let Some(Value::Data(data)) = input.find("data") else {
                unreachable!("content_type found 'data' and it is always summarized")
            };
            json_data(data, &name, &datatype, &shape)?
        };
        request.inputs.push(InputTensor {
            name: Cow::Owned(name),
            datatype: Cow::Owned(datatype),
            shape: Cow::Owned(shape),
            data,
        });
    }
    Ok(())
}

/// An input's `binary_data_size` parameter: an unsigned integer.
fn binary_data_size(size: &Value<'_>) -> Result<u64, Rejection> {
    size.as_u64().ok_or_else(|| {
        Rejection::new(
            Reason::BinarySize,
            "Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer as unsigned-integer",
        )
    })
}

impl Binary<'_> {
    /// The next binary tensor, `size` bytes: a slice of the body when they have arrived,
    /// else their size (a BYTES tensor must be walked: read the whole body).
    fn tensor(&mut self, size: u64, name: &str, datatype: &str) -> Result<TensorData, Stop> {
        let available = (self.body.length - self.next) as u64;
        if size > available {
            return Err(Stop::Refused(Rejection::new(
                Reason::BinarySize,
                format!(
                    "unexpected size for input '{name}', expecting {} additional bytes for model '{}'",
                    size - available,
                    self.model
                ),
            )));
        }
        let size = size as usize;
        self.next += size;
        if self.next <= self.body.arrived.len() {
            Ok(TensorData::Raw(
                self.body.arrived.slice(self.next - size..self.next),
            ))
        } else if datatype == "BYTES" {
            Err(Stop::Early(Parsed::Incomplete))
        } else {
            Ok(TensorData::Arriving {
                byte_size: size as u64,
            })
        }
    }
}

/// One requested output: its name, once its parameters are ones Triton accepts (an output in
/// shared memory is refused, as an input is).
fn read_output(output: &Value<'_>) -> Result<String, Rejection> {
    let parameters = output.find("parameters");
    let param = |key: &str| parameters.and_then(|p| p.find(key));
    let shm = param("shared_memory_region").is_some();
    if shm {
        shared_memory_output(param("classification"), param("binary_data"))?;
    }
    let name = member_string(output, "name")?;
    if param("classification").is_some_and(|c| c.as_u64().is_none()) {
        return Err(Rejection::new(
            Reason::Parameters,
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ));
    }
    if shm {
        shared_memory(parameters)?;
        return Err(Rejection::shared_memory());
    } else if param("binary_data").is_some_and(|b| b.as_bool().is_none()) {
        return Err(Rejection::new(
            Reason::Parameters,
            "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
        ));
    }
    Ok(name)
}

/// An output in shared memory can be neither classified nor sent as binary data; Triton
/// says so before it reads the output's name.
fn shared_memory_output(
    classification: Option<&Value<'_>>,
    binary_data: Option<&Value<'_>>,
) -> Result<(), Rejection> {
    if classification.is_some() {
        return Err(Rejection::new(
            Reason::Parameters,
            "Output can't set both 'shared_memory_region' and 'classification'",
        ));
    }
    let Some(binary) = binary_data else {
        return Ok(());
    };
    let binary = binary.as_bool().ok_or_else(|| {
        Rejection::new(
            Reason::Parameters,
            "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean",
        )
    })?;
    if binary {
        return Err(Rejection::new(
            Reason::Parameters,
            "Output can't set both 'shared_memory_region' and 'binary_data'",
        ));
    }
    Ok(())
}

/// The verdict on a body as `parse` read it: a request is checked against `signature`, a
/// raw binary body by its size (`check_raw`). Never `Incomplete`: read that again whole.
pub fn verdict(
    parsed: Result<Parsed, Rejection>,
    body: BodyView<'_>,
    signature: &Signature,
) -> Verdict {
    match parsed {
        Ok(Parsed::Request(request)) => Verdict::of(check(&request, signature)),
        Ok(Parsed::Raw) => Verdict::of(check_raw(body.length as u64, signature)),
        Ok(Parsed::Unvalidated(why)) => Verdict::Unvalidated(why),
        Ok(Parsed::Incomplete) => unreachable!("read again with the whole body"),
        Err(rejection) => Verdict::Refused(rejection),
    }
}

fn malformed(message: &str) -> Rejection {
    Rejection::new(Reason::MalformedRequest, message)
}

/// Triton hands names to its C API as C strings: they end at the first NUL.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// glibc `atoi` as Triton applies it to `Inference-Header-Content-Length`; `None` when the
/// digits do not fit an `int` (where `atoi` is undefined).
fn atoi(raw: &[u8]) -> Option<i32> {
    let mut rest = raw;
    while let [b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r', tail @ ..] = rest {
        rest = tail;
    }
    let negative = match rest.first() {
        Some(b'-') => {
            rest = &rest[1..];
            true
        }
        Some(b'+') => {
            rest = &rest[1..];
            false
        }
        _ => false,
    };
    let mut value: i64 = 0;
    for &b in rest.iter().take_while(|b| b.is_ascii_digit()) {
        value = value * 10 + i64::from(b - b'0');
        if value > i64::from(i32::MAX) + 1 {
            return None;
        }
    }
    i32::try_from(if negative { -value } else { value }).ok()
}

/// The request-level `parameters`: Triton reads each member in order; a few names have a
/// type of their own, every other value must be a string, a number or a boolean.
fn request_parameters(parameters: &Value<'_>) -> Result<(), Rejection> {
    let members = parameters.members().ok_or_else(|| {
        Rejection::new(
            Reason::Parameters,
            "failed to get request params.: attempt to get members for non-object",
        )
    })?;
    for (key, _) in members {
        // Triton looks each name up again, so a repeated name always reads its first value.
        let value = &members
            .iter()
            .find(|(k, _)| k == key)
            .expect("the key itself")
            .1;
        let key_text = String::from_utf8_lossy(key);
        if parameter_fits(key, ParameterValue::of(value)) {
            continue;
        }
        let message = match typed_parameter(key) {
            Some(expected) => format!("Unable to parse '{key_text}': {expected}"),
            None => format!(
                "parameter '{key_text}' has invalid type. It should be either 'int', 'bool', or 'string'."
            ),
        };
        return Err(Rejection::new(Reason::Parameters, message));
    }
    Ok(())
}

/// What a request parameter's value is, as far as Triton's types for parameters tell
/// apart: the full reader and the one-pass reader (`plain`) both judge by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParameterValue {
    String,
    /// A non-negative integer.
    Uint,
    /// Any other number.
    Number,
    Bool,
    /// Null, an array or an object.
    Other,
}

impl ParameterValue {
    fn of(value: &Value<'_>) -> Self {
        match value.kind() {
            Kind::String => Self::String,
            Kind::Bool => Self::Bool,
            Kind::Number if value.as_u64().is_some() => Self::Uint,
            Kind::Number => Self::Number,
            _ => Self::Other,
        }
    }
}

/// Whether Triton reads the request parameter `key` with this value: a few names have a
/// type of their own, every other value must be a string, a number or a boolean.
fn parameter_fits(key: &[u8], value: ParameterValue) -> bool {
    use ParameterValue::{Bool, Other, String, Uint};
    match key {
        b"sequence_id" => matches!(value, Uint | String),
        b"sequence_start" | b"sequence_end" | b"binary_data_output" => value == Bool,
        b"priority" | b"timeout" => value == Uint,
        _ => value != Other,
    }
}

/// Triton's words for a parameter with a type of its own read as another; `None` for any
/// other name.
fn typed_parameter(key: &[u8]) -> Option<&'static str> {
    match key {
        b"sequence_id" => Some("attempt to access JSON non-string as string"),
        b"sequence_start" | b"sequence_end" | b"binary_data_output" => {
            Some("attempt to access JSON non-boolean as boolean")
        }
        b"priority" | b"timeout" => {
            Some("attempt to access JSON non-unsigned-integer as unsigned-integer")
        }
        _ => None,
    }
}

/// `MemberAsArray`.
fn member_array<'v, 'a>(object: &'v Value<'a>, key: &str) -> Result<&'v [Value<'a>], Rejection> {
    match object.find(key) {
        None => Err(malformed(&format!(
            "Unable to parse '{key}': attempt to access non-existing object member '{key}'"
        ))),
        Some(value) => value.elements().ok_or_else(|| {
            malformed(&format!(
                "Unable to parse '{key}': attempt to access JSON non-array as array"
            ))
        }),
    }
}

/// `MemberAsString`, as a C string.
fn member_string(object: &Value<'_>, key: &str) -> Result<String, Rejection> {
    match object.find(key) {
        None => Err(malformed(&format!(
            "Unable to parse '{key}': attempt to access non-existing object member '{key}'"
        ))),
        Some(value) => value.as_bytes().map(c_string).ok_or_else(|| {
            malformed(&format!(
                "Unable to parse '{key}': attempt to access JSON non-string as string"
            ))
        }),
    }
}

/// An input carries its data in exactly one way.
fn content_type(input: &Value<'_>) -> Result<(), Rejection> {
    let parameters = input.find("parameters");
    let has = |key: &str| parameters.is_some_and(|p| p.find(key).is_some());
    let data = input.find("data").is_some();
    let binary = has("binary_data_size");
    let shm = has("shared_memory_region");
    if usize::from(data) + usize::from(binary) + usize::from(shm) == 1 {
        return Ok(());
    }
    let mut message = String::from(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in \
         'parameters', 'shared_memory_region' in 'parameters'. But",
    );
    if !(data || binary || shm) {
        message.push_str(" no field is set");
    } else {
        message.push_str(" set");
        for (set, name) in [
            (data, " 'data'"),
            (binary, " 'binary_data_size'"),
            (shm, " 'shared_memory_region'"),
        ] {
            if set {
                message.push_str(name);
            }
        }
    }
    Err(malformed(&message))
}

/// The shape as Triton keeps it (`int64`); `None` for a shape too long to be a model's.
fn shape(input: &Value<'_>, name: &str) -> Result<Option<Vec<i64>>, Rejection> {
    let not_uint = || {
        Rejection::new(
            Reason::Shape,
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
        )
    };
    let summary = match input.find("shape") {
        None => {
            return Err(malformed(
                "Unable to parse 'shape': attempt to access non-existing object member 'shape'",
            ));
        }
        Some(Value::Shape(summary)) => summary,
        Some(_) => {
            return Err(malformed(
                "Unable to parse 'shape': attempt to access JSON non-array as array",
            ));
        }
    };
    if summary.has_non_uint {
        return Err(not_uint());
    }
    if summary.too_long {
        return Ok(None);
    }
    // Triton casts each dimension to int64 and multiplies without overflow checks; past
    // that no tensor is meant (and Triton may allocate the product), so it is refused.
    let mut elements: i64 = 1;
    let mut shape = Vec::with_capacity(summary.dims.len());
    for &dim in &summary.dims {
        let dim = i64::try_from(dim).ok();
        let product = dim.and_then(|d| elements.checked_mul(d));
        match (dim, product) {
            (Some(dim), Some(product)) => {
                shape.push(dim);
                elements = product;
            }
            _ => {
                return Err(Rejection::new(
                    Reason::Shape,
                    format!(
                        "shape {:?} of input '{name}' has more elements than a tensor can hold",
                        summary.dims
                    ),
                ));
            }
        }
    }
    Ok(Some(shape))
}

/// JSON `data`: flat or nested, exactly the shape's element count, every value readable as
/// the request's datatype (Triton reads values as the request says, then compares the
/// datatype with the model's).
fn json_data(
    data: &DataSummary,
    name: &str,
    datatype: &str,
    shape: &[i64],
) -> Result<TensorData, Rejection> {
    let elements = shape.iter().product::<i64>() as u64;
    if elements == 0 {
        // Triton does not read `data` at all for an empty shape.
        return Ok(TensorData::Elements {
            count: 0,
            byte_size: 0,
        });
    }
    if data.kind != Kind::Array {
        return Err(Rejection::new(
            Reason::DataValue,
            "Unable to parse 'data': attempt to access JSON non-array as array",
        ));
    }
    let datatype = match DataType::from_protocol(datatype) {
        Some(DataType::Bytes) => return bytes_data(data),
        Some(half @ (DataType::Fp16 | DataType::Bf16)) => {
            return Err(Rejection::new(
                Reason::Datatype,
                format!(
                    "receiving {half} data via JSON is not supported. Please use the binary data format for input {name}"
                ),
            ));
        }
        Some(datatype) => datatype,
        None => {
            return Err(Rejection::new(
                Reason::Datatype,
                format!("invalid datatype for input {name}"),
            ));
        }
    };
    let (check, what) = element_check(datatype);
    // Triton reads element by element: a value of the wrong kind within the first
    // `elements` is found before a surplus of elements is.
    if data.first_refused(check).is_some_and(|i| i < elements) {
        return Err(Rejection::new(
            Reason::DataValue,
            format!("Unable to parse 'data': attempt to access JSON {what}"),
        ));
    }
    if data.elements != elements {
        return Err(Rejection::new(
            Reason::DataLength,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ));
    }
    Ok(TensorData::Elements {
        count: elements,
        byte_size: elements * datatype.size().expect("fixed-size datatype"),
    })
}

/// JSON `data` of a BYTES input: every element a string; its size as Triton serializes it.
fn bytes_data(data: &DataSummary) -> Result<TensorData, Rejection> {
    if data.first_refused(ElementCheck::String).is_some() {
        return Err(Rejection::new(
            Reason::DataValue,
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        ));
    }
    Ok(TensorData::Elements {
        count: data.elements,
        byte_size: data.string_bytes,
    })
}

/// How Triton reads each JSON element of a fixed-size `datatype`, and its words for a value
/// it cannot read so.
fn element_check(datatype: DataType) -> (ElementCheck, &'static str) {
    match datatype {
        DataType::Bool => (ElementCheck::Bool, "non-boolean as boolean"),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => (
            ElementCheck::Uint,
            "non-unsigned-integer as unsigned-integer",
        ),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            (ElementCheck::Int, "non-signed-integer as signed-integer")
        }
        _ => (ElementCheck::Double, "non-number as double"),
    }
}

/// An input or output in shared memory: its region name and numbers must be well-formed,
/// as Triton reads them before it looks the region up.
fn shared_memory(parameters: Option<&Value<'_>>) -> Result<(), Rejection> {
    let param = |key: &str| parameters.and_then(|p| p.find(key));
    if param("shared_memory_region").is_some_and(|r| r.as_bytes().is_none()) {
        return Err(Rejection::new(
            Reason::Parameters,
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
        ));
    }
    for key in ["shared_memory_offset", "shared_memory_byte_size"] {
        if param(key).is_some_and(|v| v.as_u64().is_none()) {
            return Err(Rejection::new(
                Reason::Parameters,
                format!(
                    "Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same outcome, owning what it read, to outlive the body.
    fn owned(parsed: Result<Parsed<'_>, Rejection>) -> Result<Parsed<'static>, Rejection> {
        parsed.map(|parsed| match parsed {
            Parsed::Request(request) => Parsed::Request(request.into_owned()),
            Parsed::Raw => Parsed::Raw,
            Parsed::Unvalidated(why) => Parsed::Unvalidated(why),
            Parsed::Incomplete => Parsed::Incomplete,
        })
    }

    fn read(body: &str) -> Result<Parsed<'static>, Rejection> {
        owned(parse(
            BodyView::whole(&Bytes::copy_from_slice(body.as_bytes())),
            None,
            None,
            "add_sub",
        ))
    }

    fn refused(body: &str) -> (Reason, String) {
        let r = read(body).unwrap_err();
        (r.reason, r.message)
    }

    fn request(body: &str) -> InferRequest<'static> {
        match read(body).unwrap() {
            Parsed::Request(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn binary(
        header: &str,
        tensors: &[u8],
        length: Option<&str>,
    ) -> Result<Parsed<'static>, Rejection> {
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(tensors);
        let declared = header.len().to_string();
        let length = length.unwrap_or(&declared);
        owned(parse(
            BodyView::whole(&Bytes::from(body)),
            Some(length.as_bytes()),
            None,
            "add_sub",
        ))
    }

    const OK: &str = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},{"name":"INPUT1","datatype":"FP32","shape":[2,2],"data":[[1,2],[3,4]]}]}"#;

    #[test]
    fn reads_json_requests() {
        let r = request(OK);
        assert_eq!(r.inputs.len(), 2);
        assert_eq!(*r.inputs[1].shape, [2, 2]);
        assert_eq!(
            r.inputs[1].data,
            TensorData::Elements {
                count: 4,
                byte_size: 16
            }
        );
        let r = request(
            r#"{"id":"ab\u0000cd","inputs":[{"name":"IN\u0000x","datatype":"FP32\u0000y","shape":[0],"data":"anything"}],"outputs":[{"name":"O","parameters":{"binary_data":true,"classification":2}}]}"#,
        );
        assert_eq!(r.id, "ab");
        assert_eq!(r.inputs[0].name, "IN");
        assert_eq!(r.inputs[0].datatype, "FP32");
        assert_eq!(r.outputs, ["O"]);
    }

    /// Every message below is what Triton 2.51 answered to the same body. Long: one list of
    /// measured cases, each an assertion, reads better whole than split.
    #[test]
    fn refuses_what_tritons_reader_refuses_in_its_words() {
        assert_eq!(
            refused("{bad"),
            (
                Reason::MalformedJson,
                "failed to parse the request JSON buffer: Missing a name for object member. at 1"
                    .into()
            )
        );
        assert_eq!(
            refused(r#"{"outputs":[]}"#).1,
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
        );
        assert_eq!(
            refused(r#"{"inputs":{}}"#).1,
            "Unable to parse 'inputs': attempt to access JSON non-array as array"
        );
        assert_eq!(
            refused(r#"[1]"#).1,
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
        );
        assert_eq!(
            refused(r#"{"id":5,"inputs":[]}"#).1,
            "Unable to parse 'id': attempt to access JSON non-string as string"
        );
        assert_eq!(
            refused(r#"{"inputs":[5]}"#).1,
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set"
        );
        assert_eq!(refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[1],"data":[1],"parameters":{"binary_data_size":4}}]}"#).1, "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'");
        assert_eq!(
            refused(r#"{"inputs":[{"datatype":"FP32","shape":[1],"data":[1]}]}"#).1,
            "Unable to parse 'name': attempt to access non-existing object member 'name'"
        );
        assert_eq!(
            refused(r#"{"inputs":[{"name":5,"datatype":"FP32","shape":[1],"data":[1]}]}"#).1,
            "Unable to parse 'name': attempt to access JSON non-string as string"
        );
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":4,"data":[1]}]}"#).1,
            "Unable to parse 'shape': attempt to access JSON non-array as array"
        );
        assert_eq!(refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[-4],"data":[1]}]}"#), (Reason::Shape, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer".into()));
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"data":[1,2,3]}]}"#),
            (
                Reason::DataLength,
                "Unable to parse 'data': Shape does not match true shape of 'data' field".into()
            )
        );
        assert_eq!(
            refused(
                r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"data":[1,2,3,"x"]}]}"#
            ),
            (
                Reason::DataValue,
                "Unable to parse 'data': attempt to access JSON non-number as double".into()
            )
        );
        assert_eq!(
            refused(
                r#"{"inputs":[{"name":"I","datatype":"INT32","shape":[4],"data":[1,2,3,4.0]}]}"#
            )
            .1,
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
        );
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"UINT8","shape":[2],"data":[1,-1]}]}"#).1,
            "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer"
        );
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"BOOL","shape":[2],"data":[1,0]}]}"#).1,
            "Unable to parse 'data': attempt to access JSON non-boolean as boolean"
        );
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"data":5}]}"#).1,
            "Unable to parse 'data': attempt to access JSON non-array as array"
        );
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"BYTES","shape":[2],"data":["a",5]}]}"#).1,
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
        );
        assert_eq!(refused(r#"{"inputs":[{"name":"I","datatype":"FP16","shape":[2],"data":[1,2]}]}"#), (Reason::Datatype, "receiving FP16 data via JSON is not supported. Please use the binary data format for input I".into()));
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"fp32","shape":[2],"data":[1,2]}]}"#).1,
            "invalid datatype for input I"
        );
        assert_eq!(
            refused(
                r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[1],"data":[1]},{"name":"I","datatype":"FP32","shape":[1],"data":[1]}]}"#
            ),
            (
                Reason::DuplicateInput,
                "[request id: <id_unknown>] input 'I' already exists in request".into()
            )
        );
        assert_eq!(
            refused(r#"{"parameters":5,"inputs":[]}"#).1,
            "failed to get request params.: attempt to get members for non-object"
        );
        assert_eq!(
            refused(r#"{"parameters":{"x":null,"priority":"a"},"inputs":[]}"#).1,
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."
        );
        assert_eq!(
            refused(r#"{"parameters":{"priority":"a","x":null},"inputs":[]}"#).1,
            "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer"
        );
        assert_eq!(
            refused(r#"{"parameters":{"sequence_id":1.5},"inputs":[]}"#).1,
            "Unable to parse 'sequence_id': attempt to access JSON non-string as string"
        );
        assert_eq!(
            refused(r#"{"parameters":{"sequence_start":1},"inputs":[]}"#).1,
            "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"
        );
        assert_eq!(
            refused(r#"{"inputs":[],"outputs":{}}"#).1,
            "Unable to parse 'outputs': attempt to access JSON non-array as array"
        );
        assert_eq!(
            refused(r#"{"inputs":[],"outputs":[{"parameters":{}}]}"#).1,
            "Unable to parse 'name': attempt to access non-existing object member 'name'"
        );
        assert_eq!(
            refused(r#"{"inputs":[],"outputs":[{"name":"O","parameters":{"binary_data":"yes"}}]}"#)
                .1,
            "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean"
        );
        assert_eq!(
            refused(r#"{"inputs":[],"outputs":[{"name":"O","parameters":{"classification":-1}}]}"#)
                .1,
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"
        );
        assert_eq!(refused(r#"{"inputs":[],"outputs":[{"name":"O","parameters":{"classification":2,"shared_memory_region":"x"}}]}"#).1, "Output can't set both 'shared_memory_region' and 'classification'");
    }

    #[test]
    fn accepts_what_tritons_reader_accepts() {
        for body in [
            // Nesting need not follow the shape, only the count must.
            r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"data":[[1,2,3],[4]]}]}"#,
            // Integers are not range-checked: 300 is read into a UINT8.
            r#"{"inputs":[{"name":"I","datatype":"UINT8","shape":[2],"data":[1,300]}]}"#,
            r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[2],"data":[NaN,-Infinity]}]}"#,
            r#"{"parameters":{"x":1.5,"y":"s","z":true,"priority":1,"sequence_id":"abc","x":null},"inputs":[]}"#,
            r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"data":[1,2,3,4],"parameters":5,"other":{"a":[]}}],"outputs":[{"name":"O","parameters":5}],"unknown":null}"#,
        ] {
            assert!(matches!(read(body), Ok(Parsed::Request(_))), "{body}");
        }
    }

    /// Where Triton would look a region up and find none, the gateway says why.
    #[test]
    fn refuses_shared_memory_where_triton_looks_the_region_up() {
        let shared = Rejection::shared_memory();
        for body in [
            r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":16}}]}"#,
            r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"data":[1,2,3,4]}],"outputs":[{"name":"O","parameters":{"shared_memory_region":"r"}}]}"#,
        ] {
            assert_eq!(read(body), Err(shared.clone()), "{body}");
        }
        // Triton's own checks of the parameters come first.
        assert_eq!(
            refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4],"parameters":{"shared_memory_region":5}}]}"#).1,
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string"
        );
        assert_eq!(
            refused(r#"{"inputs":[],"outputs":[{"name":"O","parameters":{"classification":2,"shared_memory_region":"x"}}]}"#).1,
            "Output can't set both 'shared_memory_region' and 'classification'"
        );
    }

    #[test]
    fn reads_a_binary_request_from_its_header_while_the_tensors_stream() {
        let header = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"parameters":{"binary_data_size":16}}]}"#;
        let length = header.len().to_string();
        let partial = |arrived: &[u8], total: usize| {
            owned(parse(
                BodyView {
                    arrived: &Bytes::copy_from_slice(arrived),
                    length: total,
                },
                Some(length.as_bytes()),
                None,
                "add_sub",
            ))
        };
        let mut head = header.as_bytes().to_vec();
        head.extend_from_slice(&[7; 5]); // part of the tensor came with the header
        let Ok(Parsed::Request(r)) = partial(&head, header.len() + 16) else {
            panic!()
        };
        assert_eq!(r.inputs[0].data, TensorData::Arriving { byte_size: 16 });
        // The sizes are checked against the declared length before any tensor byte is read.
        assert_eq!(
            partial(&head, header.len() + 20).unwrap_err(),
            Rejection::new(
                Reason::BinarySize,
                "unexpected additional input data for model 'add_sub'"
            )
        );
        assert_eq!(
            partial(&header.as_bytes()[..10], header.len() + 16),
            Ok(Parsed::Incomplete),
            "the header itself has not arrived"
        );
        let strings = header.replace("FP32", "BYTES");
        let length = strings.len().to_string();
        let arrived = Bytes::from(strings.clone());
        let outcome = parse(
            BodyView {
                arrived: &arrived,
                length: strings.len() + 16,
            },
            Some(length.as_bytes()),
            None,
            "m",
        );
        assert_eq!(outcome, Ok(Parsed::Incomplete), "BYTES must be walked");
    }

    #[test]
    fn reads_binary_tensors_as_slices_of_the_body() {
        let header = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"parameters":{"binary_data_size":16}},{"name":"INPUT1","datatype":"FP32","shape":[4],"parameters":{"binary_data_size":0}}]}"#;
        let Ok(Parsed::Request(r)) = binary(header, &[7; 16], None) else {
            panic!()
        };
        assert_eq!(
            r.inputs[0].data,
            TensorData::Raw(Bytes::from_static(&[7; 16]))
        );
        assert_eq!(r.inputs[1].data.byte_size(), 0);
        assert_eq!(
            binary(header, &[7; 12], None).unwrap_err(),
            Rejection::new(
                Reason::BinarySize,
                "unexpected size for input 'INPUT0', expecting 4 additional bytes for model 'add_sub'"
            )
        );
        assert_eq!(
            binary(header, &[7; 20], None).unwrap_err(),
            Rejection::new(
                Reason::BinarySize,
                "unexpected additional input data for model 'add_sub'"
            )
        );
        let total = header.len() + 16;
        assert_eq!(
            binary(header, &[7; 16], Some("100000"))
                .unwrap_err()
                .message,
            format!("inference header size should be in range (0, {total}), got: 100000")
        );
        assert_eq!(binary(header, &[7; 16], Some("abc")).unwrap(), Parsed::Raw);
        assert_eq!(
            binary(header, &[7; 16], Some("99999999999")).unwrap(),
            Parsed::Unvalidated("Inference-Header-Content-Length overflows")
        );
        // Without the header the whole body is JSON, and binary inputs find no bytes.
        assert_eq!(
            parse(BodyView::whole(&Bytes::from(header)), None, None, "add_sub")
                .unwrap_err()
                .message,
            "unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'add_sub'"
        );
        assert_eq!(
            parse(BodyView::whole(&Bytes::new()), None, None, "m").unwrap(),
            Parsed::Raw
        );
        assert_eq!(
            parse(
                BodyView::whole(&Bytes::from(header)),
                None,
                Some(b"gzip"),
                "m"
            )
            .unwrap(),
            Parsed::Unvalidated("compressed request body")
        );
    }

    #[test]
    fn refuses_shapes_no_tensor_can_have() {
        let (reason, message) = refused(
            r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[4294967296,4294967296],"data":[1]}]}"#,
        );
        assert_eq!(reason, Reason::Shape);
        assert!(
            message.contains("more elements than a tensor can hold"),
            "{message}"
        );
        // Triton would try to allocate 4 TiB for this one (and abort): the count is refused.
        assert_eq!(refused(r#"{"inputs":[{"name":"I","datatype":"FP32","shape":[1099511627776],"data":[1,2,3,4]}]}"#).0, Reason::DataLength);
    }

    #[test]
    fn atoi_reads_like_glibc() {
        assert_eq!(atoi(b"  42abc"), Some(42));
        assert_eq!(atoi(b"-3"), Some(-3));
        assert_eq!(atoi(b"+7"), Some(7));
        assert_eq!(atoi(b"abc"), Some(0));
        assert_eq!(atoi(b""), Some(0));
        assert_eq!(atoi(b"2147483647"), Some(i32::MAX));
        assert_eq!(atoi(b"-2147483648"), Some(i32::MIN));
        assert_eq!(atoi(b"2147483648"), None);
    }
}
