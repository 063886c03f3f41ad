//! The checker: one protocol-neutral request against one model signature, in the order and
//! with the words of Triton's own checks (`InferenceRequest::Normalize` and
//! `ValidateRequestInputs` in Triton 2.51), so the first problem infergate names is the one
//! Triton would have named.
//!
//! The order: outputs exist (in name order: Triton keeps them in a `std::set`); the input
//! count; batch sizes; each input's datatype and shape; each input's data size (BYTES: the
//! length prefixes). Inputs are walked in Triton's own iteration order (`triton_order`).
//! Last comes one rule Triton lacks: a required input left out while an optional one keeps
//! the count in range (Triton hands such a request to the model without the tensor).

use super::datatype::{DataType, protocol_string};
use super::request::{
    InferRequest, InputTensor, LogPrefix, Reason, Rejection, TensorData, dims_to_string,
};
use super::signature::{InputSpec, Signature};
use super::triton_order::iteration_order;
use foldhash::{HashSet, HashSetExt};

const BATCH_NOTE: &str = "NOTE: Setting a non-zero max_batch_size in the model config requires \
a batch dimension to be prepended to each input shape. If you want to specify the full shape \
including the batch dim in your input dims config, try setting max_batch_size to zero. See the \
model configuration docs for more info on max_batch_size.";

/// Checks `request` against `signature`; the first problem found is the refusal. Each step is
/// one of Triton's, in Triton's order.
pub fn check(request: &InferRequest, signature: &Signature) -> Result<(), Rejection> {
    let log = request.log_prefix();
    distinct_inputs(request, log)?;
    known_outputs(request, signature)?;
    // Which input Triton names first depends on the order it walks them in; whether the
    // request passes does not. So a request is walked in its own order, and only one that
    // fails is walked again in Triton's (`iteration_order`, a hash table's worth of work).
    let count = request.inputs.len();
    if count <= REQUEST_ORDER.len()
        && walk_inputs(request, signature, &REQUEST_ORDER[..count]).is_ok()
    {
        return Ok(());
    }
    let order = iteration_order(
        &request
            .inputs
            .iter()
            .map(|i| i.name.as_bytes())
            .collect::<Vec<_>>(),
    );
    walk_inputs(request, signature, &order)
}

/// `0, 1, 2, ...`: the inputs of a request in the order it lists them.
const REQUEST_ORDER: [usize; 64] = {
    let mut order = [0; 64];
    let mut i = 0;
    while i < order.len() {
        order[i] = i;
        i += 1;
    }
    order
};

/// The input count, batch sizes, each input's datatype and shape, and each input's data,
/// with the inputs walked in `order`; last, a required input left out.
fn walk_inputs(
    request: &InferRequest,
    signature: &Signature,
    order: &[usize],
) -> Result<(), Rejection> {
    let log = request.log_prefix();
    let total = signature.inputs.len();
    let required = signature.inputs.iter().filter(|i| !i.optional).count();
    let count = request.inputs.len();
    if count > total || count < required {
        let reason = if count > total {
            Reason::UnknownInput
        } else {
            Reason::MissingInput
        };
        return Err(count_error(request, signature, order, log, reason));
    }
    let walk = Walk {
        request,
        signature,
        order,
        log,
        model: signature.name.as_str(),
        batched: signature.max_batch_size > 0,
    };
    let batch = walk.batch_size()?;
    let specs = walk.datatypes_and_shapes()?;
    walk.data_sizes(&specs, batch)?;
    // The inputs are distinct and each is the model's: a required one is left out when
    // fewer of them name a required input than the model has.
    let required_given = specs.iter().flatten().filter(|spec| !spec.optional).count();
    if required_given < required {
        return Err(count_error(
            request,
            signature,
            order,
            log,
            Reason::MissingInput,
        ));
    }
    Ok(())
}

/// Refuses a request that names an input twice (the first input whose name came before).
/// A few inputs are compared pair by pair, more through a set.
fn distinct_inputs(request: &InferRequest, log: LogPrefix<'_>) -> Result<(), Rejection> {
    let inputs = &request.inputs;
    let repeated = if inputs.len() <= 16 {
        (1..inputs.len())
            .find(|&i| {
                inputs[..i]
                    .iter()
                    .any(|earlier| earlier.name == inputs[i].name)
            })
            .map(|i| &inputs[i])
    } else {
        let mut names = HashSet::with_capacity(inputs.len());
        inputs.iter().find(|input| !names.insert(&*input.name))
    };
    match repeated {
        None => Ok(()),
        Some(input) => Err(Rejection::new(
            Reason::DuplicateInput,
            format!("{log}input '{}' already exists in request", input.name),
        )),
    }
}

/// Every output asked for is the model's, looked at in name order (Triton's `std::set`).
fn known_outputs(request: &InferRequest, signature: &Signature) -> Result<(), Rejection> {
    let mut outputs: Vec<&str> = request.outputs.iter().map(|o| &**o).collect();
    outputs.sort_unstable();
    outputs.dedup();
    if let Some(unknown) = outputs.iter().find(|o| !signature.has_output(o)) {
        return Err(Rejection::new(
            Reason::UnknownOutput,
            format!(
                "unexpected inference output '{unknown}' for model '{}'",
                signature.name
            ),
        ));
    }
    Ok(())
}

/// The inputs of a request whose count is in range, walked in Triton's iteration order
/// (`order`) against the model's signature.
struct Walk<'r> {
    /// The request.
    request: &'r InferRequest<'r>,
    /// The model's signature.
    signature: &'r Signature,
    /// Indexes into `request.inputs`, in Triton's order.
    order: &'r [usize],
    /// The request id prefix of Triton's messages.
    log: LogPrefix<'r>,
    /// The model's name, for Triton's messages.
    model: &'r str,
    /// The model batches: every (non shape-tensor) input leads with the batch dimension.
    batched: bool,
}

impl<'r> Walk<'r> {
    /// The spec of `input`, or Triton's refusal of an input the model does not have.
    fn spec(&self, input: &InputTensor) -> Result<&'r InputSpec, Rejection> {
        self.signature.input(&input.name).ok_or_else(|| {
            Rejection::new(
                Reason::UnknownInput,
                format!(
                    "unexpected inference input '{}' for model '{}'",
                    input.name, self.model
                ),
            )
        })
    }

    /// The request's batch size (0 for a model that does not batch): every input's first
    /// dimension, the same for all, at most `max_batch_size`.
    fn batch_size(&self) -> Result<u32, Rejection> {
        let (log, model) = (self.log, self.model);
        // Triton's `batch_size_` is a uint32 taken from the first dimension.
        let mut batch: u32 = 0;
        if self.batched {
            for &i in self.order {
                let input = &self.request.inputs[i];
                if self.spec(input)?.is_shape_tensor {
                    continue;
                }
                let Some(&first) = input.shape.first() else {
                    return Err(Rejection::new(
                        Reason::Shape,
                        format!(
                            "{log}input '{}' has no shape but model requires batch dimension for '{model}'",
                            input.name
                        ),
                    ));
                };
                if batch == 0 {
                    batch = first as u32;
                } else if first != i64::from(batch) {
                    return Err(Rejection::new(
                        Reason::BatchSize,
                        format!(
                            "{log}input '{}' batch size does not match other inputs for '{model}'",
                            input.name
                        ),
                    ));
                }
            }
        }
        if (batch as i32) > self.signature.max_batch_size {
            return Err(Rejection::new(
                Reason::BatchSize,
                format!(
                    "{log}inference request batch-size must be <= {} for '{model}'",
                    self.signature.max_batch_size
                ),
            ));
        }
        Ok(batch)
    }

    /// Each input's datatype and shape against its spec; the specs, by request index.
    fn datatypes_and_shapes(&self) -> Result<Vec<Option<&'r InputSpec>>, Rejection> {
        let (log, model) = (self.log, self.model);
        let mut specs: Vec<Option<&InputSpec>> = vec![None; self.request.inputs.len()];
        for &i in self.order {
            let input = &self.request.inputs[i];
            let spec = self.spec(input)?;
            if DataType::from_protocol(&input.datatype) != Some(spec.datatype) {
                return Err(Rejection::new(
                    Reason::Datatype,
                    format!(
                        "{log}inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                        input.name,
                        protocol_string(&input.datatype),
                        spec.datatype
                    ),
                ));
            }
            check_shape(input, spec, self.batched, log, model)?;
            specs[i] = Some(spec);
        }
        Ok(specs)
    }

    /// Each input's data against its shape: BYTES by its length prefixes, fixed-size
    /// datatypes by their byte size (which Triton leaves to TensorRT for its models).
    fn data_sizes(&self, specs: &[Option<&InputSpec>], batch: u32) -> Result<(), Rejection> {
        let skip_fixed_sizes = self.signature.platform.starts_with("tensorrt_");
        for &i in self.order {
            let input = &self.request.inputs[i];
            let spec = specs[i].expect("every input was checked");
            if spec.is_shape_tensor {
                continue;
            }
            let dims = if self.batched {
                &input.shape[1..]
            } else {
                &input.shape[..]
            };
            let mut elements = dims.iter().fold(1i64, |n, &d| n.wrapping_mul(d));
            if self.batched && batch != 0 {
                elements = elements.wrapping_mul(i64::from(batch));
            }
            match spec.datatype.size() {
                None => check_strings(input, elements, self.log, self.model)?,
                Some(_) if skip_fixed_sizes => {}
                Some(size) => self.byte_size(input, elements.wrapping_mul(size as i64))?,
            }
        }
        Ok(())
    }

    /// A fixed-size input's data holds `expected` bytes.
    fn byte_size(&self, input: &InputTensor, expected: i64) -> Result<(), Rejection> {
        let actual = input.data.byte_size();
        if i64::try_from(actual) == Ok(expected) {
            return Ok(());
        }
        let reason = match input.data {
            TensorData::Elements { .. } => Reason::DataLength,
            _ => Reason::BinarySize,
        };
        Err(Rejection::new(
            reason,
            format!(
                "{}input byte size mismatch for input '{}' for model '{}'. Expected {expected}, got {actual}",
                self.log, input.name, self.model
            ),
        ))
    }
}

/// A raw binary request (no JSON header): `size` bytes for the model's only input, whose
/// shape Triton deduces (batch 1, one variable dimension from the size). Triton keeps such
/// an input under the name `raw_input`, which its messages show.
pub fn check_raw(size: u64, signature: &Signature) -> Result<(), Rejection> {
    let log = "[request id: <id_unknown>] ";
    let model = signature.name.as_str();
    let [spec] = signature.inputs.as_slice() else {
        return Err(Rejection::new(
            Reason::MalformedRequest,
            format!(
                "{log}Raw request must only have 1 input (found 1) to be deduced but got {} inputs in '{model}' model configuration",
                signature.inputs.len()
            ),
        ));
    };
    let variable = spec.dims.iter().filter(|&&d| d == -1).count();
    let fixed = spec
        .dims
        .iter()
        .filter(|&&d| d != -1)
        .fold(1i64, |n, &d| n.wrapping_mul(d));
    if variable > 1 {
        return Err(Rejection::new(
            Reason::Shape,
            format!(
                "{log}The shape of the raw input '{}' can not be deduced because there are more than one variable-sized dimension",
                spec.name
            ),
        ));
    }
    let Some(element_size) = spec.datatype.size() else {
        if variable == 0 && fixed == 1 {
            // Triton prepends the length: one string, always well-formed.
            return Ok(());
        }
        return Err(Rejection::new(
            Reason::Shape,
            format!(
                "{log}For BYTE datatype raw input '{}', the model must have input shape [1]",
                spec.name
            ),
        ));
    };
    let mut elements = fixed;
    if variable == 1 {
        if fixed <= 0 {
            // Triton would divide by this; nothing to compare against.
            return Ok(());
        }
        elements = fixed.wrapping_mul(size as i64 / fixed / element_size as i64);
    }
    let expected = elements.wrapping_mul(element_size as i64);
    if signature.platform.starts_with("tensorrt_") || i64::try_from(size) == Ok(expected) {
        return Ok(());
    }
    Err(Rejection::new(
        Reason::BinarySize,
        format!(
            "{log}input byte size mismatch for input 'raw_input' for model '{model}'. Expected {expected}, got {size}"
        ),
    ))
}

/// Triton's message for a request with the wrong number of inputs.
fn count_error(
    request: &InferRequest,
    signature: &Signature,
    order: &[usize],
    log: LogPrefix<'_>,
    reason: Reason,
) -> Rejection {
    let model = &signature.name;
    let total = signature.inputs.len();
    let required = signature.inputs.iter().filter(|i| !i.optional).count();
    let count = request.inputs.len();
    let got = if order.is_empty() {
        "[]".to_string()
    } else {
        let names: Vec<String> = order
            .iter()
            .map(|&i| format!("'{}'", request.inputs[i].name))
            .collect();
        format!("[{}]", names.join(","))
    };
    let missing: Vec<String> = signature
        .inputs
        .iter()
        .filter(|spec| !spec.optional && !request.inputs.iter().any(|i| i.name == spec.name))
        .map(|spec| format!("'{}'", spec.name))
        .collect();
    // Triton builds "[" + "'a'," ... and drops the last character: with nothing missing it
    // drops the "[" itself. Kept as Triton writes it.
    let missing = if missing.is_empty() {
        "]".to_string()
    } else {
        format!("[{}]", missing.join(","))
    };
    let expected = if total == required {
        format!("expected {total} inputs")
    } else {
        format!("expected number of inputs between {required} and {total}")
    };
    Rejection::new(
        reason,
        format!(
            "{log}{expected} but got {count} inputs for model '{model}'. Got input(s) {got}, but missing required input(s) {missing}. Please provide all required input(s)."
        ),
    )
}

fn check_shape(
    input: &InputTensor,
    spec: &InputSpec,
    batched: bool,
    log: LogPrefix<'_>,
    model: &str,
) -> Result<(), Rejection> {
    let dims = if batched && !spec.is_shape_tensor {
        &input.shape[1..]
    } else {
        &input.shape[..]
    };
    let mut matches = dims.len() == spec.dims.len();
    if matches {
        for (&dim, &expected) in dims.iter().zip(&spec.dims) {
            if dim == -1 {
                return Err(Rejection::new(
                    Reason::Shape,
                    format!(
                        "{log}All input dimensions should be specified for input '{}' for model '{model}', got {}",
                        input.name,
                        dims_to_string(&input.shape)
                    ),
                ));
            }
            if expected != -1 && expected != dim {
                matches = false;
                break;
            }
        }
    }
    if matches {
        return Ok(());
    }
    let mut full = Vec::with_capacity(spec.dims.len() + 1);
    if batched {
        full.push(-1);
    }
    full.extend_from_slice(&spec.dims);
    Err(Rejection::new(
        Reason::Shape,
        format!(
            "{log}unexpected shape for input '{}' for model '{model}'. Expected {}, got {}. {}",
            input.name,
            dims_to_string(&full),
            dims_to_string(&input.shape),
            if batched { BATCH_NOTE } else { "" }
        ),
    ))
}

/// BYTES data: exactly `elements` strings, each a 4-byte little-endian length and its bytes.
/// Walked the way Triton walks it, so the same problem is named: a length prefix cut short,
/// then one string too many (as soon as it starts), then too few, then a string cut short.
fn check_strings(
    input: &InputTensor,
    elements: i64,
    log: LogPrefix<'_>,
    model: &str,
) -> Result<(), Rejection> {
    let name = &input.name;
    let too_many = |checked: i64| {
        Rejection::new(
            Reason::BytesEncoding,
            format!(
                "{log}unexpected number of string elements {checked} for inference input '{name}' for model '{model}', expecting {elements}"
            ),
        )
    };
    let too_few = |checked: i64| {
        Rejection::new(
            Reason::BytesEncoding,
            format!(
                "{log}expected {elements} string elements for inference input '{name}' for model '{model}', got {checked}"
            ),
        )
    };
    match &input.data {
        TensorData::Arriving { .. } => {
            debug_assert!(false, "http::parse asks for the whole body for BYTES");
            Ok(())
        }
        TensorData::Elements { count, .. } => {
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            if count > elements {
                Err(too_many(elements.saturating_add(1)))
            } else if count < elements {
                Err(too_few(count))
            } else {
                Ok(())
            }
        }
        TensorData::Raw(bytes) => {
            let mut rest: &[u8] = bytes;
            let mut checked = 0i64;
            let mut cut_short: Option<(u32, usize)> = None;
            while !rest.is_empty() {
                let Some((prefix, after)) = rest.split_first_chunk::<4>() else {
                    return Err(Rejection::new(
                        Reason::BytesEncoding,
                        format!(
                            "{log}incomplete string length indicator for inference input '{name}' for model '{model}', expecting 4 bytes but only {} bytes available. Please make sure the string length indicator is in one buffer.",
                            rest.len()
                        ),
                    ));
                };
                let length = u32::from_le_bytes(*prefix);
                checked += 1;
                if checked > elements {
                    return Err(too_many(checked));
                }
                if after.len() >= length as usize {
                    rest = &after[length as usize..];
                } else {
                    cut_short = Some((length, after.len()));
                    rest = &[];
                }
            }
            if checked < elements {
                return Err(too_few(checked));
            }
            if let Some((length, available)) = cut_short {
                return Err(Rejection::new(
                    Reason::BytesEncoding,
                    format!(
                        "incomplete string data for inference input '{name}', expecting string of length {length} but only {available} bytes available"
                    ),
                ));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn spec(name: &str, datatype: DataType, dims: &[i64]) -> InputSpec {
        InputSpec {
            name: name.into(),
            datatype,
            dims: dims.to_vec(),
            optional: false,
            allow_ragged_batch: false,
            is_shape_tensor: false,
        }
    }

    fn model(
        name: &str,
        max_batch_size: i32,
        inputs: Vec<InputSpec>,
        outputs: &[&str],
    ) -> Signature {
        Signature {
            name: name.into(),
            platform: "python".into(),
            max_batch_size,
            instances: 1,
            decoupled: false,
            inputs,
            outputs: outputs.iter().map(|o| o.to_string()).collect(),
        }
    }

    fn add_sub() -> Signature {
        model(
            "add_sub",
            0,
            vec![
                spec("INPUT0", DataType::Fp32, &[4]),
                spec("INPUT1", DataType::Fp32, &[4]),
            ],
            &["OUTPUT0", "OUTPUT1"],
        )
    }

    fn json(name: &str, datatype: &str, shape: &[i64]) -> InputTensor<'static> {
        let count = shape.iter().product::<i64>() as u64;
        InputTensor {
            name: name.to_owned().into(),
            datatype: datatype.to_owned().into(),
            shape: shape.to_vec().into(),
            data: TensorData::Elements {
                count,
                byte_size: count.wrapping_mul(
                    DataType::from_protocol(datatype)
                        .and_then(DataType::size)
                        .unwrap_or(4),
                ),
            },
        }
    }

    fn raw(name: &str, datatype: &str, shape: &[i64], bytes: &[u8]) -> InputTensor<'static> {
        InputTensor {
            name: name.to_owned().into(),
            datatype: datatype.to_owned().into(),
            shape: shape.to_vec().into(),
            data: TensorData::Raw(Bytes::copy_from_slice(bytes)),
        }
    }

    fn request(inputs: Vec<InputTensor<'static>>) -> InferRequest<'static> {
        InferRequest {
            inputs,
            ..Default::default()
        }
    }

    fn refused(request: &InferRequest, signature: &Signature) -> (Reason, String) {
        let r = check(request, signature).unwrap_err();
        (r.reason, r.message)
    }

    fn strings(items: &[&[u8]]) -> Vec<u8> {
        items
            .iter()
            .flat_map(|s| {
                (s.len() as u32)
                    .to_le_bytes()
                    .into_iter()
                    .chain(s.iter().copied())
            })
            .collect()
    }

    /// Every message below is what Triton 2.51 answered to the same request. Long: one list
    /// of measured cases, each an assertion, reads better whole than split.
    #[test]
    fn names_problems_in_tritons_words() {
        let m = add_sub();
        assert!(
            check(
                &request(vec![
                    json("INPUT0", "FP32", &[4]),
                    json("INPUT1", "FP32", &[4])
                ]),
                &m
            )
            .is_ok()
        );
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[4]), json("INPUT1", "FP32", &[3])]), &m),
            (Reason::Shape, "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [4], got [3]. ".into())
        );
        let mut with_id = request(vec![
            json("INPUT0", "INT32", &[4]),
            json("INPUT1", "FP32", &[4]),
        ]);
        with_id.id = "abc".into();
        assert_eq!(
            refused(&with_id, &m),
            (Reason::Datatype, "[request id: abc] inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'".into())
        );
        assert_eq!(
            refused(
                &request(vec![
                    raw("INPUT0", "FLOAT", &[4], &[0; 16]),
                    json("INPUT1", "FP32", &[4])
                ]),
                &m
            )
            .1,
            "[request id: <id_unknown>] inference input 'INPUT0' data-type is '<invalid>', but model 'add_sub' expects 'FP32'"
        );
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[4])]), &m),
            (Reason::MissingInput, "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s).".into())
        );
        assert_eq!(
            refused(&request(vec![]), &m).1,
            "[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) [], but missing required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."
        );
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[4]), json("INPUT1", "FP32", &[4]), json("NOPE", "FP32", &[4])]), &m),
            (Reason::UnknownInput, "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['NOPE','INPUT1','INPUT0'], but missing required input(s) ]. Please provide all required input(s).".into())
        );
        assert_eq!(
            refused(
                &request(vec![
                    json("INPUT0", "FP32", &[4]),
                    json("NOPE", "FP32", &[4])
                ]),
                &m
            ),
            (
                Reason::UnknownInput,
                "unexpected inference input 'NOPE' for model 'add_sub'".into()
            )
        );
        assert_eq!(
            refused(
                &request(vec![
                    json("INPUT0", "FP32", &[4]),
                    json("INPUT0", "FP32", &[4])
                ]),
                &m
            ),
            (
                Reason::DuplicateInput,
                "[request id: <id_unknown>] input 'INPUT0' already exists in request".into()
            )
        );
        let mut outputs = request(vec![
            json("INPUT0", "FP32", &[4]),
            json("INPUT1", "FP32", &[4]),
        ]);
        outputs.outputs = vec!["ZZZ".into(), "OUTPUT0".into(), "AAA".into()];
        assert_eq!(
            refused(&outputs, &m),
            (
                Reason::UnknownOutput,
                "unexpected inference output 'AAA' for model 'add_sub'".into()
            )
        );
        // Two bad shapes: Triton names INPUT1 (its map iterates INPUT1 first).
        assert!(
            refused(
                &request(vec![
                    json("INPUT0", "FP32", &[3]),
                    json("INPUT1", "FP32", &[3])
                ]),
                &m
            )
            .1
            .contains("'INPUT1'")
        );
        assert_eq!(
            refused(&request(vec![raw("INPUT0", "FP32", &[4], &[0; 12]), json("INPUT1", "FP32", &[4])]), &m),
            (Reason::BinarySize, "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 12".into())
        );
    }

    #[test]
    fn batched_models_carry_a_batch_dimension() {
        let m = model(
            "batched_double",
            8,
            vec![spec("INPUT0", DataType::Fp32, &[4])],
            &["OUTPUT0"],
        );
        assert!(check(&request(vec![json("INPUT0", "FP32", &[3, 4])]), &m).is_ok());
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[4])]), &m),
            (
                Reason::Shape,
                format!(
                    "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'batched_double'. Expected [-1,4], got [4]. {BATCH_NOTE}"
                )
            )
        );
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[9, 4])]), &m),
            (Reason::BatchSize, "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'batched_double'".into())
        );
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[])]), &m),
            (Reason::Shape, "[request id: <id_unknown>] input 'INPUT0' has no shape but model requires batch dimension for 'batched_double'".into())
        );
        // A batch of 0 is data for one item, as Triton has it: 16 bytes pass, 0 do not.
        assert!(check(&request(vec![raw("INPUT0", "FP32", &[0, 4], &[0; 16])]), &m).is_ok());
        assert_eq!(
            refused(&request(vec![raw("INPUT0", "FP32", &[0, 4], &[])]), &m).1,
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'batched_double'. Expected 16, got 0"
        );

        let var = model(
            "batched_var",
            4,
            vec![
                spec("INPUT0", DataType::Fp32, &[-1, 2]),
                spec("INPUT1", DataType::Int32, &[3]),
            ],
            &["OUTPUT0"],
        );
        assert!(
            check(
                &request(vec![
                    json("INPUT0", "FP32", &[2, 3, 2]),
                    json("INPUT1", "INT32", &[2, 3])
                ]),
                &var
            )
            .is_ok()
        );
        assert_eq!(
            refused(&request(vec![json("INPUT0", "FP32", &[2, 3, 2]), json("INPUT1", "INT32", &[1, 3])]), &var),
            (Reason::BatchSize, "[request id: <id_unknown>] input 'INPUT0' batch size does not match other inputs for 'batched_var'".into())
        );
        assert_eq!(
            refused(
                &request(vec![
                    json("INPUT1", "INT32", &[1, 3]),
                    json("INPUT0", "FP32", &[2, 3, 2])
                ]),
                &var
            )
            .1,
            "[request id: <id_unknown>] input 'INPUT1' batch size does not match other inputs for 'batched_var'"
        );
    }

    #[test]
    fn bytes_length_prefixes_are_walked_like_triton() {
        let m = model(
            "string_echo",
            0,
            vec![spec("INPUT0", DataType::Bytes, &[-1])],
            &["OUTPUT0"],
        );
        let one = |shape: i64, bytes: &[u8]| request(vec![raw("INPUT0", "BYTES", &[shape], bytes)]);
        let p = "[request id: <id_unknown>] ";
        assert!(check(&one(2, &strings(&[b"ab", b"cde"])), &m).is_ok());
        assert!(check(&one(0, &[]), &m).is_ok());
        assert_eq!(
            refused(&one(3, &strings(&[b"ab", b"cde"])), &m).1,
            format!(
                "{p}expected 3 string elements for inference input 'INPUT0' for model 'string_echo', got 2"
            )
        );
        assert_eq!(
            refused(&one(1, &strings(&[b"a", b"b", b"c"])), &m).1,
            format!(
                "{p}unexpected number of string elements 2 for inference input 'INPUT0' for model 'string_echo', expecting 1"
            )
        );
        let mut overrun = strings(&[b"ab"]);
        overrun.extend_from_slice(&100u32.to_le_bytes());
        overrun.extend_from_slice(b"cde");
        assert_eq!(
            refused(&one(2, &overrun), &m).1,
            "incomplete string data for inference input 'INPUT0', expecting string of length 100 but only 3 bytes available"
        );
        assert!(
            refused(&one(3, &overrun), &m)
                .1
                .contains("expected 3 string elements")
        );
        assert!(
            refused(&one(1, &overrun), &m)
                .1
                .contains("unexpected number of string elements 2")
        );
        let mut trailing = strings(&[b"ab", b"cde"]);
        trailing.extend_from_slice(b"zz");
        assert_eq!(
            refused(&one(2, &trailing), &m),
            (
                Reason::BytesEncoding,
                format!(
                    "{p}incomplete string length indicator for inference input 'INPUT0' for model 'string_echo', expecting 4 bytes but only 2 bytes available. Please make sure the string length indicator is in one buffer."
                )
            )
        );
        assert!(
            refused(&one(0, b"zz"), &m)
                .1
                .contains("incomplete string length indicator")
        );
        // JSON strings arrive counted.
        let counted = |shape: i64, count: u64| {
            request(vec![InputTensor {
                name: "INPUT0".into(),
                datatype: "BYTES".into(),
                shape: vec![shape].into(),
                data: TensorData::Elements {
                    count,
                    byte_size: count * 5,
                },
            }])
        };
        assert!(check(&counted(2, 2), &m).is_ok());
        assert!(
            refused(&counted(1, 3), &m)
                .1
                .contains("unexpected number of string elements 2 ")
        );
        assert!(
            refused(&counted(3, 2), &m)
                .1
                .contains("expected 3 string elements")
        );
    }

    #[test]
    fn optional_inputs_and_required_ones() {
        let mut optional = spec("INPUT1", DataType::Fp32, &[4]);
        optional.optional = true;
        let m = model(
            "optional_input",
            0,
            vec![spec("INPUT0", DataType::Fp32, &[4]), optional],
            &["OUTPUT0"],
        );
        assert!(check(&request(vec![json("INPUT0", "FP32", &[4])]), &m).is_ok());
        assert_eq!(
            refused(&request(vec![]), &m).1,
            "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 0 inputs for model 'optional_input'. Got input(s) [], but missing required input(s) ['INPUT0']. Please provide all required input(s)."
        );
        // Triton lets this through to the model, which gets no INPUT0; infergate refuses it.
        assert_eq!(
            refused(&request(vec![json("INPUT1", "FP32", &[4])]), &m),
            (Reason::MissingInput, "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 1 inputs for model 'optional_input'. Got input(s) ['INPUT1'], but missing required input(s) ['INPUT0']. Please provide all required input(s).".into())
        );
    }

    #[test]
    fn shape_tensors_and_unspecified_dimensions() {
        let mut shape = spec("SHAPE", DataType::Int32, &[2]);
        shape.is_shape_tensor = true;
        let m = model(
            "trt",
            8,
            vec![spec("DATA", DataType::Fp32, &[-1]), shape],
            &["OUT"],
        );
        // The shape tensor has no batch dimension and no say in the batch size.
        assert!(
            check(
                &request(vec![
                    json("DATA", "FP32", &[2, 5]),
                    json("SHAPE", "INT32", &[2])
                ]),
                &m
            )
            .is_ok()
        );
        assert!(
            refused(
                &request(vec![
                    json("DATA", "FP32", &[2, 5]),
                    json("SHAPE", "INT32", &[2, 2])
                ]),
                &m
            )
            .1
            .contains("unexpected shape for input 'SHAPE'")
        );
        // gRPC shapes are signed: -1 is "unspecified".
        let m = add_sub();
        assert_eq!(
            refused(
                &request(vec![
                    json("INPUT0", "FP32", &[-1]),
                    json("INPUT1", "FP32", &[4])
                ]),
                &m
            )
            .1,
            "[request id: <id_unknown>] All input dimensions should be specified for input 'INPUT0' for model 'add_sub', got [-1]"
        );
    }

    #[test]
    fn raw_requests_feed_the_only_input() {
        let p = "[request id: <id_unknown>] ";
        let batched = model(
            "batched_double",
            8,
            vec![spec("INPUT0", DataType::Fp32, &[4])],
            &["OUTPUT0"],
        );
        assert!(check_raw(16, &batched).is_ok());
        assert_eq!(
            check_raw(12, &batched).unwrap_err(),
            Rejection::new(
                Reason::BinarySize,
                format!(
                    "{p}input byte size mismatch for input 'raw_input' for model 'batched_double'. Expected 16, got 12"
                )
            )
        );
        assert_eq!(
            check_raw(16, &add_sub()).unwrap_err().message,
            format!(
                "{p}Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model configuration"
            )
        );
        let strings = model(
            "string_echo",
            0,
            vec![spec("INPUT0", DataType::Bytes, &[-1])],
            &["OUTPUT0"],
        );
        assert_eq!(
            check_raw(5, &strings).unwrap_err().message,
            format!("{p}For BYTE datatype raw input 'INPUT0', the model must have input shape [1]")
        );
        let one = model(
            "one",
            0,
            vec![spec("INPUT0", DataType::Bytes, &[1])],
            &["OUTPUT0"],
        );
        assert!(check_raw(5, &one).is_ok());
        let variable = model(
            "v",
            0,
            vec![spec("INPUT0", DataType::Fp32, &[-1, 2])],
            &["OUTPUT0"],
        );
        assert!(check_raw(24, &variable).is_ok());
        assert!(
            check_raw(20, &variable)
                .unwrap_err()
                .message
                .ends_with("Expected 16, got 20")
        );
        let two = model(
            "w",
            0,
            vec![spec("INPUT0", DataType::Fp32, &[-1, -1])],
            &["OUTPUT0"],
        );
        assert!(
            check_raw(16, &two)
                .unwrap_err()
                .message
                .contains("more than one variable-sized dimension")
        );
    }

    #[test]
    fn tensorrt_models_skip_the_byte_size_check_as_triton_does() {
        let mut m = add_sub();
        m.platform = "tensorrt_plan".into();
        assert!(
            check(
                &request(vec![
                    raw("INPUT0", "FP32", &[4], &[0; 8]),
                    json("INPUT1", "FP32", &[4])
                ]),
                &m
            )
            .is_ok()
        );
    }
}
