//! The `--input NAME:DATATYPE:SHAPE` tensor spec.
//!
//! A benchmark needs requests of a known shape without writing JSON by hand;
//! this module turns the short command-line form into a typed description
//! that the data generator and the body encoders share.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

/// A KServe v2 tensor datatype, spelled as in the protocol (`FP32`, `BYTES`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`: one byte per element in binary form, `true`/`false` in JSON.
    Bool,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `FP16`: IEEE half precision; raw bits in binary form, numbers in JSON.
    Fp16,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
    /// `BYTES`: variable-length strings, each prefixed by a 4-byte
    /// little-endian length in binary form.
    Bytes,
}

impl DataType {
    /// Every datatype, in protocol order; used by tests and error messages.
    pub const ALL: [DataType; 13] = [
        DataType::Bool,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
    ];

    /// The protocol spelling (`"FP32"`), as written in request JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Bytes per element in the binary extension, or `None` for `BYTES`
    /// whose elements have variable length.
    pub fn element_size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Int8 | DataType::Uint8 => Some(1),
            DataType::Int16 | DataType::Uint16 | DataType::Fp16 => Some(2),
            DataType::Int32 | DataType::Uint32 | DataType::Fp32 => Some(4),
            DataType::Int64 | DataType::Uint64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DataType {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let upper = s.trim().to_ascii_uppercase();
        for dt in DataType::ALL {
            if dt.as_str() == upper {
                return Ok(dt);
            }
        }
        let names: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
        bail!(
            "unknown datatype {s:?}; expected one of {}",
            names.join(", ")
        )
    }
}

/// One input tensor to synthesise: name, datatype and a concrete shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Input name as the model declares it (`INPUT0`).
    pub name: String,
    /// Element datatype.
    pub datatype: DataType,
    /// Concrete dimensions; every one is at least 1.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Number of elements: the product of the dimensions.
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }
}

impl FromStr for TensorSpec {
    type Err = anyhow::Error;

    /// Parses `NAME:DATATYPE:SHAPE`, where SHAPE is `4`, `1x4` or `1,4`.
    fn from_str(s: &str) -> Result<Self> {
        // The name may itself contain ':' (rare, but legal in Triton), so
        // split the datatype and shape off the right-hand side.
        let mut parts = s.rsplitn(3, ':');
        let (Some(shape), Some(dtype), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            bail!("invalid input spec {s:?}: expected NAME:DATATYPE:SHAPE, e.g. INPUT0:FP32:1x4");
        };
        let name = name.trim();
        if name.is_empty() {
            bail!("invalid input spec {s:?}: empty name");
        }
        let datatype: DataType = dtype.parse()?;
        let shape =
            parse_shape(shape).map_err(|e| anyhow::anyhow!("invalid input spec {s:?}: {e}"))?;
        Ok(TensorSpec {
            name: name.to_string(),
            datatype,
            shape,
        })
    }
}

/// Parses a shape written `4`, `1x4`, `2X3x4` or `1,4`.
pub fn parse_shape(s: &str) -> Result<Vec<usize>> {
    let s = s.trim();
    if s.is_empty() {
        bail!("empty shape");
    }
    let mut dims = Vec::new();
    for d in s.split(['x', 'X', ',']) {
        let d = d.trim();
        let v: usize = d
            .parse()
            .map_err(|_| anyhow::anyhow!("invalid dimension {d:?} in shape {s:?}"))?;
        if v == 0 {
            bail!("dimension 0 in shape {s:?}: every dimension must be at least 1");
        }
        dims.push(v);
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_simple_spec() {
        let s: TensorSpec = "INPUT0:FP32:4".parse().unwrap();
        assert_eq!(s.name, "INPUT0");
        assert_eq!(s.datatype, DataType::Fp32);
        assert_eq!(s.shape, vec![4]);
        assert_eq!(s.element_count(), 4);
    }

    #[test]
    fn parses_multi_dim_shapes() {
        let s: TensorSpec = "x:int64:1x4".parse().unwrap();
        assert_eq!(s.datatype, DataType::Int64);
        assert_eq!(s.shape, vec![1, 4]);
        let s: TensorSpec = "x:UINT8:2X3x4".parse().unwrap();
        assert_eq!(s.shape, vec![2, 3, 4]);
        assert_eq!(s.element_count(), 24);
        let s: TensorSpec = "x:BYTES:1,2".parse().unwrap();
        assert_eq!(s.shape, vec![1, 2]);
    }

    #[test]
    fn name_may_contain_colon() {
        let s: TensorSpec = "ns:input:FP16:8".parse().unwrap();
        assert_eq!(s.name, "ns:input");
        assert_eq!(s.datatype, DataType::Fp16);
    }

    #[test]
    fn every_datatype_round_trips() {
        for dt in DataType::ALL {
            assert_eq!(dt.as_str().parse::<DataType>().unwrap(), dt);
            assert_eq!(dt.as_str().to_lowercase().parse::<DataType>().unwrap(), dt);
        }
        assert_eq!(DataType::Bytes.element_size(), None);
        assert_eq!(DataType::Fp16.element_size(), Some(2));
        assert_eq!(DataType::Uint64.element_size(), Some(8));
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "INPUT0",
            "INPUT0:FP32",
            ":FP32:4",
            "INPUT0:FLOAT:4",
            "INPUT0:FP32:",
            "INPUT0:FP32:0",
            "INPUT0:FP32:1x0",
            "INPUT0:FP32:-1",
            "INPUT0:FP32:1xx4",
        ] {
            assert!(
                bad.parse::<TensorSpec>().is_err(),
                "{bad} should be rejected"
            );
        }
    }
}
