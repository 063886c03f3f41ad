//! Request validation against a real Triton: a differential corpus sent both directly to
//! Triton and through the gateway. Whatever Triton accepts, the gateway forwards and answers
//! the same bytes; whatever Triton refuses (400 or 500), the gateway refuses itself with
//! 400 and Triton's words, and Triton's own log (`--log-verbose=1` logs every request it
//! receives) proves the request never arrived. The corpus goes again written as clients
//! write JSON (`json.dumps` defaults, `indent=2`, random whitespace, `\u` escapes), with the
//! same agreement. Then the metric, the signature cache
//! (coalesced fetches, invalidation), validation turned off, and a signature that cannot be
//! fetched.

#[path = "support/reformat.rs"]
mod reformat;
mod support;

use axum::body::Bytes;
use infergate::config::{Config, Validation};
use infergate::internals::Backend;
use infergate::internals::ModelRef;
use infergate::internals::SignatureCache;
use reformat::{Style, reformat, styles};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions, copy_dir, model_repository};

const MODELS: [&str; 9] = [
    "add_sub",
    "add_sub_int",
    "string_echo",
    "batched_double",
    "batched_var",
    "ragged_sum",
    "optional_input",
    "typed_inputs",
    "reshaped",
];

/// One request of the corpus.
struct Case {
    name: &'static str,
    model: &'static str,
    body: Vec<u8>,
    /// `Inference-Header-Content-Length`, when sent.
    header_length: Option<String>,
    /// Set where the gateway's message is its own: Triton has none for the problem (its
    /// model fails instead). The text must appear in the gateway's message.
    own_message: Option<&'static str>,
}

impl Case {
    fn header_length(mut self, value: &str) -> Self {
        self.header_length = Some(value.to_string());
        self
    }

    fn own_message(mut self, expected: &'static str) -> Self {
        self.own_message = Some(expected);
        self
    }
}

fn case(name: &'static str, model: &'static str, body: Value) -> Case {
    bytes_case(name, model, body.to_string().into_bytes())
}

fn text_case(name: &'static str, model: &'static str, body: &str) -> Case {
    bytes_case(name, model, body.as_bytes().to_vec())
}

fn bytes_case(name: &'static str, model: &'static str, body: Vec<u8>) -> Case {
    Case {
        name,
        model,
        body,
        header_length: None,
        own_message: None,
    }
}

/// A binary-extension request: JSON header, then the tensors.
fn binary_case(name: &'static str, model: &'static str, header: Value, tensors: &[&[u8]]) -> Case {
    let header = header.to_string();
    let mut body = header.clone().into_bytes();
    for tensor in tensors {
        body.extend_from_slice(tensor);
    }
    bytes_case(name, model, body).header_length(&header.len().to_string())
}

fn input(name: &str, datatype: &str, shape: Value, data: Value) -> Value {
    json!({"name": name, "datatype": datatype, "shape": shape, "data": data})
}

fn binary_input(name: &str, datatype: &str, shape: Value, size: Value) -> Value {
    json!({"name": name, "datatype": datatype, "shape": shape,
           "parameters": {"binary_data_size": size}})
}

fn inputs(list: Vec<Value>) -> Value {
    json!({ "inputs": list })
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn strings(items: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    out
}

fn four() -> Value {
    json!([1.0, 2.0, 3.0, 4.0])
}

fn add_sub_ok() -> Vec<Value> {
    vec![
        input("INPUT0", "FP32", json!([4]), four()),
        input("INPUT1", "FP32", json!([4]), four()),
    ]
}

fn with_outputs(outputs: Value) -> Value {
    json!({"inputs": add_sub_ok(), "outputs": outputs})
}

/// add_sub with INPUT0's JSON text replaced, for bodies serde_json cannot write.
fn add_sub_text(input0: &str) -> String {
    format!(
        r#"{{"inputs":[{input0},{{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,2,3,4]}}]}}"#
    )
}

fn add_sub_data(data: &str) -> String {
    add_sub_text(&format!(
        r#"{{"name":"INPUT0","datatype":"FP32","shape":[4],"data":{data}}}"#
    ))
}

/// Every rule, valid and invalid, JSON and binary, batched and not, BYTES. Each was first
/// sent to Triton 2.51 by hand; the test replays them and compares.
fn corpus() -> Vec<Case> {
    let add = "add_sub";
    let f4 = f32s(&[1.0, 2.0, 3.0, 4.0]);
    let f3 = f32s(&[1.0, 2.0, 3.0]);
    let f5 = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0]);
    let two_binary = |a: Value, b: Value| inputs(vec![a, b]);
    let bin4 = |name: &str| binary_input(name, "FP32", json!([4]), json!(16));
    let mut c = vec![
        // JSON, names and datatypes.
        case("json_ok", add, inputs(add_sub_ok())),
        case("json_ok_with_id", add, json!({"id": "abc", "inputs": add_sub_ok()})),
        case("wrong_dim", add, inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("INPUT1", "FP32", json!([3]), json!([1, 2, 3]))])),
        case("wrong_dim_with_id", add, json!({"id": "req-7", "inputs": [input("INPUT0", "FP32", json!([4]), four()), input("INPUT1", "FP32", json!([3]), json!([1, 2, 3]))]})),
        case("wrong_rank", add, inputs(vec![input("INPUT0", "FP32", json!([1, 4]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        case("wrong_datatype", add, inputs(vec![input("INPUT0", "INT32", json!([4]), json!([1, 2, 3, 4])), input("INPUT1", "FP32", json!([4]), four())])),
        case("unknown_datatype", add, inputs(vec![input("INPUT0", "FLOAT", json!([4]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        case("lowercase_datatype", add, inputs(vec![input("INPUT0", "fp32", json!([4]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        case("missing_input", add, inputs(vec![input("INPUT0", "FP32", json!([4]), four())])),
        case("no_inputs", add, inputs(vec![])),
        case("extra_unknown_input", add, inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("INPUT1", "FP32", json!([4]), four()), input("NOPE", "FP32", json!([4]), four())])),
        case("unknown_instead_of_known", add, inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("NOPE", "FP32", json!([4]), four())])),
        case("duplicate_input", add, inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("INPUT0", "FP32", json!([4]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        case("duplicate_before_bad_data", add, inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("INPUT0", "FP32", json!([4]), json!([1]))])),
        case("bad_data_before_duplicate", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1])), input("INPUT0", "FP32", json!([4]), four())])),
        case("two_bad_shapes", add, inputs(vec![input("INPUT0", "FP32", json!([3]), json!([1, 2, 3])), input("INPUT1", "FP32", json!([3]), json!([1, 2, 3]))])),
        case("bad_shape_and_datatype", add, inputs(vec![input("INPUT0", "INT32", json!([3]), json!([1, 2, 3])), input("INPUT1", "FP32", json!([4]), four())])),
        case("bad_data_and_datatype", add, inputs(vec![input("INPUT0", "INT32", json!([4]), json!([1.5, 2, 3, 4])), input("INPUT1", "FP32", json!([4]), four())])),
        // JSON data against the shape and the datatype.
        case("data_short", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1, 2, 3])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_long", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1, 2, 3, 4, 5])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_nested", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([[1, 2], [3, 4]])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_nested_unevenly", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([[1, 2, 3], [4]])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_string_in_fp32", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1, 2, 3, "x"])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_bool_in_fp32", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1, 2, 3, true])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_null", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1, 2, 3, null])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_object", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!([1, 2, 3, {}])), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_not_array", add, inputs(vec![input("INPUT0", "FP32", json!([4]), json!(5)), input("INPUT1", "FP32", json!([4]), four())])),
        case("int_fraction", "add_sub_int", inputs(vec![input("INPUT0", "INT32", json!([4]), json!([1, 2, 3, 4.5])), input("INPUT1", "INT32", json!([4]), json!([1, 2, 3, 4]))])),
        case("int_written_as_float", "add_sub_int", inputs(vec![input("INPUT0", "INT32", json!([4]), json!([1, 2, 3, 4.0])), input("INPUT1", "INT32", json!([4]), json!([1, 2, 3, 4]))])),
        case("int32_out_of_range_wraps", "add_sub_int", inputs(vec![input("INPUT0", "INT32", json!([4]), json!([1, 2, 3, 2147483648u64])), input("INPUT1", "INT32", json!([4]), json!([1, 2, 3, 4]))])),
        case("int_past_int64", "add_sub_int", inputs(vec![input("INPUT0", "INT32", json!([4]), json!([1, 2, 3, 9223372036854775808u64])), input("INPUT1", "INT32", json!([4]), json!([1, 2, 3, 4]))])),
        case("negative_dim", add, inputs(vec![input("INPUT0", "FP32", json!([-4]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        case("wildcard_dim_in_request", add, inputs(vec![input("INPUT0", "FP32", json!([-1]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        case("fractional_dim", add, inputs(vec![input("INPUT0", "FP32", json!([4.0]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        // Request structure.
        case("no_data", add, inputs(vec![json!({"name": "INPUT0", "datatype": "FP32", "shape": [4]}), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_and_binary_size", add, inputs(vec![json!({"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": four(), "parameters": {"binary_data_size": 16}}), input("INPUT1", "FP32", json!([4]), four())])),
        case("data_and_shared_memory", add, inputs(vec![json!({"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": four(), "parameters": {"shared_memory_region": "r"}}), input("INPUT1", "FP32", json!([4]), four())])),
        // Triton looks the region up and finds none (the gateway takes no registrations);
        // the gateway says why instead.
        case("shared_memory_input", add, inputs(vec![json!({"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}), input("INPUT1", "FP32", json!([4]), four())]))
            .own_message("shared memory cannot cross a gateway"),
        case("shared_memory_output", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}])))
            .own_message("shared memory cannot cross a gateway"),
        case("no_name", add, inputs(vec![json!({"datatype": "FP32", "shape": [4], "data": four()}), input("INPUT1", "FP32", json!([4]), four())])),
        case("name_not_string", add, inputs(vec![json!({"name": 5, "datatype": "FP32", "shape": [4], "data": four()}), input("INPUT1", "FP32", json!([4]), four())])),
        case("no_shape", add, inputs(vec![json!({"name": "INPUT0", "datatype": "FP32", "data": four()}), input("INPUT1", "FP32", json!([4]), four())])),
        case("shape_not_array", add, inputs(vec![json!({"name": "INPUT0", "datatype": "FP32", "shape": 4, "data": four()}), input("INPUT1", "FP32", json!([4]), four())])),
        case("no_datatype", add, inputs(vec![json!({"name": "INPUT0", "shape": [4], "data": four()}), input("INPUT1", "FP32", json!([4]), four())])),
        case("input_not_object", add, inputs(vec![json!(5), input("INPUT1", "FP32", json!([4]), four())])),
        case("no_inputs_member", add, json!({"outputs": []})),
        case("inputs_not_array", add, json!({"inputs": {}})),
        case("root_is_array", add, json!([1])),
        case("id_not_string", add, json!({"id": 5, "inputs": add_sub_ok()})),
        case("id_null", add, json!({"id": null, "inputs": add_sub_ok()})),
        case("unknown_members_ignored", add, json!({"foo": 1, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": four(), "extra": {"a": [1]}, "parameters": 5}, input("INPUT1", "FP32", json!([4]), four())]})),
        // Parameters.
        case("parameters_ok", add, json!({"parameters": {"priority": 0, "foo": "bar", "sequence_id": 0, "x": 1.5, "binary_data_output": false}, "inputs": add_sub_ok()})),
        case("parameters_not_object", add, json!({"parameters": 5, "inputs": add_sub_ok()})),
        case("priority_negative", add, json!({"parameters": {"priority": -1}, "inputs": add_sub_ok()})),
        case("timeout_string", add, json!({"parameters": {"timeout": "1"}, "inputs": add_sub_ok()})),
        case("sequence_start_int", add, json!({"parameters": {"sequence_start": 1}, "inputs": add_sub_ok()})),
        case("sequence_id_float", add, json!({"parameters": {"sequence_id": 1.5}, "inputs": add_sub_ok()})),
        case("parameter_object", add, json!({"parameters": {"x": {"a": 1}}, "inputs": add_sub_ok()})),
        case("parameter_null", add, json!({"parameters": {"x": null}, "inputs": add_sub_ok()})),
        case("parameter_null_then_priority", add, json!({"parameters": {"x": null, "priority": "a"}, "inputs": add_sub_ok()})),
        case("priority_then_parameter_null", add, json!({"parameters": {"priority": "a", "x": null}, "inputs": add_sub_ok()})),
        case("binary_data_output_string", add, json!({"parameters": {"binary_data_output": "x"}, "inputs": add_sub_ok()})),
        // Outputs.
        case("unknown_output", add, with_outputs(json!([{"name": "NOPE"}]))),
        case("unknown_outputs_named_in_order", add, with_outputs(json!([{"name": "ZZZ"}, {"name": "AAA"}]))),
        case("unknown_output_before_missing_input", add, json!({"inputs": [input("INPUT0", "FP32", json!([4]), four())], "outputs": [{"name": "X"}]})),
        case("binary_output", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"binary_data": true}}]))),
        case("binary_output_not_bool", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]))),
        case("classification", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"classification": 2}}]))),
        case("classification_negative", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"classification": -1}}]))),
        case("classification_string", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"classification": "2"}}]))),
        case("classification_and_shared_memory", add, with_outputs(json!([{"name": "OUTPUT0", "parameters": {"classification": 2, "shared_memory_region": "x"}}]))),
        case("output_without_name", add, with_outputs(json!([{"parameters": {}}]))),
        case("output_twice", add, with_outputs(json!([{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]))),
        case("outputs_not_array", add, with_outputs(json!({}))),
        case("outputs_empty", add, with_outputs(json!([]))),
        case("bad_output_parameter_before_bad_shape", add, json!({"inputs": [input("INPUT0", "FP32", json!([3]), json!([1, 2, 3])), input("INPUT1", "FP32", json!([4]), four())], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]})),
        // JSON text as RapidJSON reads it.
        text_case("first_of_repeated_members", add, r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[3],"shape":[4],"data":[1,2,3,4]},{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,2,3,4]}]}"#),
        text_case("first_of_repeated_inputs", add, r#"{"inputs":[],"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]}]}"#),
        text_case("nul_ends_a_name", add, &add_sub_text(r#"{"name":"INPUT0\u0000x","datatype":"FP32","shape":[4],"data":[1,2,3,4]}"#)),
        text_case("nul_ends_a_datatype", add, &add_sub_text(r#"{"name":"INPUT0","datatype":"FP32\u0000x","shape":[4],"data":[1,2,3,4]}"#)),
        text_case("nul_ends_the_id", add, r#"{"id":"ab\u0000cd","inputs":[]}"#),
        text_case("nan", add, &add_sub_data("[1,2,3,NaN]")),
        text_case("infinities", add, &add_sub_data("[Inf,-Infinity,3,Infinity]")),
        text_case("integer_past_uint64", add, &add_sub_data("[1,2,3,123456789012345678901234567890]")),
        text_case("number_too_big", add, &add_sub_data("[1,2,3,1e400]")),
        text_case("lowercase_nan", add, &add_sub_data("[1,2,3,nan]")),
        text_case("leading_zero", add, &add_sub_data("[1,2,3,04]")),
        text_case("missing_fraction", add, &add_sub_data("[1,2,3,4.]")),
        text_case("missing_exponent", add, &add_sub_data("[1,2,3,4e]")),
        text_case("byte_order_mark", add, &format!("\u{feff}{}", add_sub_data("[1,2,3,4]"))),
        text_case("space_after_a_comma_in_data", add, r#"{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1, 2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}"#),
        text_case("whitespace_around", add, &format!(" \t\r\n{} \n", add_sub_data("[1,2,3,4]"))),
        text_case("trailing_comma", add, &add_sub_data("[1,2,3,4,]")),
        text_case("comment", add, &format!("{}/*c*/", add_sub_data("[1,2,3,4]"))),
        text_case("bad_escape", add, r#"{"id":"a\qb","inputs":[]}"#),
        text_case("short_unicode_escape", add, r#"{"id":"a\u12","inputs":[]}"#),
        text_case("lone_low_surrogate", add, r#"{"id":"a\udc00b","inputs":[]}"#),
        text_case("lone_high_surrogate", add, r#"{"id":"a\ud800b","inputs":[]}"#),
        text_case("raw_control_character", add, "{\"id\":\"a\tb\",\"inputs\":[]}"),
        text_case("unterminated_string", add, r#"{"id":"abc"#),
        text_case("not_json", add, "{bad"),
        text_case("bracket_mismatch", add, r#"{"inputs": [}"#),
        text_case("trailing_garbage", add, r#"{"inputs":[]} x"#),
        text_case("whitespace_only", add, "   "),
        // Binary tensor extension.
        binary_case("binary_ok", add, two_binary(bin4("INPUT0"), bin4("INPUT1")), &[&f4, &f4]),
        binary_case("binary_in_and_out", add, json!({"inputs": [bin4("INPUT0"), bin4("INPUT1")], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}, {"name": "OUTPUT1", "parameters": {"binary_data": true}}]}), &[&f4, &f4]),
        binary_case("binary_size_small", add, two_binary(binary_input("INPUT0", "FP32", json!([4]), json!(12)), bin4("INPUT1")), &[&f3, &f4]),
        binary_case("binary_size_big", add, two_binary(binary_input("INPUT0", "FP32", json!([4]), json!(20)), bin4("INPUT1")), &[&f5, &f4]),
        binary_case("binary_body_short", add, two_binary(bin4("INPUT0"), bin4("INPUT1")), &[&f4, &f3]),
        binary_case("binary_body_long", add, two_binary(bin4("INPUT0"), bin4("INPUT1")), &[&f4, &f5]),
        binary_case("binary_size_negative", add, two_binary(binary_input("INPUT0", "FP32", json!([4]), json!(-16)), bin4("INPUT1")), &[&f4, &f4]),
        binary_case("binary_size_string", add, two_binary(binary_input("INPUT0", "FP32", json!([4]), json!("16")), bin4("INPUT1")), &[&f4, &f4]),
        case("binary_size_without_header_length", add, two_binary(bin4("INPUT0"), bin4("INPUT1"))),
        binary_case("header_length_past_body", add, two_binary(bin4("INPUT0"), bin4("INPUT1")), &[&f4, &f4]).header_length("100000"),
        binary_case("header_length_garbage_means_raw", add, two_binary(bin4("INPUT0"), bin4("INPUT1")), &[&f4, &f4]).header_length("abc"),
        binary_case("binary_and_json_inputs", add, two_binary(bin4("INPUT0"), input("INPUT1", "FP32", json!([4]), four())), &[&f4]),
        binary_case("binary_wrong_datatype", add, two_binary(binary_input("INPUT0", "INT32", json!([4]), json!(16)), bin4("INPUT1")), &[&f4, &f4]),
        binary_case("binary_unknown_datatype", add, two_binary(binary_input("INPUT0", "FLOAT", json!([4]), json!(16)), bin4("INPUT1")), &[&f4, &f4]),
        binary_case("binary_size_zero", add, two_binary(binary_input("INPUT0", "FP32", json!([4]), json!(0)), bin4("INPUT1")), &[&f4]),
        binary_case("binary_size_null", add, two_binary(binary_input("INPUT0", "FP32", json!([4]), json!(null)), bin4("INPUT1")), &[&f4, &f4]),
        // BYTES.
        case("bytes_json", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([2]), json!(["a", "bc"]))])),
        case("bytes_json_nested", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([2]), json!([["a"], ["bc"]]))])),
        case("bytes_json_number", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([2]), json!(["a", 5]))])),
        case("bytes_json_too_few", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([3]), json!(["a", "b"]))])),
        case("bytes_json_too_many", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([1]), json!(["a", "b", "c"]))])),
        case("bytes_json_empty_shape", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([0]), json!([]))])),
        case("bytes_json_empty_shape_ignores_data", "string_echo", inputs(vec![input("INPUT0", "BYTES", json!([0]), json!(["a"]))])),
        bytes_case("bytes_json_invalid_utf8", "string_echo", b"{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"BYTES\",\"shape\":[1],\"data\":[\"\xff\"]}]}".to_vec()),
        binary_case("bytes_binary", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([2]), json!(13))]), &[&strings(&[b"ab", b"cde"])]),
        binary_case("bytes_binary_too_few", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([3]), json!(13))]), &[&strings(&[b"ab", b"cde"])]),
        binary_case("bytes_binary_too_many", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([1]), json!(15))]), &[&strings(&[b"a", b"b", b"c"])]),
        binary_case("bytes_binary_length_past_end", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([2]), json!(13))]), &[&[strings(&[b"ab"]), 100u32.to_le_bytes().to_vec(), b"cde".to_vec()].concat()]),
        binary_case("bytes_binary_trailing_bytes", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([2]), json!(15))]), &[&[strings(&[b"ab", b"cde"]), b"zz".to_vec()].concat()]),
        binary_case("bytes_binary_empty_strings", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([2]), json!(8))]), &[&strings(&[b"", b""])]),
        binary_case("bytes_binary_empty", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([0]), json!(0))]), &[]),
        binary_case("bytes_binary_missing_element", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([1]), json!(0))]), &[]),
        binary_case("bytes_binary_cut_length", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([2]), json!(8))]), &[&[strings(&[b"ab"]), vec![1, 0]].concat()]),
        binary_case("bytes_binary_junk_for_no_elements", "string_echo", inputs(vec![binary_input("INPUT0", "BYTES", json!([0]), json!(2))]), &[b"zz"]),
        // Batched models.
        case("batch_of_three", "batched_double", inputs(vec![input("INPUT0", "FP32", json!([3, 4]), json!([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]))])),
        case("batch_dimension_missing", "batched_double", inputs(vec![input("INPUT0", "FP32", json!([4]), four())])),
        case("batch_too_big", "batched_double", inputs(vec![input("INPUT0", "FP32", json!([9, 4]), json!(vec![1.0; 36]))])),
        case("batch_zero_json", "batched_double", inputs(vec![input("INPUT0", "FP32", json!([0, 4]), json!([]))])),
        case("batched_scalar", "batched_double", inputs(vec![input("INPUT0", "FP32", json!([]), json!([1]))])),
        case("batched_wrong_dim", "batched_double", inputs(vec![input("INPUT0", "FP32", json!([2, 3]), json!([1, 2, 3, 4, 5, 6]))])),
        binary_case("batch_zero_with_one_item", "batched_double", inputs(vec![binary_input("INPUT0", "FP32", json!([0, 4]), json!(16))]), &[&f4]),
        binary_case("batch_zero_empty", "batched_double", inputs(vec![binary_input("INPUT0", "FP32", json!([0, 4]), json!(0))]), &[]),
        case("variable_dims", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([2, 3, 2]), json!(vec![1.0; 12])), input("INPUT1", "INT32", json!([2, 3]), json!(vec![1; 6]))])),
        case("batch_sizes_differ", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([2, 3, 2]), json!(vec![1.0; 12])), input("INPUT1", "INT32", json!([1, 3]), json!(vec![1; 3]))])),
        case("batch_sizes_differ_reversed", "batched_var", inputs(vec![input("INPUT1", "INT32", json!([1, 3]), json!(vec![1; 3])), input("INPUT0", "FP32", json!([2, 3, 2]), json!(vec![1.0; 12]))])),
        case("batch_too_big_both", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([5, 1, 2]), json!(vec![1.0; 10])), input("INPUT1", "INT32", json!([5, 3]), json!(vec![1; 15]))])),
        case("variable_dim_zero", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([1, 0, 2]), json!([])), input("INPUT1", "INT32", json!([1, 3]), json!(vec![1; 3]))])),
        case("variable_model_wrong_dim", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([1, 3, 3]), json!(vec![1.0; 9])), input("INPUT1", "INT32", json!([1, 3]), json!(vec![1; 3]))])),
        case("batch_zero_both", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([0, 3, 2]), json!([])), input("INPUT1", "INT32", json!([0, 3]), json!([]))])),
        case("batch_zero_and_two", "batched_var", inputs(vec![input("INPUT0", "FP32", json!([0, 3, 2]), json!([])), input("INPUT1", "INT32", json!([2, 3]), json!(vec![1; 6]))])),
        case("batch_two_and_zero", "batched_var", inputs(vec![input("INPUT1", "INT32", json!([2, 3]), json!(vec![1; 6])), input("INPUT0", "FP32", json!([0, 3, 2]), json!([]))])),
        // Ragged batching: Triton still checks each request on its own.
        case("ragged_ok", "ragged_sum", inputs(vec![input("INPUT0", "FP32", json!([1, 3]), json!([1, 2, 3])), input("LENGTHS", "INT32", json!([1, 1]), json!([3]))])),
        case("ragged_batch_sizes_differ", "ragged_sum", inputs(vec![input("INPUT0", "FP32", json!([1, 6]), json!([1, 2, 3, 4, 5, 6])), input("LENGTHS", "INT32", json!([2, 1]), json!([3, 3]))])),
        case("ragged_without_batch", "ragged_sum", inputs(vec![input("INPUT0", "FP32", json!([6]), json!([1, 2, 3, 4, 5, 6])), input("LENGTHS", "INT32", json!([2, 1]), json!([3, 3]))])),
        case("ragged_batch_too_big", "ragged_sum", inputs(vec![input("INPUT0", "FP32", json!([9, 1]), json!(vec![1.0; 9])), input("LENGTHS", "INT32", json!([9, 1]), json!(vec![1; 9]))])),
        binary_case("ragged_binary_size", "ragged_sum", inputs(vec![binary_input("INPUT0", "FP32", json!([1, 3]), json!(16)), input("LENGTHS", "INT32", json!([1, 1]), json!([3]))]), &[&f4]),
        case("ragged_json_count", "ragged_sum", inputs(vec![input("INPUT0", "FP32", json!([1, 3]), four()), input("LENGTHS", "INT32", json!([1, 1]), json!([3]))])),
        // Every datatype.
        case("bool", "typed_inputs", inputs(vec![input("IN_BOOL", "BOOL", json!([2]), json!([true, false]))])),
        case("bool_as_int", "typed_inputs", inputs(vec![input("IN_BOOL", "BOOL", json!([2]), json!([1, 0]))])),
        case("uint8_negative", "typed_inputs", inputs(vec![input("IN_UINT8", "UINT8", json!([2]), json!([1, -1]))])),
        case("uint8_300_wraps", "typed_inputs", inputs(vec![input("IN_UINT8", "UINT8", json!([2]), json!([1, 300]))])),
        case("uint64_max", "typed_inputs", inputs(vec![input("IN_UINT64", "UINT64", json!([2]), json!([1, u64::MAX]))])),
        text_case("uint64_past_max", "typed_inputs", r#"{"inputs":[{"name":"IN_UINT64","datatype":"UINT64","shape":[2],"data":[1,18446744073709551616]}]}"#),
        case("int8_past_range_wraps", "typed_inputs", inputs(vec![input("IN_INT8", "INT8", json!([2]), json!([1, -129]))])),
        case("int64_min", "typed_inputs", inputs(vec![input("IN_INT64", "INT64", json!([2]), json!([1, i64::MIN]))])),
        case("int64_as_float", "typed_inputs", inputs(vec![input("IN_INT64", "INT64", json!([2]), json!([1, 1e3]))])),
        case("fp64", "typed_inputs", inputs(vec![input("IN_FP64", "FP64", json!([2]), json!([1.5, 1e21]))])),
        case("fp16_as_json", "typed_inputs", inputs(vec![input("IN_FP16", "FP16", json!([2]), json!([1.5, 2]))])),
        case("bf16_as_json", "typed_inputs", inputs(vec![input("IN_BF16", "BF16", json!([2]), json!([1.5, 2]))])),
        binary_case("fp16_binary", "typed_inputs", inputs(vec![binary_input("IN_FP16", "FP16", json!([2]), json!(4))]), &[&[0x00, 0x3e, 0x00, 0x40]]),
        binary_case("bf16_binary", "typed_inputs", inputs(vec![binary_input("IN_BF16", "BF16", json!([2]), json!(4))]), &[&[0x80, 0x3f, 0x00, 0x40]]),
        binary_case("bf16_binary_wrong_size", "typed_inputs", inputs(vec![binary_input("IN_BF16", "BF16", json!([2]), json!(8))]), &[&[0x80, 0x3f, 0x00, 0x40, 0x80, 0x3f, 0x00, 0x40]]),
        binary_case("bool_binary", "typed_inputs", inputs(vec![binary_input("IN_BOOL", "BOOL", json!([2]), json!(2))]), &[&[1, 0]]),
        binary_case("uint16_binary_odd_size", "typed_inputs", inputs(vec![binary_input("IN_UINT16", "UINT16", json!([2]), json!(3))]), &[&[1, 0, 2]]),
        case("no_inputs_all_optional", "typed_inputs", inputs(vec![])),
        case("bytes_for_uint8", "typed_inputs", inputs(vec![input("IN_UINT8", "BYTES", json!([2]), json!(["a", "b"]))])),
        case("eight_datatypes", "typed_inputs", inputs(vec![
            input("IN_BOOL", "BOOL", json!([2]), json!([true, true])),
            input("IN_UINT8", "UINT8", json!([2]), json!([1, 2])),
            input("IN_UINT16", "UINT16", json!([2]), json!([1, 2])),
            input("IN_UINT32", "UINT32", json!([2]), json!([1, 2])),
            input("IN_UINT64", "UINT64", json!([2]), json!([1, 2])),
            input("IN_INT8", "INT8", json!([2]), json!([1, 2])),
            input("IN_INT16", "INT16", json!([2]), json!([1, 2])),
            input("IN_INT64", "INT64", json!([2]), json!([1, 2])),
            input("IN_FP64", "FP64", json!([2]), json!([1, 2])),
        ])),
        // Several wrong shapes: Triton names the one its hash map iterates first.
        case("five_wrong_shapes", "typed_inputs", inputs(
            [("IN_BOOL", "BOOL", json!(true)), ("IN_UINT8", "UINT8", json!(1)), ("IN_UINT16", "UINT16", json!(1)), ("IN_UINT32", "UINT32", json!(1)), ("IN_INT8", "INT8", json!(1))]
                .into_iter()
                .map(|(n, d, v)| input(n, d, json!([3]), json!([v.clone(), v.clone(), v])))
                .collect(),
        )),
        case("eight_wrong_shapes", "typed_inputs", inputs(
            [("IN_UINT8", "UINT8"), ("IN_UINT16", "UINT16"), ("IN_UINT32", "UINT32"), ("IN_UINT64", "UINT64"), ("IN_INT8", "INT8"), ("IN_INT16", "INT16"), ("IN_INT64", "INT64"), ("IN_FP64", "FP64")]
                .into_iter()
                .map(|(n, d)| input(n, d, json!([3]), json!([1, 1, 1])))
                .collect(),
        )),
        case("twelve_unknown_inputs", "typed_inputs", inputs(
            ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L"]
                .into_iter()
                .map(|n| input(n, "FP64", json!([2]), json!([1, 1])))
                .collect(),
        )),
        // Optional inputs.
        case("optional_left_out", "optional_input", inputs(vec![input("INPUT0", "FP32", json!([4]), four())])),
        case("optional_given", "optional_input", inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("INPUT1", "FP32", json!([4]), four())])),
        // Triton passes this to the model without INPUT0 (the model fails, 500); the gateway
        // refuses it as the missing required input it is.
        case("required_left_out_optional_given", "optional_input", inputs(vec![input("INPUT1", "FP32", json!([4]), four())]))
            .own_message("missing required input(s) ['INPUT0']"),
        case("optional_model_no_inputs", "optional_input", inputs(vec![])),
        case("optional_model_too_many", "optional_input", inputs(vec![input("INPUT0", "FP32", json!([4]), four()), input("INPUT1", "FP32", json!([4]), four()), input("X", "FP32", json!([4]), four())])),
        case("optional_model_three_unknown", "optional_input", inputs(vec![input("C", "FP32", json!([4]), four()), input("A", "FP32", json!([4]), four()), input("B", "FP32", json!([4]), four())])),
        // Raw binary requests: the body is the only input.
        bytes_case("raw_one_item", "batched_double", f4.clone()).header_length("0"),
        bytes_case("raw_short", "batched_double", f3.clone()).header_length("0"),
        bytes_case("raw_two_items", "batched_double", [f4.clone(), f4.clone()].concat()).header_length("0"),
        bytes_case("raw_empty_body", "batched_double", Vec::new()),
        bytes_case("raw_for_two_inputs", add, f4.clone()).header_length("0"),
        bytes_case("raw_bytes_for_variable_shape", "string_echo", b"hello".to_vec()).header_length("0"),
    ];
    c.push(case(
        "reshaped_ok",
        "reshaped",
        inputs(vec![
            input("INPUT0", "FP32", json!([4]), four()),
            input("INPUT1", "FP32", json!([4]), four()),
        ]),
    ));
    c
}

/// A response, as much as the comparison needs.
struct Answer {
    status: StatusCode,
    header_length: Option<String>,
    body: Bytes,
}

impl Answer {
    fn error(&self) -> String {
        // Triton writes the bytes of a name or id as they came, valid UTF-8 or not.
        serde_json::from_str::<Value>(&String::from_utf8_lossy(&self.body))
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| {
                format!(
                    "(not an error body: {:?})",
                    String::from_utf8_lossy(&self.body)
                )
            })
    }
}

async fn send(client: &reqwest::Client, base: &str, case: &Case) -> Answer {
    let mut request = client
        .post(format!("{base}/v2/models/{}/infer", case.model))
        .body(case.body.clone());
    if let Some(length) = &case.header_length {
        request = request.header("Inference-Header-Content-Length", length);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    Answer {
        status: response.status(),
        header_length: response
            .headers()
            .get("inference-header-content-length")
            .map(|v| v.to_str().unwrap().to_string()),
        body: response.bytes().await.unwrap(),
    }
}

/// The differential's two Tritons over one repository, both with default flags. The
/// reference is Triton alone (`standalone`: its default model control loads every model of
/// the repository at start): it is sent each request directly, and nothing would load a
/// model for a direct request. The gateway's Triton runs in explicit mode and starts empty,
/// as in production: the gateway loads each model on its first request, and its checks then
/// read the signature of a copy it placed itself.
async fn reference_and_served(repository: &tempfile::TempDir) -> (Triton, Triton) {
    let start = |standalone: bool| {
        Triton::start(TritonOptions {
            standalone,
            verbose: true,
            repository: Some(repository.path().to_path_buf()),
            ..Default::default()
        })
    };
    let (reference, served) = tokio::join!(start(true), start(false));
    (
        reference.expect("reference triton starts"),
        served.expect("the gateway's triton starts"),
    )
}

/// A gateway over `served` with room for every corpus model at once: each is loaded on its
/// first request and stays, as a user sizes capacity for the models they serve.
fn corpus_config(name: &str, served: &Triton) -> String {
    support::gateway::config_with_capacity(name, &[served], "64GiB", "", "")
}

/// Inference requests Triton says it received.
fn infer_arrivals(triton: &Triton) -> usize {
    triton.log().lines().filter(|l| is_infer_arrival(l)).count()
}

/// Whether a line of Triton's verbose log is an inference request it received: it ends in
/// `"HTTP request: 2 /v2/models/m/infer"` (2 is POST).
fn is_infer_arrival(line: &str) -> bool {
    let line = line.trim_end().trim_end_matches('"');
    line.contains("HTTP request: 2 /v2/models/") && line.ends_with("/infer")
}

/// Signature fetches Triton received for `model` (`HTTP request: 0 /v2/models/m/config`).
fn config_fetches(triton: &Triton, model: &str) -> usize {
    let line = format!("HTTP request: 0 /v2/models/{model}/config");
    triton
        .log()
        .lines()
        .filter(|l| l.trim_end().trim_end_matches('"').ends_with(&line))
        .count()
}

/// The test models, plus `reshaped` (add_sub under another name) whose config the test
/// rewrites, in a repository of the test's own.
fn test_repository() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("infergate-validation-")
        .tempdir()
        .unwrap();
    for model in &MODELS[..MODELS.len() - 1] {
        copy_dir(&model_repository().join(model), &dir.path().join(model));
    }
    copy_dir(
        &model_repository().join("add_sub"),
        &dir.path().join("reshaped"),
    );
    let config = dir.path().join("reshaped").join("config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("name: \"add_sub\"", "name: \"reshaped\""),
    )
    .unwrap();
    dir
}

/// The sum of `infergate_validation_rejections_total` for `model` (every reason).
fn rejections(metrics: &str, model: &str) -> u64 {
    let label = format!("model=\"{model}\"");
    support::metric_sum(metrics, "infergate_validation_rejections_total", &[&label]) as u64
}

/// The rejection counters are process-wide and labelled by model: the tests that count
/// them run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn differential_against_real_triton() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let repository = test_repository();
    let (triton, served) = reference_and_served(&repository).await;
    let gateway = TestGateway::start(&corpus_config("validation", &served)).await;
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();

    let corpus = corpus();
    assert!(corpus.len() >= 60, "corpus of {}", corpus.len());
    let (direct_at_start, served_at_start) = (infer_arrivals(&triton), infer_arrivals(&served));
    let counted_before = gateway.metrics_text("/metrics").await;
    let (mut accepted, mut refused) = (0usize, 0usize);
    let mut refused_per_model: BTreeMap<&str, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &corpus {
        let before = infer_arrivals(&triton);
        let direct = send(&client, &triton.http_url(), case).await;
        let after_direct = infer_arrivals(&triton);
        // Triton logs a request before it answers it: what the gateway checks below.
        assert_eq!(
            after_direct,
            before + 1,
            "{}: Triton's log missed the direct request",
            case.name
        );
        let served_before = infer_arrivals(&served);
        let via = send(&client, &gateway.url(), case).await;
        let forwarded = infer_arrivals(&served) - served_before;
        if direct.status == StatusCode::OK {
            accepted += 1;
        } else {
            refused += 1;
            *refused_per_model.entry(case.model).or_default() += 1;
        }
        failures.extend(disagreements(case, &direct, &via, forwarded));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );
    // Counted over the whole run too, after the logs have surely caught up: one arrival
    // per direct request at the reference, one per accepted request behind the gateway,
    // none else.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(infer_arrivals(&triton) - direct_at_start, corpus.len());
    assert_eq!(infer_arrivals(&served) - served_at_start, accepted);
    assert!(
        accepted >= 20 && refused >= 40,
        "{accepted} accepted, {refused} refused"
    );
    eprintln!(
        "validation corpus: {} requests, {accepted} accepted by Triton and forwarded, {refused} refused by Triton and by the gateway itself ({:.1}s)",
        corpus.len(),
        started.elapsed().as_secs_f64()
    );

    // Every refusal counted once, by model and reason.
    let metrics = gateway.metrics_text("/metrics").await;
    for (model, count) in &refused_per_model {
        assert_eq!(
            rejections(&metrics, model) - rejections(&counted_before, model),
            *count,
            "rejections of {model}\n{metrics}"
        );
    }
    for reason in [
        "shape",
        "datatype",
        "missing_input",
        "unknown_input",
        "duplicate_input",
        "batch_size",
        "data_length",
        "data_value",
        "binary_size",
        "bytes_encoding",
        "unknown_output",
        "parameters",
        "malformed_json",
        "malformed_request",
    ] {
        assert!(
            metrics.contains(&format!("reason=\"{reason}\"")),
            "no rejection with reason {reason}"
        );
    }
    assert!(metrics.contains("# HELP infergate_validation_rejections_total"));

    formatted_corpus_agrees_with_triton(&triton, &served, &gateway, &client).await;
    requests_that_would_hurt_triton_never_reach_it(&served, &gateway, &client).await;
    disabled_validation_streams_requests_untouched(&served, &client).await;
    unavailable_signature_means_unvalidated(&served, &client).await;
    // The signature cache alone, last: it reloads a model of the gateway's Triton under it.
    signatures_are_fetched_once_and_invalidated(&served, repository.path()).await;
}

/// What is wrong with the gateway's answer `via` to `case`, given Triton's own answer
/// `direct` and how many times the gateway's request reached Triton (`forwarded`): what
/// Triton accepts must be forwarded once and answered with Triton's bytes; what it refuses
/// must be refused by the gateway itself with 400 and Triton's words.
fn disagreements(case: &Case, direct: &Answer, via: &Answer, forwarded: usize) -> Vec<String> {
    let mut failures = Vec::new();
    if direct.status == StatusCode::OK {
        if via.status != StatusCode::OK
            || via.body != direct.body
            || via.header_length != direct.header_length
        {
            failures.push(format!(
                "{}: Triton accepted; gateway answered {} {}",
                case.name,
                via.status,
                via.error()
            ));
        }
        if forwarded != 1 {
            failures.push(format!(
                "{}: accepted but forwarded {forwarded} times",
                case.name
            ));
        }
        return failures;
    }
    if via.status != StatusCode::BAD_REQUEST {
        failures.push(format!(
            "{}: Triton answered {} {:?}; gateway {} {:?}",
            case.name,
            direct.status,
            direct.error(),
            via.status,
            via.error()
        ));
    }
    if forwarded != 0 {
        failures.push(format!("{}: refused request reached Triton", case.name));
    }
    match case.own_message {
        None if via.error() != direct.error() => failures.push(format!(
            "{}: message differs\n  triton:  {}\n  gateway: {}",
            case.name,
            direct.error(),
            via.error()
        )),
        Some(expected) if !via.error().contains(expected) => failures.push(format!(
            "{}: {:?} lacks {expected:?}",
            case.name,
            via.error()
        )),
        _ => {}
    }
    failures
}

/// `case` with its JSON written in `style` (its header length, when it sends one, follows);
/// `None` for a case without a JSON header to rewrite (a raw binary body, a header length
/// that is not the header's).
fn formatted(case: &Case, style: Style) -> Option<Case> {
    let split = match &case.header_length {
        None => case.body.len(),
        Some(length) => length
            .parse::<usize>()
            .ok()
            .filter(|&l| l > 0 && l <= case.body.len())?,
    };
    if split == 0 {
        return None;
    }
    let mut body = reformat(&case.body[..split], style);
    let header_length = case.header_length.as_ref().map(|_| body.len().to_string());
    body.extend_from_slice(&case.body[split..]);
    Some(Case {
        name: case.name,
        model: case.model,
        body,
        header_length,
        own_message: case.own_message,
    })
}

/// Every corpus request again, written as clients write JSON: `json.dumps` defaults
/// (`requests.post(json=...)` sends those), `indent=2`, random whitespace around every token
/// (seeded per case) and `\u` escapes in every name and string. Triton and the gateway must
/// agree on each exactly as on the compact text.
async fn formatted_corpus_agrees_with_triton(
    triton: &Triton,
    served: &Triton,
    gateway: &TestGateway,
    client: &reqwest::Client,
) {
    let mut log = LogTail::new(served.log_path());
    let (mut sent, mut accepted) = (0usize, 0usize);
    let mut failures = Vec::new();
    for (index, case) in corpus().iter().enumerate() {
        for style in styles(0x5eed ^ index as u64) {
            let Some(case) = formatted(case, style) else {
                continue;
            };
            sent += 1;
            let direct = send(client, &triton.http_url(), &case).await;
            let before = log.infer_lines();
            let via = send(client, &gateway.url(), &case).await;
            let forwarded = log.infer_lines() - before;
            accepted += usize::from(direct.status == StatusCode::OK);
            failures.extend(
                disagreements(&case, &direct, &via, forwarded)
                    .into_iter()
                    .map(|f| format!("{style:?} {f}")),
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {sent} formatted requests differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        sent >= 4 * 150 && accepted >= 4 * 40,
        "{sent} sent, {accepted} accepted"
    );
    eprintln!("formatted corpus: {sent} requests, {accepted} accepted by Triton, all alike");
}

/// Triton aborts (std::bad_alloc) on a JSON request whose shape promises terabytes: the
/// gateway refuses it from the data count alone. Sent through the gateway only.
async fn requests_that_would_hurt_triton_never_reach_it(
    triton: &Triton,
    gateway: &TestGateway,
    client: &reqwest::Client,
) {
    let before = infer_arrivals(triton);
    for shape in [json!([1u64 << 40]), json!([1u64 << 32, 1u64 << 32])] {
        let case = case(
            "huge_shape",
            "add_sub",
            inputs(vec![
                input("INPUT0", "FP32", shape, four()),
                input("INPUT1", "FP32", json!([4]), four()),
            ]),
        );
        let via = send(client, &gateway.url(), &case).await;
        assert_eq!(via.status, StatusCode::BAD_REQUEST, "{}", via.error());
    }
    assert_eq!(infer_arrivals(triton), before);
    let alive = client
        .get(format!("{}/v2/health/live", triton.http_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(alive.status(), StatusCode::OK);
}

/// The cache on its own, against a Triton in explicit mode (the gateway's): 16 concurrent
/// misses make one fetch; a reload does not change a cached signature until `invalidate`,
/// which placement calls. `reshaped` is loaded there first, as placement loads a copy (the
/// corpus's requests through the gateway already have: then it is a reload).
async fn signatures_are_fetched_once_and_invalidated(triton: &Triton, repository: &Path) {
    triton.load_model("reshaped").await.expect("load");
    let text = config_for("cache", &[triton], "", "");
    let config = Config::parse(&text).unwrap();
    let backend = Arc::new(Backend::new(&config.backends[0], &config.upstream, 1).unwrap());
    let cache = Arc::new(SignatureCache::new(&Validation::default()));
    let model = ModelRef::new("reshaped", None);
    let fetched_before = config_fetches(triton, "reshaped");
    let mut gets = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (cache, backend, model) = (cache.clone(), backend.clone(), model.clone());
        gets.spawn(async move { cache.get(&backend, &model).await });
    }
    while let Some(signature) = gets.join_next().await {
        assert_eq!(signature.unwrap().expect("signature").inputs[0].dims, [4]);
    }
    assert_eq!(
        config_fetches(triton, "reshaped") - fetched_before,
        1,
        "concurrent misses share one fetch"
    );

    let config_path = repository.join("reshaped").join("config.pbtxt");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, text.replace("dims: [ 4 ]", "dims: [ 5 ]")).unwrap();
    triton.load_model("reshaped").await.expect("reload");
    let cached = cache.get(&backend, &model).await.unwrap();
    assert_eq!(cached.inputs[0].dims, [4], "served from the cache");
    cache.invalidate("reshaped");
    let fresh = cache.get(&backend, &model).await.unwrap();
    assert_eq!(fresh.inputs[0].dims, [5]);
    assert_eq!(config_fetches(triton, "reshaped") - fetched_before, 2);
    // Per version too, and a model that does not exist is no signature (not an error).
    let versioned = cache
        .get(&backend, &ModelRef::new("reshaped", Some("1".into())))
        .await
        .unwrap();
    assert_eq!(versioned.inputs[0].dims, [5]);
    assert!(
        cache
            .get(&backend, &ModelRef::new("no_such_model", None))
            .await
            .is_none()
    );
}

/// `validation.enabled = false`: the gateway does not read the body; Triton answers.
async fn disabled_validation_streams_requests_untouched(triton: &Triton, client: &reqwest::Client) {
    let mut text = config_for("novalidation", &[triton], "", "");
    text.push_str("[validation]\nenabled = false\n");
    let gateway = TestGateway::start(&text).await;
    let bad = case(
        "wrong_dim",
        "add_sub",
        inputs(vec![
            input("INPUT0", "FP32", json!([4]), four()),
            input("INPUT1", "FP32", json!([3]), json!([1, 2, 3])),
        ]),
    );
    let (before, fetched) = (infer_arrivals(triton), config_fetches(triton, "add_sub"));
    let via = send(client, &gateway.url(), &bad).await;
    assert_eq!(
        config_fetches(triton, "add_sub"),
        fetched,
        "no signature fetched"
    );
    assert_eq!(via.status, StatusCode::BAD_REQUEST);
    assert!(via.error().contains("unexpected shape for input 'INPUT1'"));
    assert_eq!(infer_arrivals(triton), before + 1, "Triton answered it");
}

/// A backend whose model config cannot be read: requests are forwarded unvalidated (never
/// refuse what Triton may accept). Faked in front of the real Triton, which answers infer.
async fn unavailable_signature_means_unvalidated(triton: &Triton, client: &reqwest::Client) {
    use axum::extract::Request;
    use axum::response::{IntoResponse, Response};
    let upstream = triton.http_url();
    let proxy_client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: Request| {
        let (upstream, proxy_client) = (upstream.clone(), proxy_client.clone());
        async move {
            let path = request.uri().path().to_owned();
            if path.ends_with("/config") {
                return (StatusCode::INTERNAL_SERVER_ERROR, "no config today").into_response();
            }
            let method = request.method().clone();
            let headers = request.headers().clone();
            let body = axum::body::to_bytes(request.into_body(), usize::MAX)
                .await
                .unwrap();
            let mut forwarded = proxy_client
                .request(method, format!("{upstream}{path}"))
                .body(body);
            if let Some(length) = headers.get("inference-header-content-length") {
                forwarded = forwarded.header("inference-header-content-length", length);
            }
            let answer = forwarded.send().await.unwrap();
            let status = answer.status();
            Response::builder()
                .status(status)
                .body(axum::body::Body::from(answer.bytes().await.unwrap()))
                .unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let text = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
         grpc = \"127.0.0.1:0\"\n[upstream]\nhealth_interval = \"200ms\"\n\
         [[backends]]\nname = \"noconfig-0\"\nhttp = \"http://{address}\"\ngrpc = \"{}\"\n",
        triton.grpc_url()
    );
    let gateway = TestGateway::start(&text).await;
    let bad = case(
        "wrong_dim",
        "add_sub",
        inputs(vec![
            input("INPUT0", "FP32", json!([4]), four()),
            input("INPUT1", "FP32", json!([3]), json!([1, 2, 3])),
        ]),
    );
    for _ in 0..2 {
        let before = infer_arrivals(triton);
        let via = send(client, &gateway.url(), &bad).await;
        assert_eq!(via.status, StatusCode::BAD_REQUEST, "{}", via.error());
        assert!(via.error().contains("unexpected shape"), "{}", via.error());
        assert_eq!(infer_arrivals(triton), before + 1, "forwarded to Triton");
    }
    let good = case("json_ok", "add_sub", inputs(add_sub_ok()));
    assert_eq!(
        send(client, &gateway.url(), &good).await.status,
        StatusCode::OK
    );
}

/// A small deterministic generator (xorshift64*), so a failing mutation can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const NUMBERS: [&str; 16] = [
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "8",
    "9",
    "-1",
    "1.5",
    "1e3",
    "300",
    "2147483648",
    "18446744073709551615",
    "NaN",
    "[]",
];
const STRINGS: [&str; 20] = [
    "INPUT0",
    "INPUT1",
    "FP32",
    "INT32",
    "BYTES",
    "FP16",
    "BOOL",
    "UINT8",
    "NOPE",
    "",
    "OUTPUT0",
    "data",
    "shape",
    "name",
    "datatype",
    "binary_data_size",
    "parameters",
    "inputs",
    "outputs",
    "id",
];
const BYTES: &[u8] = b"{}[]\":,0123456789-.eE aNIftrul\\";

/// One random edit of the JSON header: a byte changed, dropped or added, or a number or a
/// string replaced by another that matters to the checks.
fn mutate(header: &mut Vec<u8>, rng: &mut Rng) {
    if header.is_empty() {
        header.push(BYTES[rng.below(BYTES.len())]);
        return;
    }
    let at = rng.below(header.len());
    match rng.below(6) {
        0 => header[at] = BYTES[rng.below(BYTES.len())],
        1 => {
            header.remove(at);
        }
        2 => header.insert(at, BYTES[rng.below(BYTES.len())]),
        3 | 4 => {
            // A number at or after `at`.
            let Some(start) = (at..header.len()).find(|&i| header[i].is_ascii_digit()) else {
                return;
            };
            let end = (start..header.len())
                .find(|&i| !(header[i].is_ascii_digit() || b".eE-".contains(&header[i])))
                .unwrap_or(header.len());
            let with = NUMBERS[rng.below(NUMBERS.len())].as_bytes();
            header.splice(start..end, with.iter().copied());
        }
        _ => {
            // A string at or after `at`.
            let Some(open) = (at..header.len()).find(|&i| header[i] == b'"') else {
                return;
            };
            let Some(close) = (open + 1..header.len()).find(|&i| header[i] == b'"') else {
                return;
            };
            let with = STRINGS[rng.below(STRINGS.len())].as_bytes();
            header.splice(open + 1..close, with.iter().copied());
        }
    }
}

/// Whether Triton could survive a request directly: it allocates a JSON tensor from its
/// shape before counting the data, so a shape promising more than 64 MiB is not sent to it.
fn safe_for_triton(case: &Case) -> bool {
    let length = case
        .header_length
        .as_deref()
        .and_then(|l| l.trim().parse::<usize>().ok())
        .unwrap_or(case.body.len())
        .min(case.body.len());
    let Ok(doc) = infergate::internals::json::parse_request(&case.body[..length]) else {
        return true;
    };
    let Some(inputs) = doc.find("inputs").and_then(|i| i.elements()) else {
        return true;
    };
    inputs.iter().all(|input| match input.find("shape") {
        Some(infergate::internals::json::Value::Shape(shape)) => {
            shape.too_long
                || shape
                    .dims
                    .iter()
                    .try_fold(1u64, |n, &d| n.checked_mul(d))
                    .is_some_and(|n| n <= 8 << 20)
        }
        _ => true,
    })
}

/// Reads a growing Triton log from where it last stopped.
struct LogTail {
    file: std::fs::File,
    partial: Vec<u8>,
    infer: usize,
}

impl LogTail {
    fn new(path: &Path) -> Self {
        Self {
            file: std::fs::File::open(path).unwrap(),
            partial: Vec::new(),
            infer: 0,
        }
    }

    /// Inference requests logged so far (as `infer_arrivals` counts them).
    fn infer_lines(&mut self) -> usize {
        use std::io::Read;
        let mut fresh = Vec::new();
        self.file.read_to_end(&mut fresh).unwrap();
        self.partial.extend_from_slice(&fresh);
        let complete = self
            .partial
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let lines: Vec<u8> = self.partial.drain(..complete).collect();
        self.infer += String::from_utf8_lossy(&lines)
            .lines()
            .filter(|l| is_infer_arrival(l))
            .count();
        self.infer
    }
}

/// Random mutations of the corpus, sent directly and through the gateway (MUTATIONS=n and
/// SEED=s choose how many and which). The gateway must never refuse what Triton accepts nor
/// forward what Triton refuses. Where a request breaks two rules the gateway may name a
/// different one first than Triton does: those are printed, not failed.
#[tokio::test]
async fn random_mutations_agree_with_triton() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let count: usize = std::env::var("MUTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x5eed);
    let repository = test_repository();
    let (triton, served) = reference_and_served(&repository).await;
    let gateway = TestGateway::start(&corpus_config("mutations", &served)).await;
    let mut log = LogTail::new(served.log_path());
    let client = reqwest::Client::new();
    let corpus = corpus();
    let mut rng = Rng(seed);
    let (mut refused_accepted, mut missed, mut worded, mut skipped, mut agreed) =
        (vec![], vec![], vec![], 0, 0);
    for n in 0..count {
        let base = &corpus[rng.below(corpus.len())];
        let header_length = base
            .header_length
            .as_deref()
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|&l| l > 0 && l <= base.body.len());
        let split = header_length.unwrap_or(base.body.len());
        let mut header = base.body[..split].to_vec();
        for _ in 0..1 + rng.below(3) {
            mutate(&mut header, &mut rng);
        }
        let new_length = header.len();
        header.extend_from_slice(&base.body[split..]);
        let case = Case {
            name: base.name,
            model: base.model,
            body: header,
            header_length: match (&base.header_length, header_length) {
                (_, Some(_)) => Some(new_length.to_string()),
                (other, None) => other.clone(),
            },
            own_message: base.own_message,
        };
        if !safe_for_triton(&case) {
            skipped += 1;
            continue;
        }
        let direct = send(&client, &triton.http_url(), &case).await;
        let arrived_before = log.infer_lines();
        let via = send(&client, &gateway.url(), &case).await;
        let forwarded = log.infer_lines() > arrived_before;
        let shown = || {
            let header = &case.body[..new_length.min(case.body.len())];
            format!(
                "#{n} from {}: {:?}",
                case.name,
                String::from_utf8_lossy(header)
            )
        };
        let from_model = direct.error().starts_with("Failed to process the request");
        if direct.status == StatusCode::OK {
            if via.status == StatusCode::OK && forwarded {
                agreed += 1;
            } else {
                refused_accepted.push(format!("{} -> gateway {}", shown(), via.error()));
            }
        } else if forwarded {
            missed.push(format!("{} -> triton {}", shown(), direct.error()));
        } else if via.error() == direct.error()
            || from_model
            || case.own_message.is_some()
            || (direct
                .error()
                .starts_with("Unable to find shared memory region")
                && via.error() == infergate::protocol::NO_SHARED_MEMORY)
        {
            agreed += 1;
        } else {
            worded.push(format!(
                "{}\n    triton:  {}\n    gateway: {}",
                shown(),
                direct.error(),
                via.error()
            ));
        }
    }
    eprintln!(
        "{count} mutations (seed {seed}): {agreed} agree, {} refused though Triton accepts, {} forwarded though Triton refuses, {} worded differently, {skipped} not sent (shape too big for Triton)",
        refused_accepted.len(),
        missed.len(),
        worded.len()
    );
    for line in refused_accepted
        .iter()
        .chain(&missed)
        .chain(&worded)
        .take(40)
    {
        eprintln!("  {line}");
    }
    assert!(
        refused_accepted.is_empty(),
        "the gateway refused requests Triton accepts"
    );
    assert!(
        missed.is_empty(),
        "the gateway forwarded requests Triton refuses"
    );
    assert!(
        worded.len() * 100 <= count,
        "over 1% of refusals worded differently from Triton's"
    );
}
