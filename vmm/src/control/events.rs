//! Event lines the server sends unasked, shaped like QMP's:
//! `{"event": NAME, "data": {...}, "timestamp": {"seconds": s, "microseconds": us}}`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::sampler::Shared;

/// One event line, newline included.
pub fn line(event: &Value) -> Vec<u8> {
    let mut bytes = event.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

/// An event object stamped with the wall-clock time, as QMP does.
pub fn event(name: &str, data: Value) -> Value {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    json!({"event": name, "data": data, "timestamp": {"seconds": now.as_secs(), "microseconds": now.subsec_micros()}})
}

/// `SAMPLE` events for the sampler's points after `since`, and the newest
/// sequence number they cover. Points already dropped from the ring are
/// reported as one `SAMPLES_DROPPED` event first.
pub fn samples_after(samples: &Shared, since: u64) -> (Vec<Vec<u8>>, u64) {
    let (points, dropped) = samples.since(since);
    let mut lines = Vec::with_capacity(points.len() + 1);
    if dropped > 0 {
        lines.push(line(&event("SAMPLES_DROPPED", json!({"count": dropped}))));
    }
    let last = points.last().map_or(since, |p| p.seq);
    lines.extend(
        points
            .iter()
            .map(|p| line(&event("SAMPLE", p.to_json(&samples.header)))),
    );
    (lines, last)
}
