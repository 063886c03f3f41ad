//! Tensor contents: generating values for a [`TensorSpec`] and laying them out
//! as raw little-endian bytes for the binary tensor extension.
//!
//! Values are generated once, before the run, so the hot loop only clones
//! ready-made bodies. Random values are kept in small ranges (integers within
//! ±100, floats in [0, 1)) so that models doing arithmetic on them do not
//! overflow or produce NaNs that would make a benchmark measure error paths.

use rand::Rng;
use rand::rngs::SmallRng;

use crate::spec::{DataType, TensorSpec};

/// How tensor values are chosen (`--data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataMode {
    /// Random values (seeded by `--seed`, so runs are reproducible).
    Random,
    /// A fixed, deterministic pattern: element `i` is `i % 16` (floats
    /// `(i % 16) * 0.5`, BOOL alternates, BYTES is `"item<i % 16>"`).
    Fixed,
}

/// The elements of one tensor, stored in the widest type of their family.
///
/// Integers are kept as `i64`/`u64` and narrowed on encoding; FP16 is kept
/// as `f32` values that are exactly representable in half precision.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// BOOL elements.
    Bool(Vec<bool>),
    /// INT8..INT64 elements.
    Int(Vec<i64>),
    /// UINT8..UINT64 elements.
    Uint(Vec<u64>),
    /// FP16 and FP32 elements.
    F32(Vec<f32>),
    /// FP64 elements.
    F64(Vec<f64>),
    /// BYTES elements (generated as short ASCII strings so JSON can carry them).
    Str(Vec<String>),
}

/// An input tensor with its values, ready to be encoded into a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Name, datatype and shape.
    pub spec: TensorSpec,
    /// The elements, `spec.element_count()` of them.
    pub values: Values,
}

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// `n` elements of one tensor: with `DataMode::Fixed` a pattern by index, so runs compare;
/// otherwise random draws, in element order, so a seed gives the same tensor.
fn elements<T>(
    n: usize,
    mode: DataMode,
    rng: &mut SmallRng,
    fixed: impl Fn(usize) -> T,
    mut random: impl FnMut(&mut SmallRng) -> T,
) -> Vec<T> {
    if mode == DataMode::Fixed {
        (0..n).map(fixed).collect()
    } else {
        (0..n).map(|_| random(rng)).collect()
    }
}

/// A short ASCII string for a random BYTES element (JSON carries it as it is).
fn random_string(rng: &mut SmallRng) -> String {
    let len = rng.random_range(1..=16);
    (0..len)
        .map(|_| ALNUM[rng.random_range(0..ALNUM.len())] as char)
        .collect()
}

impl Tensor {
    /// Generates values for `spec` according to `mode`.
    pub fn generate(spec: &TensorSpec, mode: DataMode, rng: &mut SmallRng) -> Tensor {
        let n = spec.element_count();
        let values = match spec.datatype {
            DataType::Bool => Values::Bool(elements(n, mode, rng, |i| i % 2 == 0, |r| r.random())),
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                Values::Int(elements(
                    n,
                    mode,
                    rng,
                    |i| (i % 16) as i64,
                    |r| r.random_range(-100..=100),
                ))
            }
            DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
                Values::Uint(elements(
                    n,
                    mode,
                    rng,
                    |i| (i % 16) as u64,
                    |r| r.random_range(0..=200),
                ))
            }
            // k/1024 with k < 1024 is exact in half precision, so the JSON
            // number and the binary FP16 bits describe the same value.
            DataType::Fp16 => Values::F32(elements(
                n,
                mode,
                rng,
                |i| (i % 16) as f32 * 0.5,
                |r| r.random_range(0..1024u32) as f32 / 1024.0,
            )),
            DataType::Fp32 => Values::F32(elements(
                n,
                mode,
                rng,
                |i| (i % 16) as f32 * 0.5,
                |r| r.random::<f32>(),
            )),
            DataType::Fp64 => Values::F64(elements(
                n,
                mode,
                rng,
                |i| (i % 16) as f64 * 0.5,
                |r| r.random::<f64>(),
            )),
            DataType::Bytes => Values::Str(elements(
                n,
                mode,
                rng,
                |i| format!("item{}", i % 16),
                random_string,
            )),
        };
        Tensor {
            spec: spec.clone(),
            values,
        }
    }

    /// Appends the binary-extension representation of the elements to `out`:
    /// little-endian fixed-width values, or for BYTES a 4-byte little-endian
    /// length followed by the bytes of each element.
    pub fn write_raw(&self, out: &mut Vec<u8>) {
        match (&self.values, self.spec.datatype) {
            (Values::Bool(v), _) => out.extend(v.iter().map(|&b| b as u8)),
            (Values::Int(v), dt) => {
                for &x in v {
                    match dt {
                        DataType::Int8 => out.push(x as i8 as u8),
                        DataType::Int16 => out.extend_from_slice(&(x as i16).to_le_bytes()),
                        DataType::Int32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
                        _ => out.extend_from_slice(&x.to_le_bytes()),
                    }
                }
            }
            (Values::Uint(v), dt) => {
                for &x in v {
                    match dt {
                        DataType::Uint8 => out.push(x as u8),
                        DataType::Uint16 => out.extend_from_slice(&(x as u16).to_le_bytes()),
                        DataType::Uint32 => out.extend_from_slice(&(x as u32).to_le_bytes()),
                        _ => out.extend_from_slice(&x.to_le_bytes()),
                    }
                }
            }
            (Values::F32(v), DataType::Fp16) => {
                for &x in v {
                    out.extend_from_slice(&f32_to_f16_bits(x).to_le_bytes());
                }
            }
            (Values::F32(v), _) => {
                for &x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            (Values::F64(v), _) => {
                for &x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            (Values::Str(v), _) => {
                for s in v {
                    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
            }
        }
    }

    /// Size in bytes of [`Tensor::write_raw`]'s output, which is what the
    /// `binary_data_size` parameter must announce.
    pub fn raw_len(&self) -> usize {
        match (&self.values, self.spec.datatype.element_size()) {
            (Values::Str(v), _) => v.iter().map(|s| 4 + s.len()).sum(),
            (_, Some(size)) => size * self.spec.element_count(),
            (_, None) => unreachable!("only BYTES has variable-size elements"),
        }
    }
}

/// Converts an `f32` to IEEE 754 half-precision bits, rounding to nearest
/// even, with overflow to infinity and gradual underflow to subnormals.
///
/// Written out rather than pulling in a crate: FP16 is only needed here, for
/// laying out request tensors.
pub fn f32_to_f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x007f_ffff;

    if exp == 0xff {
        // Infinity or NaN (keep NaN quiet and non-zero).
        return sign | 0x7c00 | if man != 0 { 0x0200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00; // overflow → infinity
    }
    if e <= 0 {
        if e < -10 {
            return sign; // too small even for a subnormal → ±0
        }
        // Subnormal: shift the mantissa (with its implicit 1) into place.
        let m = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let halfway = 1 << (shift - 1);
        let round = rem > halfway || (rem == halfway && (half & 1) == 1);
        return sign | (half + round as u32) as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    let round = rem > 0x1000 || (rem == 0x1000 && (half & 1) == 1);
    // A carry out of the mantissa correctly bumps the exponent (and may
    // reach infinity, which is the right answer).
    sign | (half + round as u32) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn spec(s: &str) -> TensorSpec {
        s.parse().unwrap()
    }

    #[test]
    fn f16_conversion_known_values() {
        assert_eq!(f32_to_f16_bits(0.0), 0x0000);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(0.5), 0x3800);
        assert_eq!(f32_to_f16_bits(-2.0), 0xc000);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(1e6), 0x7c00);
        assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16_bits(1.0 / 1024.0), 0x1400);
        // Smallest subnormal, 2^-24.
        assert_eq!(f32_to_f16_bits(5.960_464_5e-8), 0x0001);
        // 1 + 2^-11 is exactly halfway between 1 and the next half; ties to even.
        assert_eq!(f32_to_f16_bits(1.0 + 1.0 / 2048.0), 0x3c00);
        assert!(f32_to_f16_bits(f32::NAN) & 0x7c00 == 0x7c00);
        assert!(f32_to_f16_bits(f32::NAN) & 0x03ff != 0);
    }

    #[test]
    fn generates_right_element_counts_for_every_type() {
        let mut rng = SmallRng::seed_from_u64(7);
        for dt in DataType::ALL {
            let s = TensorSpec {
                name: "X".into(),
                datatype: dt,
                shape: vec![2, 3],
            };
            for mode in [DataMode::Random, DataMode::Fixed] {
                let t = Tensor::generate(&s, mode, &mut rng);
                let mut raw = Vec::new();
                t.write_raw(&mut raw);
                assert_eq!(raw.len(), t.raw_len(), "{dt} {mode:?}");
                if let Some(size) = dt.element_size() {
                    assert_eq!(raw.len(), 6 * size, "{dt}");
                }
            }
        }
    }

    #[test]
    fn fixed_data_is_deterministic() {
        let mut a = SmallRng::seed_from_u64(1);
        let mut b = SmallRng::seed_from_u64(2);
        let s = spec("X:INT32:20");
        let t1 = Tensor::generate(&s, DataMode::Fixed, &mut a);
        let t2 = Tensor::generate(&s, DataMode::Fixed, &mut b);
        assert_eq!(t1, t2);
        assert_eq!(t1.values, Values::Int((0..20).map(|i| i % 16).collect()));
    }

    #[test]
    fn random_values_stay_in_safe_ranges() {
        let mut rng = SmallRng::seed_from_u64(3);
        let Values::Int(v) =
            Tensor::generate(&spec("X:INT8:1000"), DataMode::Random, &mut rng).values
        else {
            panic!()
        };
        assert!(v.iter().all(|x| (-100..=100).contains(x)));
        let Values::F32(v) =
            Tensor::generate(&spec("X:FP16:1000"), DataMode::Random, &mut rng).values
        else {
            panic!()
        };
        // Exactly representable in FP16: converting to bits and back is lossless.
        assert!(
            v.iter()
                .all(|x| (0.0..1.0).contains(x) && (x * 1024.0).fract() == 0.0)
        );
    }

    #[test]
    fn raw_layout_is_little_endian() {
        let t = Tensor {
            spec: spec("X:INT16:2"),
            values: Values::Int(vec![1, -2]),
        };
        let mut raw = Vec::new();
        t.write_raw(&mut raw);
        assert_eq!(raw, vec![0x01, 0x00, 0xfe, 0xff]);

        let t = Tensor {
            spec: spec("X:FP16:2"),
            values: Values::F32(vec![1.0, 0.5]),
        };
        let mut raw = Vec::new();
        t.write_raw(&mut raw);
        assert_eq!(raw, vec![0x00, 0x3c, 0x00, 0x38]);

        let t = Tensor {
            spec: spec("X:BOOL:3"),
            values: Values::Bool(vec![true, false, true]),
        };
        let mut raw = Vec::new();
        t.write_raw(&mut raw);
        assert_eq!(raw, vec![1, 0, 1]);
    }

    #[test]
    fn bytes_elements_have_le_length_prefixes() {
        let t = Tensor {
            spec: spec("X:BYTES:2"),
            values: Values::Str(vec!["abc".into(), "".into()]),
        };
        let mut raw = Vec::new();
        t.write_raw(&mut raw);
        assert_eq!(raw, vec![3, 0, 0, 0, b'a', b'b', b'c', 0, 0, 0, 0]);
        assert_eq!(t.raw_len(), 11);
    }
}
