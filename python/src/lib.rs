//! `dpaudit._native`: the Python extension. One function, `call(op, request)`, takes a JSON
//! request and returns a JSON answer; the typed Python API (`python/dpaudit/`) builds the
//! requests and wraps the answers. Every computation goes through `dpaudit::api`, the same
//! chain as the CLI, so numbers, kinds, verdicts and error messages are the CLI's.
//!
//! Written without pyo3's macros: one function needs no generated glue, and the build stays
//! small (see Cargo.toml). The library is used without its `models` feature: nothing here
//! needs candle.

use std::path::Path;

use dpaudit::accountants::calibrate::{DpSgd, SolveFor};
use dpaudit::accountants::{AccountantKind, Evidence};
use dpaudit::events::{DpEvent, Neighbouring};
use dpaudit::{api, Error};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyModule, PyTuple};
use serde_json::{json, Map, Value};

/// A request error, with the same message the CLI prints and its parts (field, file, line)
/// as the ValueError's further arguments.
fn to_py(e: &Error) -> PyErr {
    PyValueError::new_err((
        e.to_string(),
        e.field.clone(),
        e.file.as_ref().map(|p| p.display().to_string()),
        e.line,
    ))
}

type Res<T> = std::result::Result<T, Error>;

/// A JSON number, or `"inf"`/`"-inf"`/`"nan"` for non-finite values (as the CLI's JSON report).
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        json!("nan")
    } else if x > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

fn get<'a>(req: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    req.get(key).filter(|v| !v.is_null())
}

fn f64_of(req: &Map<String, Value>, key: &str) -> Res<Option<f64>> {
    match get(req, key) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(Value::String(s)) if matches!(s.as_str(), "inf" | "-inf" | "nan") => {
            Ok(Some(s.parse::<f64>().unwrap_or(f64::NAN)))
        }
        Some(v) => Err(Error::field(key, format!("must be a number, got {v}"))),
    }
}

fn u64_of(req: &Map<String, Value>, key: &str) -> Res<Option<u64>> {
    match get(req, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| Error::field(key, format!("must be a whole number ≥ 0, got {v}"))),
    }
}

fn str_of<'a>(req: &'a Map<String, Value>, key: &str) -> Res<Option<&'a str>> {
    match get(req, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(Error::field(key, format!("must be a string, got {v}"))),
    }
}

fn required<T>(v: Option<T>, key: &str) -> Res<T> {
    v.ok_or_else(|| Error::field(key, "required"))
}

fn neighbouring(req: &Map<String, Value>) -> Res<Neighbouring> {
    match str_of(req, "neighbouring")? {
        None | Some("add_remove") => Ok(Neighbouring::AddRemove),
        Some("replace_one") => Ok(Neighbouring::ReplaceOne),
        Some(s) => Err(Error::field(
            "neighbouring",
            format!("must be `add_remove` or `replace_one`, got `{s}`"),
        )),
    }
}

fn neighbouring_str(n: Neighbouring) -> &'static str {
    match n {
        Neighbouring::AddRemove => "add_remove",
        Neighbouring::ReplaceOne => "replace_one",
    }
}

/// `accountants`: a list of names or one comma-separated string; `all` is every accountant.
fn accountants(req: &Map<String, Value>) -> Res<Vec<AccountantKind>> {
    let names: Vec<String> = match get(req, "accountants") {
        None => return Ok(AccountantKind::ALL.to_vec()),
        Some(Value::String(s)) => s.split(',').map(|p| p.trim().to_string()).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Error::field("accountants", format!("must be names, got {v}")))
            })
            .collect::<Res<_>>()?,
        Some(v) => return Err(Error::field("accountants", format!("must be a list of names, got {v}"))),
    };
    let mut out = Vec::new();
    for n in names.iter().filter(|n| !n.is_empty()) {
        if n.eq_ignore_ascii_case("all") {
            return Ok(AccountantKind::ALL.to_vec());
        }
        let k: AccountantKind = n.parse().map_err(|e: Error| Error::field("accountants", e.message))?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        return Err(Error::field("accountants", "no accountant given"));
    }
    Ok(out)
}

/// A JSON value as a TOML value: the strings `"inf"`, `"-inf"` and `"nan"` (how the Python
/// side sends non-finite floats) become floats, so that validation, not parsing, rejects them
/// with the field's own message; nulls are left out (an absent key).
fn to_toml(v: &Value, key: &str) -> Res<toml::Value> {
    Ok(match v {
        Value::Null => return Err(Error::field(key, "null is not a value")),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None if n.is_u64() => return Err(Error::field(key, format!("{n} is above the largest count, 2⁶³ − 1"))),
            None => toml::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => match s.as_str() {
            "inf" | "-inf" | "nan" => toml::Value::Float(s.parse::<f64>().unwrap_or(f64::NAN)),
            _ => toml::Value::String(s.clone()),
        },
        Value::Array(a) => toml::Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| to_toml(x, &format!("{key}[{i}]")))
                .collect::<Res<_>>()?,
        ),
        Value::Object(o) => {
            let mut t = toml::Table::new();
            for (k, x) in o.iter().filter(|(_, x)| !x.is_null()) {
                let child = if key.is_empty() {
                    k.clone()
                } else {
                    format!("{key}.{k}")
                };
                t.insert(k.clone(), to_toml(x, &child)?);
            }
            toml::Value::Table(t)
        }
    })
}

/// The request's `event`: a dpaudit event tree in its JSON form (`type`-tagged, as in event
/// files), validated.
fn event(req: &Map<String, Value>) -> Res<DpEvent> {
    let v = to_toml(required(get(req, "event"), "event")?, "event")?;
    let ev: DpEvent = v
        .try_into()
        .map_err(|e: toml::de::Error| Error::field("event", e.message()))?;
    ev.validate()?;
    Ok(ev)
}

fn event_json(ev: &DpEvent) -> Res<Value> {
    serde_json::to_value(ev).map_err(|e| Error::input(format!("event could not be serialised: {e}")))
}

/// A JSON value (a dict on the Python side) as TOML text, so that it is read by the same
/// parser, with the same messages, as a file.
fn as_toml(v: &Value, what: &str) -> Res<String> {
    toml::to_string(&to_toml(v, "")?).map_err(|e| Error::input(format!("{what} cannot be written as TOML: {e}")))
}

/// Messages about text generated from a dict name no line (the line is of the generated text).
fn no_line(mut e: Error) -> Error {
    e.line = None;
    e
}

fn op_from_value(req: &Map<String, Value>) -> Res<Value> {
    let v = required(get(req, "value"), "value")?;
    let name = str_of(req, "name")?.unwrap_or("<dict>");
    let file = match v.get("schema_version") {
        Some(_) => v.clone(),
        None => json!({ "schema_version": 1, "event": v }),
    };
    let text = as_toml(&file, "the event")?;
    let f = api::event_file_from_toml(&text, name).map_err(no_line)?;
    Ok(json!({
        "event": event_json(&f.event)?,
        "neighbouring": neighbouring_str(f.neighbouring),
        "delta": f.delta.map(num),
    }))
}

fn op_load(req: &Map<String, Value>) -> Res<Value> {
    let path = required(str_of(req, "path")?, "path")?;
    let input = api::load(Path::new(path))?;
    Ok(json!({
        "event": event_json(&input.event)?,
        "neighbouring": neighbouring_str(input.neighbouring),
        "delta": input.delta.map(num),
        "role": input.role,
        "warnings": input.warnings,
    }))
}

fn op_validate(req: &Map<String, Value>) -> Res<Value> {
    Ok(json!({ "event": event_json(&event(req)?)? }))
}

fn report_json(r: &dpaudit::report::Report) -> Res<Value> {
    let text = dpaudit::report::export::to_json(r)?;
    serde_json::from_str(&text).map_err(|e| Error::input(format!("report could not be read back: {e}")))
}

fn op_account(req: &Map<String, Value>) -> Res<Value> {
    let ev = event(req)?;
    let rep = api::account(
        &ev,
        neighbouring(req)?,
        f64_of(req, "delta")?,
        f64_of(req, "epsilon")?,
        &accountants(req)?,
    )?;
    report_json(&rep)
}

fn op_check(req: &Map<String, Value>) -> Res<Value> {
    let budget = required(f64_of(req, "max_epsilon")?, "max_epsilon")?;
    let delta = f64_of(req, "delta")?;
    let accountants = accountants(req)?;
    // A path is read by the CLI's loader (its δ, neighbouring relation and input warnings).
    let rep = match str_of(req, "path")? {
        Some(p) => api::check(api::CheckInput::File(Path::new(p)), delta, budget, &accountants)?,
        None => {
            let ev = event(req)?;
            let delta = required(delta, "delta")?;
            api::check(
                api::CheckInput::Event(&ev, neighbouring(req)?),
                Some(delta),
                budget,
                &accountants,
            )?
        }
    };
    report_json(&rep)
}

/// An accountant's answer as JSON: the record's own shape (the same keys as a report's
/// `results`; ∞ as `"inf"`).
fn result_json(r: &Evidence) -> Res<Value> {
    serde_json::to_value(r).map_err(|e| Error::input(format!("result could not be serialised: {e}")))
}

fn op_calibrate(req: &Map<String, Value>) -> Res<Value> {
    let solve_for = match required(str_of(req, "solve_for")?, "solve_for")? {
        "noise_multiplier" => SolveFor::NoiseMultiplier,
        "sample_rate" => SolveFor::SampleRate,
        "steps" => SolveFor::Steps,
        s => {
            return Err(Error::field(
                "solve_for",
                format!("must be `noise_multiplier`, `sample_rate` or `steps`, got `{s}`"),
            ))
        }
    };
    let given = |key: &str, unknown: bool| -> Res<Option<f64>> {
        let v = f64_of(req, key)?;
        if unknown && v.is_some() {
            return Err(Error::field(key, "is what calibrate solves for: leave it out"));
        }
        Ok(v)
    };
    let sigma = given("noise_multiplier", solve_for == SolveFor::NoiseMultiplier)?;
    let q = given("sample_rate", solve_for == SolveFor::SampleRate)?;
    let steps = u64_of(req, "steps")?;
    if solve_for == SolveFor::Steps && steps.is_some() {
        return Err(Error::field("steps", "is what calibrate solves for: leave it out"));
    }
    let check_sigma = |s: f64| {
        if s.is_finite() && s > 0.0 {
            Ok(s)
        } else {
            Err(Error::field(
                "noise_multiplier",
                format!("must be a finite number > 0, got {s}"),
            ))
        }
    };
    let fixed = DpSgd {
        noise_multiplier: match sigma {
            Some(s) => check_sigma(s)?,
            None if solve_for == SolveFor::NoiseMultiplier => 1.0,
            None => return Err(Error::field("noise_multiplier", "required")),
        },
        sample_rate: match q {
            Some(q) if q > 0.0 && q <= 1.0 => q,
            Some(q) => {
                return Err(Error::field(
                    "sample_rate",
                    format!("sampling rate must be in (0, 1], got {q}"),
                ))
            }
            None if solve_for == SolveFor::SampleRate => 1.0,
            None => 1.0,
        },
        steps: match steps {
            Some(n) => n,
            None if solve_for == SolveFor::Steps => 1,
            None => return Err(Error::field("steps", "required")),
        },
    };
    let primary = match str_of(req, "accountant")? {
        None => AccountantKind::Pld,
        Some(s) => s.parse().map_err(|e: Error| Error::field("accountant", e.message))?,
    };
    let rep = api::calibrate(
        primary,
        neighbouring(req)?,
        required(f64_of(req, "delta")?, "delta")?,
        required(f64_of(req, "target_epsilon")?, "target_epsilon")?,
        fixed,
        solve_for,
    )?;
    // Everything from the CLI's report: the answer, the accountant's result at it, the event,
    // the evaluations and the warnings (a CLT estimate, a fallback accountant).
    let result = rep
        .results
        .first()
        .ok_or_else(|| Error::input("calibrate's report holds no result"))?;
    let event = rep
        .event
        .as_ref()
        .ok_or_else(|| Error::input("calibrate's report holds no event"))?;
    let key = match solve_for {
        SolveFor::NoiseMultiplier => "noise_multiplier",
        SolveFor::SampleRate => "sample_rate",
        SolveFor::Steps => "steps",
    };
    let value = rep.answers.get(key).copied().unwrap_or(f64::NAN);
    let evaluations: u64 = rep
        .summary
        .iter()
        .find(|f| f.name == "accountant evaluations")
        .and_then(|f| f.value.parse().ok())
        .unwrap_or(0);
    let note = rep
        .warnings
        .iter()
        .find(|w| w.code == "calibration_fallback_accountant")
        .map(|w| w.message.clone());
    Ok(json!({
        "solve_for": key,
        "value": num(value),
        "result": result_json(result)?,
        "event": event_json(event)?,
        "evaluations": evaluations,
        "note": note,
        "warnings": rep.warnings,
        "report": report_json(&rep)?,
    }))
}

fn op_analyze(req: &Map<String, Value>) -> Res<Value> {
    let mut tmp: Option<tempfile::NamedTempFile> = None;
    let (mut cfg, path) = match (str_of(req, "path")?, get(req, "config")) {
        (Some(p), None) => (dpaudit::diffusion::SamplerConfig::load(p)?, p.to_string()),
        (None, Some(v)) => {
            // The report records (and hashes) its input file: the dict's TOML text, written to
            // a temporary file that lives as long as the analysis. Relative paths in the dict
            // resolve against the current directory.
            let text = as_toml(v, "the sampler configuration")?;
            let cfg = api::sampler_from_toml(&text).map_err(no_line)?;
            let mut f = tempfile::Builder::new()
                .prefix("dpaudit-config-")
                .suffix(".toml")
                .tempfile()
                .map_err(|e| Error::input(format!("cannot write a temporary file: {e}")))?;
            std::io::Write::write_all(&mut f, text.as_bytes())
                .map_err(|e| Error::input(format!("cannot write a temporary file: {e}")))?;
            let path = f.path().display().to_string();
            tmp = Some(f);
            (cfg, path)
        }
        _ => return Err(Error::field("config", "give a sampler configuration path or dict")),
    };
    if let Some(d) = f64_of(req, "delta")? {
        dpaudit::accountants::check_delta(d)?;
        cfg.delta = d;
    }
    let (a, rep) = api::analyze(&cfg, Path::new(&path), &accountants(req)?)?;
    drop(tmp);
    Ok(json!({
        "analysis": serde_json::to_value(&a).map_err(|e| Error::input(e.to_string()))?,
        "report": report_json(&rep)?,
    }))
}

/// `white_box_audit`: {observations: [..] (steps × m, row-major, units of C), included: [bool],
/// noise_multiplier, sample_rate, steps, delta, confidence?}.
fn op_white_box_audit(req: &Map<String, Value>) -> Res<Value> {
    let obs: Vec<f32> = match get(req, "observations") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| Error::field(format!("observations[{i}]"), format!("must be a number, got {v}")))
            })
            .collect::<Res<_>>()?,
        _ => return Err(Error::field("observations", "required: a list of numbers")),
    };
    let included: Vec<bool> = match get(req, "included") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_bool()
                    .ok_or_else(|| Error::field(format!("included[{i}]"), format!("must be true or false, got {v}")))
            })
            .collect::<Res<_>>()?,
        _ => return Err(Error::field("included", "required: a list of booleans")),
    };
    let mech = dpaudit::attacks::white_box::LedgerMechanism {
        noise_multiplier: required(f64_of(req, "noise_multiplier")?, "noise_multiplier")?,
        sample_rate: required(f64_of(req, "sample_rate")?, "sample_rate")?,
        steps: required(u64_of(req, "steps")?, "steps")?,
    };
    if !(mech.noise_multiplier > 0.0 && mech.noise_multiplier.is_finite()) {
        return Err(Error::field("noise_multiplier", "must be a finite number > 0"));
    }
    if !(mech.sample_rate > 0.0 && mech.sample_rate <= 1.0) {
        return Err(Error::field("sample_rate", "must be in (0, 1]"));
    }
    let delta = required(f64_of(req, "delta")?, "delta")?;
    let confidence = f64_of(req, "confidence")?.unwrap_or(0.95);
    let v = api::white_box_audit(&obs, &included, mech, delta, confidence)?;
    let mut out = serde_json::to_value(&v).map_err(|e| Error::input(e.to_string()))?;
    // The Python API's words for the audit verdict's status.
    out["verdict"] = json!(match v.status {
        dpaudit::accountants::sound::Verdict::Violated => "violated",
        dpaudit::accountants::sound::Verdict::Holds => "consistent",
        dpaudit::accountants::sound::Verdict::NotDemonstrated | dpaudit::accountants::sound::Verdict::Unanswered => {
            "no_guarantee"
        }
    });
    Ok(out)
}

/// Runs one request (`op` and its JSON arguments) and returns the JSON answer.
fn dispatch(op: &str, request: &str) -> Res<String> {
    let v: Value = serde_json::from_str(request).map_err(|e| Error::input(format!("request is not JSON: {e}")))?;
    let req = v
        .as_object()
        .ok_or_else(|| Error::input("request must be a JSON object"))?;
    // A report records the call, not the Python process's whole command line.
    let command = format!("python: dpaudit.{}", if op.len() <= 64 { op } else { "call" });
    let out = dpaudit::report::with_command(&command, || dispatch_op(op, req))?;
    serde_json::to_string(&out).map_err(|e| Error::input(format!("answer could not be serialised: {e}")))
}

fn dispatch_op(op: &str, req: &Map<String, Value>) -> Res<Value> {
    Ok(match op {
        "from_value" => op_from_value(req)?,
        "load" => op_load(req)?,
        "validate" => op_validate(req)?,
        "account" => op_account(req)?,
        "check" => op_check(req)?,
        "calibrate" => op_calibrate(req)?,
        "analyze" => op_analyze(req)?,
        "white_box_audit" => op_white_box_audit(req)?,
        _ => return Err(Error::input(format!("unknown operation `{op}`"))),
    })
}

/// `call(op, request)`: the GIL is released while dpaudit computes.
fn call(args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    if kwargs.is_some_and(|k| !k.is_empty()) || args.len() != 2 {
        return Err(PyValueError::new_err("call(op, request) takes two positional strings"));
    }
    let op: String = args.get_item(0)?.extract()?;
    let request: String = args.get_item(1)?.extract()?;
    let py = args.py();
    py.detach(|| dispatch(&op, &request)).map_err(|e| to_py(&e))
}

fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let f = PyCFunction::new_closure(
        m.py(),
        Some(c"call"),
        Some(c"call(op, request_json) -> answer_json: one dpaudit operation (see dpaudit/_native.pyi)."),
        call,
    )?;
    m.add("call", f)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// The module definition CPython reads once, at import.
struct ModuleDef(std::cell::UnsafeCell<pyo3::ffi::PyModuleDef>);
// SAFETY: CPython reads and writes the definition only at import, under the GIL.
#[allow(unsafe_code)]
unsafe impl Sync for ModuleDef {}

static MODULE_DEF: ModuleDef = ModuleDef(std::cell::UnsafeCell::new(pyo3::ffi::PyModuleDef {
    m_base: pyo3::ffi::PyModuleDef_HEAD_INIT,
    m_name: c"dpaudit._native".as_ptr(),
    m_doc: c"dpaudit's Rust core (use the `dpaudit` package).".as_ptr(),
    m_size: 0,
    m_methods: std::ptr::null_mut(),
    m_slots: std::ptr::null_mut(),
    m_traverse: None,
    m_clear: None,
    m_free: None,
}));

/// The module's entry point, called by CPython at `import dpaudit._native`.
///
/// # Safety
/// Called by the interpreter with the GIL held, as every `PyInit_*` function.
#[allow(unsafe_code)]
#[no_mangle]
pub unsafe extern "C" fn PyInit__native() -> *mut pyo3::ffi::PyObject {
    // SAFETY: CPython calls PyInit_* with the GIL held; MODULE_DEF lives for the process.
    let py = unsafe { Python::assume_attached() };
    let raw = unsafe { pyo3::ffi::PyModule_Create(MODULE_DEF.0.get()) };
    if raw.is_null() {
        return raw;
    }
    // SAFETY: `raw` is a new, owned module reference.
    let module = unsafe { Bound::from_owned_ptr(py, raw) };
    let result = module.cast::<PyModule>().map_err(PyErr::from).and_then(|m| init(m));
    match result {
        Ok(()) => module.into_ptr(),
        Err(e) => {
            e.restore(py);
            std::ptr::null_mut()
        }
    }
}
