//! The tensor datatypes of the KServe v2 protocol, as Triton names and sizes them.

use std::fmt;

/// A tensor element type. `BYTES` elements have no fixed size: on the wire each is a 4-byte
/// little-endian length followed by that many bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    Bytes,
}

impl DataType {
    /// Every datatype, in Triton's order.
    pub const ALL: [DataType; 14] = [
        Self::Bool,
        Self::Uint8,
        Self::Uint16,
        Self::Uint32,
        Self::Uint64,
        Self::Int8,
        Self::Int16,
        Self::Int32,
        Self::Int64,
        Self::Fp16,
        Self::Fp32,
        Self::Fp64,
        Self::Bf16,
        Self::Bytes,
    ];

    /// The protocol name (`FP32`, `BYTES`, ...). Exact and case-sensitive, as Triton's
    /// `TRITONSERVER_StringToDataType` is: `fp32` is not a datatype.
    pub fn from_protocol(name: &str) -> Option<Self> {
        // Matched against constants, each compare is a load or two; a search of `ALL` by
        // `as_str` called memcmp for every name of the same length (four for `FP32`).
        Some(match name {
            "BOOL" => Self::Bool,
            "UINT8" => Self::Uint8,
            "UINT16" => Self::Uint16,
            "UINT32" => Self::Uint32,
            "UINT64" => Self::Uint64,
            "INT8" => Self::Int8,
            "INT16" => Self::Int16,
            "INT32" => Self::Int32,
            "INT64" => Self::Int64,
            "FP16" => Self::Fp16,
            "FP32" => Self::Fp32,
            "FP64" => Self::Fp64,
            "BF16" => Self::Bf16,
            "BYTES" => Self::Bytes,
            _ => return None,
        })
    }

    /// A model config's name for it (`TYPE_FP32`, and `TYPE_STRING` for `BYTES`).
    pub fn from_config(name: &str) -> Option<Self> {
        match name {
            "TYPE_STRING" => Some(Self::Bytes),
            other => other.strip_prefix("TYPE_").and_then(Self::from_protocol),
        }
    }

    /// The protocol name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bool => "BOOL",
            Self::Uint8 => "UINT8",
            Self::Uint16 => "UINT16",
            Self::Uint32 => "UINT32",
            Self::Uint64 => "UINT64",
            Self::Int8 => "INT8",
            Self::Int16 => "INT16",
            Self::Int32 => "INT32",
            Self::Int64 => "INT64",
            Self::Fp16 => "FP16",
            Self::Fp32 => "FP32",
            Self::Fp64 => "FP64",
            Self::Bf16 => "BF16",
            Self::Bytes => "BYTES",
        }
    }

    /// Bytes per element, `None` for `BYTES`.
    pub fn size(self) -> Option<u64> {
        match self {
            Self::Bool | Self::Uint8 | Self::Int8 => Some(1),
            Self::Uint16 | Self::Int16 | Self::Fp16 | Self::Bf16 => Some(2),
            Self::Uint32 | Self::Int32 | Self::Fp32 => Some(4),
            Self::Uint64 | Self::Int64 | Self::Fp64 => Some(8),
            Self::Bytes => None,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How Triton prints a datatype a request named: its protocol name, or `<invalid>` for a
/// name it does not know.
pub fn protocol_string(name: &str) -> &str {
    match DataType::from_protocol(name) {
        Some(datatype) => datatype.as_str(),
        None => "<invalid>",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_case_sensitive() {
        for datatype in DataType::ALL {
            assert_eq!(DataType::from_protocol(datatype.as_str()), Some(datatype));
        }
        assert_eq!(DataType::from_protocol("fp32"), None);
        assert_eq!(DataType::from_config("TYPE_STRING"), Some(DataType::Bytes));
        assert_eq!(DataType::from_config("TYPE_BF16"), Some(DataType::Bf16));
        assert_eq!(DataType::from_config("FP32"), None);
        assert_eq!(protocol_string("FLOAT"), "<invalid>");
        assert_eq!(DataType::Fp16.size(), Some(2));
        assert_eq!(DataType::Bytes.size(), None);
    }
}
