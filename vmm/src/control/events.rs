//! Event lines the server sends unasked, shaped like QMP's:
//! `{"event": NAME, "data": {...}, "timestamp": {"seconds": s, "microseconds": us}}`.

use serde_json::json;

use crate::protocol::{Event, Message};
use crate::sampler::Shared;

/// `SAMPLE` events for the sampler's points after `since`, and the newest
/// sequence number they cover. Points already dropped from the ring are
/// reported as one `SAMPLES_DROPPED` event first.
pub(crate) fn samples_after(samples: &Shared, since: u64) -> (Vec<Vec<u8>>, u64) {
    let (points, dropped) = samples.since(since);
    let mut lines = Vec::with_capacity(points.len() + 1);
    let line = |name: &str, data| Message::Event(Event::new(name, data)).to_line();
    if dropped > 0 {
        lines.push(line("SAMPLES_DROPPED", json!({"count": dropped})));
    }
    let last = points.last().map_or(since, |p| p.seq);
    lines.extend(
        points
            .iter()
            .map(|p| line("SAMPLE", p.to_json(&samples.header))),
    );
    (lines, last)
}
