//! Fuzzes the HTTP request reader and the checker: arbitrary bodies and
//! `Inference-Header-Content-Length` values against fixed model signatures. Nothing may
//! panic, and the JSON reader must accept every document serde_json can write (RapidJSON,
//! whose acceptance it copies, accepts strictly more than strict JSON), written the ways
//! clients write it (`json.dumps` defaults, `indent=2`, random whitespace between tokens,
//! `\u` escapes in every string: `tests/support/reformat.rs`, shared with
//! `tests/validation.rs`), with the same outcome for each as for the compact text.
//!
//! Input layout: byte 0 picks the header-length mode (low 2 bits) and the model (the rest),
//! and with its high bit only the first half of the body has arrived (as when a binary
//! request is checked from its header while its tensors stream on);
//! bytes 1-2 are a little-endian length for the modes that use one; the rest is the body.
#![no_main]

#[path = "../../tests/support/reformat.rs"]
mod reformat;

use bytes::Bytes;
use infergate::validate::http::{BodyView, Parsed, parse};
use infergate::validate::{
    DataType, InputSpec, Rejection, Signature, check, check::check_raw, json,
};
use libfuzzer_sys::fuzz_target;
use reformat::{reformat, styles};
use std::sync::OnceLock;

fn spec(name: &str, datatype: DataType, dims: &[i64], optional: bool) -> InputSpec {
    InputSpec {
        name: name.into(),
        datatype,
        dims: dims.to_vec(),
        optional,
        allow_ragged_batch: false,
        is_shape_tensor: false,
    }
}

fn signatures() -> &'static [Signature] {
    static SIGNATURES: OnceLock<Vec<Signature>> = OnceLock::new();
    SIGNATURES.get_or_init(|| {
        let model = |name: &str, max_batch_size, inputs, outputs: &[&str]| Signature {
            name: name.into(),
            platform: "python".into(),
            max_batch_size,
            instances: 1,
            decoupled: false,
            inputs,
            outputs: outputs.iter().map(|o| o.to_string()).collect(),
        };
        let mut shape = spec("SHAPE", DataType::Int32, &[2], false);
        shape.is_shape_tensor = true;
        vec![
            model(
                "add_sub",
                0,
                vec![
                    spec("INPUT0", DataType::Fp32, &[4], false),
                    spec("INPUT1", DataType::Fp32, &[4], false),
                ],
                &["OUTPUT0", "OUTPUT1"],
            ),
            model(
                "string_echo",
                0,
                vec![spec("INPUT0", DataType::Bytes, &[-1], false)],
                &["OUTPUT0"],
            ),
            model(
                "batched_var",
                4,
                vec![
                    spec("INPUT0", DataType::Fp32, &[-1, 2], false),
                    spec("INPUT1", DataType::Int32, &[3], true),
                ],
                &["OUTPUT0"],
            ),
            model(
                "shape_tensor",
                8,
                vec![spec("DATA", DataType::Uint8, &[-1], false), shape],
                &["OUT"],
            ),
        ]
    })
}

/// What the reader and the checker make of a whole JSON body sent to `signature`.
fn outcome(body: &[u8], signature: &Signature) -> (Result<Parsed, Rejection>, Option<Rejection>) {
    let body = Bytes::copy_from_slice(body);
    let parsed = parse(BodyView::whole(&body), None, None, &signature.name);
    let checked = match &parsed {
        Ok(Parsed::Request(request)) => check(request, signature).err(),
        _ => None,
    };
    (parsed, checked)
}

fuzz_target!(|input: &[u8]| {
    let Some((&selector, rest)) = input.split_first() else {
        return;
    };
    let (length, body) = match rest {
        [a, b, body @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), body),
        _ => (0, rest),
    };
    let length_text = match selector & 3 {
        0 => None,
        1 => Some(length.min(body.len()).to_string()),
        2 => Some(length.to_string()),
        _ => Some(format!(" {}x", length as i64 - 1000)),
    };
    let signature = &signatures()[usize::from(selector >> 2) % signatures().len()];
    let body = Bytes::copy_from_slice(body);
    let arrived = if selector & 0x80 != 0 {
        body.slice(..body.len() / 2)
    } else {
        body.clone()
    };
    match parse(
        BodyView {
            arrived: &arrived,
            length: body.len(),
        },
        length_text.as_deref().map(str::as_bytes),
        None,
        &signature.name,
    ) {
        Ok(Parsed::Request(request)) => {
            let _ = check(&request, signature);
        }
        Ok(Parsed::Raw) => {
            let _ = check_raw(body.len() as u64, signature);
        }
        Ok(Parsed::Unvalidated(_) | Parsed::Incomplete) | Err(_) => {}
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&body) {
        let text = serde_json::to_vec(&value).expect("serializable");
        if let Err(e) = json::parse_request(&text) {
            panic!(
                "serde_json's own output refused: {e:?} in {:?}",
                String::from_utf8_lossy(&text)
            );
        }
        let compact = outcome(&text, signature);
        let seed = input
            .iter()
            .fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b));
        for style in styles(seed) {
            let formatted = reformat(&text, style);
            assert_eq!(
                outcome(&formatted, signature),
                compact,
                "{style:?} changed the outcome of {:?}",
                String::from_utf8_lossy(&formatted)
            );
        }
    }
});
