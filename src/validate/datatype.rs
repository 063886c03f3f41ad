//! The tensor datatypes of the KServe v2 protocol, as Triton names and sizes them.

use std::fmt;

/// The datatypes, each with its protocol name, written once: the enum, `ALL`, `as_str` and
/// `from_protocol` are made from this one list.
macro_rules! datatypes {
    ($($variant:ident = $name:literal),* $(,)?) => {
        /// A tensor element type. `BYTES` elements have no fixed size: on the wire each is a
        /// 4-byte little-endian length followed by that many bytes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum DataType {
            $($variant),*
        }

        impl DataType {
            /// Every datatype, in Triton's order.
            pub const ALL: [DataType; [$($name),*].len()] = [$(Self::$variant),*];

            /// The protocol name (`FP32`, `BYTES`, ...). Exact and case-sensitive, as
            /// Triton's `TRITONSERVER_StringToDataType` is: `fp32` is not a datatype. A match
            /// on constants, each compare a load or two, where a search of `ALL` by `as_str`
            /// called memcmp for every name of the same length (four for `FP32`).
            pub fn from_protocol(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(Self::$variant),)*
                    _ => None,
                }
            }

            /// The protocol name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),*
                }
            }
        }
    };
}

datatypes! {
    Bool = "BOOL",
    Uint8 = "UINT8",
    Uint16 = "UINT16",
    Uint32 = "UINT32",
    Uint64 = "UINT64",
    Int8 = "INT8",
    Int16 = "INT16",
    Int32 = "INT32",
    Int64 = "INT64",
    Fp16 = "FP16",
    Fp32 = "FP32",
    Fp64 = "FP64",
    Bf16 = "BF16",
    Bytes = "BYTES",
}

impl DataType {
    /// A model config's name for it (`TYPE_FP32`, and `TYPE_STRING` for `BYTES`).
    pub fn from_config(name: &str) -> Option<Self> {
        match name {
            "TYPE_STRING" => Some(Self::Bytes),
            other => other.strip_prefix("TYPE_").and_then(Self::from_protocol),
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
