//! The protocol-neutral inference request the checker reads, and how a refusal is told.
//!
//! A front-end decodes its wire format into an `InferRequest`: HTTP from the JSON header and
//! the binary tensor extension, gRPC from the protobuf message, with `raw_input_contents` as
//! `TensorData::Raw`. The checker never sees JSON or protobuf.

use bytes::Bytes;
use std::borrow::Cow;
use std::fmt;

/// An inference request as far as the model's signature is concerned. Its names borrow
/// from the request they were read from (the body, the protobuf message) where they can,
/// so a request that passes costs no copy of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferRequest<'a> {
    /// The request's `id` (empty when it has none): Triton prefixes its messages with it.
    pub id: Cow<'a, str>,
    /// Inputs in request order.
    pub inputs: Vec<InputTensor<'a>>,
    /// Names of the outputs asked for (none: all of them).
    pub outputs: Vec<Cow<'a, str>>,
}

impl InferRequest<'_> {
    /// `[request id: <id>] `, Triton's prefix for messages about the request; written only
    /// into a refusal's message, so nothing is built for a request that passes.
    pub fn log_prefix(&self) -> LogPrefix<'_> {
        LogPrefix(if self.id.is_empty() {
            "<id_unknown>"
        } else {
            &self.id
        })
    }
}

#[cfg(test)]
impl InferRequest<'_> {
    /// The same request owning its names, to outlive the bytes it was read from.
    pub fn into_owned(self) -> InferRequest<'static> {
        let owned = |text: Cow<'_, str>| Cow::Owned(text.into_owned());
        InferRequest {
            id: owned(self.id),
            inputs: (self.inputs.into_iter())
                .map(|input| InputTensor {
                    name: owned(input.name),
                    datatype: owned(input.datatype),
                    shape: Cow::Owned(input.shape.into_owned()),
                    data: input.data,
                })
                .collect(),
            outputs: self.outputs.into_iter().map(owned).collect(),
        }
    }
}

/// `InferRequest::log_prefix`: the request id, displayed in Triton's brackets.
#[derive(Clone, Copy)]
pub struct LogPrefix<'a>(&'a str);

impl std::fmt::Display for LogPrefix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[request id: {}] ", self.0)
    }
}

/// One input tensor: what the request says it is, and where its data is.
#[derive(Clone, Debug, PartialEq)]
pub struct InputTensor<'a> {
    /// Its name.
    pub name: Cow<'a, str>,
    /// Its datatype as the request wrote it (it may name no datatype at all).
    pub datatype: Cow<'a, str>,
    /// Its shape as the request wrote it, batch dimension included.
    pub shape: Cow<'a, [i64]>,
    /// Its data.
    pub data: TensorData,
}

/// Where an input's data is, described by size only: the checker never reads tensor values.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Already decoded elements (JSON `data`, gRPC typed contents): how many, and their
    /// size once serialized (for BYTES, 4 bytes of length per element plus the bytes).
    Elements { count: u64, byte_size: u64 },
    /// Bytes in the wire layout (binary tensor extension, gRPC `raw_input_contents`): a
    /// slice of the request body, not a copy.
    Raw(Bytes),
    /// Binary tensor bytes still on their way behind the JSON header (the request is checked
    /// from its header and streamed on): only their size. Never a BYTES tensor, whose
    /// strings must be walked.
    Arriving { byte_size: u64 },
}

impl TensorData {
    /// The data's size in bytes.
    pub fn byte_size(&self) -> u64 {
        match self {
            Self::Elements { byte_size, .. } | Self::Arriving { byte_size } => *byte_size,
            Self::Raw(bytes) => bytes.len() as u64,
        }
    }
}

/// Why a request was refused: a short stable label, used as the `reason` of
/// `infergate_validation_rejections_total` and of `GatewayError::InvalidInput`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The body is not JSON.
    MalformedJson,
    /// JSON, but not an inference request (no `inputs`, a name that is not a string, an
    /// input with no data or two kinds of data).
    MalformedRequest,
    /// A request, input or output parameter of the wrong type or in a forbidden pairing.
    Parameters,
    /// An input the model does not have.
    UnknownInput,
    /// A required input left out.
    MissingInput,
    /// The same input twice.
    DuplicateInput,
    /// A datatype that is not the model's, or that JSON cannot carry.
    Datatype,
    /// Rank or dimensions that do not match the model's.
    Shape,
    /// A batch over `max_batch_size`, or inputs with different batch sizes.
    BatchSize,
    /// JSON `data` with a different number of elements than the shape.
    DataLength,
    /// A JSON `data` value that does not fit the datatype.
    DataValue,
    /// Binary data sizes that do not match the shape or the body.
    BinarySize,
    /// BYTES data whose length prefixes do not make up the shape's elements.
    BytesEncoding,
    /// An output the model does not have.
    UnknownOutput,
    /// An input or output in a shared-memory region, which cannot cross a gateway.
    SharedMemory,
}

impl Reason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MalformedJson => "malformed_json",
            Self::MalformedRequest => "malformed_request",
            Self::Parameters => "parameters",
            Self::UnknownInput => "unknown_input",
            Self::MissingInput => "missing_input",
            Self::DuplicateInput => "duplicate_input",
            Self::Datatype => "datatype",
            Self::Shape => "shape",
            Self::BatchSize => "batch_size",
            Self::DataLength => "data_length",
            Self::DataValue => "data_value",
            Self::BinarySize => "binary_size",
            Self::BytesEncoding => "bytes_encoding",
            Self::UnknownOutput => "unknown_output",
            Self::SharedMemory => "shared_memory",
        }
    }
}

/// A refused request: why, and the message the client gets (Triton's words where Triton has
/// words for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The metric label.
    pub reason: Reason,
    /// The error text.
    pub message: String,
}

impl Rejection {
    /// A rejection for `reason` saying `message`.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// An input or output that names a shared-memory region. Triton would look the region
    /// up and find none (a region is registered on one server, and the gateway takes no
    /// registrations), so it is refused here, in the words the extension's endpoints use.
    pub fn shared_memory() -> Self {
        Self::new(Reason::SharedMemory, crate::protocol::NO_SHARED_MEMORY)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a wire's reader made of a request checked against the model's signature: the
/// pipeline's `validate` phase forwards it, logs why it went unread, or refuses and counts
/// it, the same way for every wire format.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Read and checked: it matches the signature.
    Passed,
    /// A kind of request the gateway leaves to Triton, forwarded as it came; why, for the
    /// debug log.
    Unvalidated(&'static str),
    /// Refused, in Triton's words where Triton has words for it.
    Refused(Rejection),
}

impl Verdict {
    /// The verdict of a check (`check`, `check_raw`) on a request that was read.
    pub fn of(checked: Result<(), Rejection>) -> Self {
        match checked {
            Ok(()) => Self::Passed,
            Err(rejection) => Self::Refused(rejection),
        }
    }
}

/// Triton's `DimsListToString`: `[4]`, `[-1,4]`, `[]`.
pub fn dims_to_string(dims: &[i64]) -> String {
    let inner: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", inner.join(","))
}
